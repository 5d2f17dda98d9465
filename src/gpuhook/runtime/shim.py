"""``gpuhook-runtime``: the OCI runtime shim (a thin shell around :mod:`gpuhook.pipeline.flow`).

argv-compatible with runc. On ``create`` and ``run`` it rewrites ``<bundle>/config.json`` from
the container's trusted GPU requests, then execs the real runtime with the untouched argv; every
other subcommand is exec'ed straight through. It never writes to stdout. Its own failures go to
stderr as one line and into runc's ``--log`` file in runc's format, where docker and containerd
pick them up.

The hot path: a spec without any GPU marker bytes is passed through after a byte scan, with no
JSON parse and no import beyond :mod:`os` and gpuhook's own small modules.
"""

from __future__ import annotations

import os
import sys

from gpuhook import __version__
from gpuhook.errors import GpuhookError, RuntimeNotFoundError, SpecError, describe
from gpuhook.runtime import runc_argv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config import Config
    from gpuhook.fsutil import FileLock
    from gpuhook.model.decision import Request
    from gpuhook.pipeline.flow import Outcome
    from gpuhook.runtime.runc_argv import RuntimeArgs

PROG = "gpuhook-runtime"


def main(argv: list[str]) -> int:
    args = runc_argv.parse(argv[1:])
    if args.is_create:
        return _create(argv, args)
    config = _config_or_none()
    runtime = _runtime(config)
    if args.version:
        sys.stdout.write(f"{PROG} {__version__} (gpuhook), wrapping {runtime or 'no runtime'}\n")
        sys.stdout.flush()
    if not runtime:
        return _fail(args, RuntimeNotFoundError("no low-level OCI runtime (runc or crun) found"))
    return _exec(runtime, argv, args)


def _config_or_none() -> Config | None:
    from gpuhook import config as config_mod
    from gpuhook.errors import ConfigError

    try:
        return config_mod.load()
    except ConfigError:
        return None


def _runtime(config: Config | None) -> str:
    if config is not None:
        return config.runtime
    from gpuhook.config import resolve_runtime

    return resolve_runtime("")


def _exec(runtime: str, argv: list[str], args: RuntimeArgs) -> int:
    """Replace this process with the runtime; returns (an exit code) only if that fails."""
    try:
        os.execv(runtime, [runtime, *argv[1:]])
    except OSError as exc:
        return _fail(args, RuntimeNotFoundError(f"cannot execute {runtime}: {exc.strerror}"))


def _create(argv: list[str], args: RuntimeArgs) -> int:
    from gpuhook import markers
    from gpuhook.runtime import fastpath, ocispec

    bundle = os.path.abspath(args.bundle or ".")
    try:
        raw = ocispec.read_raw(bundle)
    except SpecError as exc:
        return _fail(args, exc)

    if not markers.may_request_gpu(raw):
        identity = fastpath.identity_before_load()
        config = _config_or_none()
        runtime = _runtime(config)
        if config is not None:
            _configure_log(config)
            _record_and_log(config, args, bundle, None, fastpath.NOTE)
            # The next container without GPU markers takes gpuhook.runtime.fastpath (no os, no
            # config).
            fastpath.remember(identity, config)
        if not runtime:
            return _fail(args, RuntimeNotFoundError("no low-level OCI runtime found"))
        return _exec(runtime, argv, args)

    return _create_full(argv, args, bundle, raw)


def _create_full(argv: list[str], args: RuntimeArgs, bundle: str, raw: bytes) -> int:
    from gpuhook import config as config_mod
    from gpuhook import log
    from gpuhook.pipeline import request
    from gpuhook.runtime import decide, ocispec

    try:
        spec = ocispec.parse(raw, bundle)
    except SpecError as exc:
        return _fail(args, exc)
    try:
        req = request.parse(spec)
    except SpecError as exc:
        return _fail(args, exc)
    has_request = bool(req.channels)
    config: Config | None
    try:
        config = config_mod.load()
    except GpuhookError as exc:
        if has_request:
            return _fail(args, exc)
        config = None  # not a GPU container: never blocked by gpuhook's own faults
    if config is None or not has_request:
        if config is not None:
            _configure_log(config)
            _record_and_log(config, args, bundle, req, "")
        runtime = _runtime(config)
        if not runtime:
            return _fail(args, RuntimeNotFoundError("no low-level OCI runtime found"))
        return _exec(runtime, argv, args)

    _configure_log(config)
    logger = log.get_logger(container_id=args.container_id, bundle=bundle)
    usage = _MpsUsage(config, args.container_id)
    try:
        try:
            outcome = decide.run(spec, config, bundle=bundle, mps_usage_source=usage)
            if outcome.changed:
                ocispec.write(bundle, outcome.spec)
        except GpuhookError as exc:
            logger.error("create failed", error=str(exc))
            return _fail(args, exc)
        except Exception as exc:  # a bug: fail closed for a GPU request, with one line
            logger.error("internal error", error=repr(exc))
            return _fail(args, exc)
        failure = _record(config, args, bundle, outcome)
    finally:
        usage.release()  # after the record: the next MPS create counts this container
    decision = outcome.decision
    logger.info(
        "decision",
        gpu_container=decision.gpu_container,
        channel=decision.channel,
        devices=[d.display_id for d in decision.devices],
        refused=decision.refused,
        reasons=[r.to_dict() for r in decision.reasons],
        kubernetes=outcome.request.kubernetes.to_dict() if outcome.request.kubernetes else None,
        spec_changed=outcome.changed,
        mps=outcome.mps.to_dict() if outcome.mps is not None else None,
    )
    if failure:
        logger.warning("record not written", error=failure)
    try:
        runtime = config.require_runtime()
    except GpuhookError as exc:
        return _fail(args, exc)
    return _exec(runtime, argv, args)


class _MpsUsage:
    """The pinned memory limits of the live MPS containers, read under a lock that is held until
    this container's record is written, so that two creates cannot both take the last share.
    Only an MPS create under ``mps.oversubscription: reject`` ever calls it."""

    def __init__(self, config: Config, container_id: str) -> None:
        self.config = config
        self.container_id = container_id
        self.lock: FileLock | None = None

    def __call__(self) -> dict[str, tuple[int, int]]:
        from gpuhook.errors import MpsError
        from gpuhook.fsutil import FileLock
        from gpuhook.records import writer

        if self.lock is None:
            lock = FileLock(os.path.join(self.config.state_dir, "mps-usage.lock"), timeout=30.0)
            try:
                lock.__enter__()
            except TimeoutError:
                raise MpsError(
                    f"timed out waiting for the MPS accounting lock {lock.path}"
                ) from None
            except OSError as exc:
                raise MpsError(f"cannot lock {lock.path}: {exc.strerror}") from None
            self.lock = lock
        return writer.mps_usage(self.config, self.container_id)

    def release(self) -> None:
        lock = self.lock
        if lock is not None:
            self.lock = None
            lock.__exit__(None, None, None)


def _configure_log(config: Config) -> None:
    from gpuhook import log

    log.configure(config.log_level, config.log_file)


def _record(
    config: Config, args: RuntimeArgs, bundle: str, outcome: Outcome | None, **kw: Any
) -> str:
    """Write the decision record; "" on success, else the one-line failure (never raises: a
    record must never block a container)."""
    from gpuhook.records import writer

    try:
        record = writer.build(
            args.container_id,
            bundle,
            outcome,
            runtime=config.runtime,
            root=args.root,
            config=config.source,
            **kw,
        )
        return writer.write(config, args.container_id, bundle, record)
    except Exception as exc:
        return f"record failed: {exc!r}"


def _record_and_log(
    config: Config, args: RuntimeArgs, bundle: str, req: Request | None, note: str
) -> None:
    """A container that asked for no GPU: its record and a debug ``decision`` event shaped as
    the GPU path's, plus a warning when the record could not be written."""
    from gpuhook import log
    from gpuhook.records import writer

    failure = _record(config, args, bundle, None, note=note, request=req)
    logger = log.get_logger(container_id=args.container_id, bundle=bundle)
    if log.debug_enabled():
        why = note or writer.NO_REQUEST
        logger.debug(
            "decision",
            gpu_container=False,
            channel=None,
            devices=[],
            refused=False,
            reasons=[{"channel": "-", "value": "", "verdict": "ignored", "why": why}],
            kubernetes=req.kubernetes.to_dict() if req is not None and req.kubernetes else None,
            spec_changed=False,
        )
    if failure:
        logger.warning("record not written", error=failure)


def _fail(args: RuntimeArgs, exc: BaseException) -> int:
    """Report one line on stderr and in runc's --log file; return the exit code."""
    code, message = describe(exc)
    line = f"gpuhook: {message}"
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:
        pass
    if args.log_path:
        _runtime_log(args.log_path, args.log_format, line)
    return code


def _runtime_log(path: str, log_format: str, message: str) -> None:
    """Append an error in runc's own log format (logrus JSON or text)."""
    from gpuhook import _fastjson
    from gpuhook.log import timestamp

    ts = timestamp()
    if log_format == "json":
        line = _fastjson.dumps({"level": "error", "msg": message, "time": ts})
    else:
        line = f"time={_fastjson.dumps(ts)} level=error msg={_fastjson.dumps(message)}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def console_main() -> None:
    """Entry point of the pip-installed ``gpuhook-runtime`` script (the .deb installs a faster
    POSIX sh dispatcher that execs runc for non-create calls without starting Python)."""
    raise SystemExit(main(sys.argv))


if __name__ == "__main__":
    console_main()

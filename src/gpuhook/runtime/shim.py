"""``gpuhook-runtime``: the OCI runtime shim (a thin shell around :mod:`gpuhook.pipeline.flow`).

argv-compatible with runc. On ``create`` and ``run`` it rewrites ``<bundle>/config.json`` from
the container's trusted GPU requests, then execs the real runtime with the untouched argv; every
other subcommand is exec'ed straight through. It never writes to stdout. Its own failures go to
stderr as one line and into runc's ``--log`` file in runc's format, where docker and containerd
pick them up.

The installed dispatcher passes a create whose spec holds no GPU marker straight to the
runtime without Python; the shim does the same when the dispatcher hands it such a create
(an unusual case: no trusted cache, the debug switch), after a byte scan, with no JSON parse.
``exec`` of a container whose grant carries environment gets it in its process file
(:mod:`gpuhook.records.execenv`); ``delete`` removes that marker.

Where the runtime is exec'ed is a seam: :func:`main` takes an ``execute`` callable that replaces
:func:`os.execv` (the runtime service, :mod:`gpuhook.runtime.service`, runs the shim in a forked
child and hands the runtime's path back to the dispatcher, whose process execs it).
"""

from __future__ import annotations

import os
import sys

from gpuhook import __version__
from gpuhook.errors import GpuhookError, RuntimeNotFoundError, SpecError, UsageError, describe
from gpuhook.runtime import runc_argv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

    from gpuhook.config.types import Config
    from gpuhook.model.decision import Request
    from gpuhook.pipeline.flow import Outcome
    from gpuhook.runtime.runc_argv import RuntimeArgs

    # execv's shape: (path, argv) -> never returns; raises OSError as execv does when it cannot
    Execute = Callable[[str, list[str]], NoReturn]

PROG = "gpuhook-runtime"
NOTE = "no GPU marker in config.json (the spec was not parsed)"


def main(argv: list[str], execute: Execute | None = None, caller: int = 0) -> int:
    """Run one call (``argv[0]`` is not used); returns an exit code when it does not exec the
    runtime. ``execute`` replaces :func:`os.execv` for the runtime's exec; ``caller``: the pid
    of the process that will run the runtime (this one when 0). ``gpuhook-runtime hook VERB``
    runs that OCI hook of gpuhook's (:mod:`gpuhook.runtime.hooks`)."""
    if argv[1:2] == [runc_argv.HOOK]:
        from gpuhook.runtime import hooks

        return hooks.main(argv[2:])
    args = runc_argv.parse(argv[1:])
    how = runc_argv.route(args, argv[1:])
    if how == runc_argv.CREATE:
        return _create(argv, args, execute, caller or os.getpid())
    if how == runc_argv.REFUSE:
        return _fail(args, UsageError(_unplaced(args)))
    config = _config_or_none()
    runtime, missing = _runtime(config)
    if args.version:
        sys.stdout.write(f"{PROG} {__version__} (gpuhook), wrapping {runtime or 'no runtime'}\n")
        sys.stdout.flush()
    if missing is not None:
        return _fail(args, missing)
    if config is not None and how == runc_argv.EXEC:
        failure = _exec_env(config, args, argv[1:])
        if failure is not None:
            return _fail(args, failure)
    if config is not None and how == runc_argv.DELETE:
        return _delete(config, runtime, argv, args, execute)
    return _exec(runtime, argv, args, execute)


def _unplaced(args: RuntimeArgs) -> str:
    return (
        f"cannot read the runtime's arguments: {args.unknown!r} is not a flag of "
        f"{args.command or 'the runtime'} that gpuhook-runtime knows, so it cannot tell which "
        "container the call is for; refusing (gpuhook-runtime never passes a create, or an exec "
        "of a GPU container, that it cannot read)"
    )


def _exec_env(config: Config, args: RuntimeArgs, argv: list[str]) -> GpuhookError | None:
    """Add the container's granted environment to an exec's process file (see
    :mod:`gpuhook.records.execenv`); an error when an exec of a marked container cannot get it."""
    from gpuhook.records import execenv

    try:
        if args.unknown:  # the id cannot be placed: refuse when a marked container may be meant
            marked = [a for a in argv if execenv.load(config.state_dir, a)]
            return UsageError(_unplaced(args)) if marked else None
        marker = execenv.load(config.state_dir, args.container_id)
        if marker is not None and args.process and marker.get("root", "") == args.root:
            execenv.apply(args.process, marker)
    except GpuhookError as exc:
        return exc
    return None


def _delete(
    config: Config, runtime: str, argv: list[str], args: RuntimeArgs, execute: Execute | None
) -> int:
    """Run the runtime's delete; when it succeeds, remove the container's exec-env marker (a
    container without one: exec the runtime, as the dispatcher does)."""
    from gpuhook.records import execenv

    marker = execenv.marker_path(config.state_dir, args.container_id)
    if not marker or not os.path.lexists(marker):
        return _exec(runtime, argv, args, execute)
    try:
        pid = os.posix_spawn(runtime, [runtime, *argv[1:]], os.environ)
    except OSError as exc:
        return _fail(args, RuntimeNotFoundError(f"cannot execute {runtime}: {exc.strerror}"))
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code < 0:
        return 128 - code  # killed by a signal: the shell's code, as the dispatcher reports it
    if code == 0:
        execenv.forget(config.state_dir, args.container_id)
    return code


def _config_or_none() -> Config | None:
    from gpuhook.config import loading as config_loading
    from gpuhook.errors import ConfigError

    try:
        return config_loading.load()
    except ConfigError:
        return None


def _runtime(config: Config | None) -> tuple[str, GpuhookError | None]:
    """The low-level runtime to exec, or why there is none."""
    from gpuhook.runtime import locate

    if config is not None:
        try:
            return locate.require_runtime(config), None
        except GpuhookError as exc:
            return "", exc
    runtime = locate.resolve_runtime("")
    if not runtime:
        return "", RuntimeNotFoundError("no low-level OCI runtime (runc or crun) found")
    return runtime, None


def _exec(runtime: str, argv: list[str], args: RuntimeArgs, execute: Execute | None) -> int:
    """Replace this process with the runtime (or hand it to ``execute``); returns (an exit code)
    only if that fails."""
    run = os.execv if execute is None else execute
    try:
        run(runtime, [runtime, *argv[1:]])
    except OSError as exc:
        return _fail(args, RuntimeNotFoundError(f"cannot execute {runtime}: {exc.strerror}"))


def _exec_configured(
    config: Config | None, argv: list[str], args: RuntimeArgs, execute: Execute | None
) -> int:
    runtime, missing = _runtime(config)
    if missing is not None:
        return _fail(args, missing)
    return _exec(runtime, argv, args, execute)


def _create(argv: list[str], args: RuntimeArgs, execute: Execute | None, caller: int) -> int:
    """A spec without any GPU marker is passed through with no record (as the dispatcher
    does); anything else gets the full decision."""
    from gpuhook import markers
    from gpuhook.runtime import ocispec

    bundle = os.path.abspath(args.bundle or ".")
    try:
        raw = ocispec.read_raw(bundle)
    except SpecError as exc:
        return _fail(args, exc)
    if markers.may_request_gpu(raw):
        return _create_full(argv, args, bundle, raw, execute, caller)
    config = _config_or_none()
    if config is not None:
        _forget_exec_env(config, args)
        _configure_log(config)
        _log_no_request(args, bundle, None, NOTE)
    return _exec_configured(config, argv, args, execute)


def _forget_exec_env(config: Config, args: RuntimeArgs) -> None:
    """A new container with the id of an earlier one: the earlier one's marker is not its own."""
    from gpuhook.records import execenv

    execenv.forget(config.state_dir, args.container_id)


def _create_full(
    argv: list[str],
    args: RuntimeArgs,
    bundle: str,
    raw: bytes,
    execute: Execute | None,
    caller: int,
) -> int:
    from gpuhook.config import loading as config_loading
    from gpuhook.config.types import KUBELET_DIR_DEFAULT
    from gpuhook.pipeline import engine, request
    from gpuhook.runtime import ocispec

    config: Config | None = None
    failure: GpuhookError | None = None  # gpuhook's own fault: fatal for a GPU request only
    try:
        config = config_loading.load()
    except GpuhookError as exc:
        failure = exc
    kubelet_dir = config.policy.kubelet_dir if config else KUBELET_DIR_DEFAULT
    try:
        spec = ocispec.parse(raw, bundle)
        if config is not None:
            req = request.parse(spec, kubelet_dir, config.policy.cdi_kinds)
        else:
            req = request.parse(spec, kubelet_dir)
    except SpecError as exc:
        return _fail(args, exc)
    if failure is not None and (req.channels or engine.needs_allocation(req)):
        return _fail(args, failure)  # a request, or engine GPUs to verify: fatal
    if config is not None:
        _forget_exec_env(config, args)
        _configure_log(config)
    if config is None or not (req.channels or req.engine_devices):
        if config is not None:
            _log_no_request(args, bundle, req, "")
            unwritten = _record(config, args, bundle, req)
            if unwritten:
                _logger(args, bundle).warning("record not written", error=unwritten)
        return _exec_configured(config, argv, args, execute)
    return _decide(argv, args, bundle, spec, config, req, execute, caller)


def _logger(args: RuntimeArgs, bundle: str) -> Any:
    from gpuhook import log

    return log.get_logger(container_id=args.container_id, bundle=bundle)


def _decide(
    argv: list[str],
    args: RuntimeArgs,
    bundle: str,
    spec: dict[str, Any],
    config: Config,
    req: Request,
    execute: Execute | None,
    caller: int,
) -> int:
    """A GPU request: decide, rewrite the spec, write the record and the exec-env marker."""
    from gpuhook.records import execenv
    from gpuhook.runtime import decide, ocispec

    logger = _logger(args, bundle)
    env_before = (spec.get("process") or {}).get("env")
    ledger = _ledger(config, args.container_id)
    admit = ledger or decide.read_only_admission(config)  # MPS off: never called
    try:
        try:
            outcome = decide.run(spec, config, bundle=bundle, mps_admit=admit, parsed=req)
            if outcome.changed:
                ocispec.write(bundle, outcome.spec)
        except GpuhookError as exc:
            logger.error("create failed", error=str(exc))
            return _fail(args, exc)
        except Exception as exc:  # a bug: fail closed for a GPU request, with one line
            logger.error("internal error", error=repr(exc))
            return _fail(args, exc)
        failure = _record(config, args, bundle, outcome, caller)
    finally:
        if ledger is not None:
            ledger.release()  # after the record: the next MPS create counts this container
    env_after = (outcome.spec.get("process") or {}).get("env")
    marker_failure = execenv.remember(
        config.state_dir, args.container_id, args.root, env_before, env_after
    )
    _log_decision(logger, outcome)
    if failure:
        logger.warning("record not written", error=failure)
    if marker_failure:
        logger.warning("exec-env marker not written", error=marker_failure)
    runtime, missing = _runtime(config)
    if missing is not None:
        return _fail(args, missing)
    return _exec(runtime, argv, args, execute)


def _log_decision(logger: Any, outcome: Outcome) -> None:
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


def _ledger(config: Config, container_id: str) -> Any:
    """MPS admission under the accounting lock (:class:`gpuhook.mps.admission.Ledger`), held
    until this container's record is written; None when no GPU is MPS-shared."""
    if not config.mps.enabled:
        return None
    from gpuhook.mps import admission

    return admission.Ledger(config, container_id)


def _configure_log(config: Config) -> None:
    from gpuhook import log

    log.configure(config.log_level, config.log_file)


def _record(
    config: Config,
    args: RuntimeArgs,
    bundle: str,
    decided: Outcome | Request,
    caller: int = 0,
) -> str:
    """Write the decision record of an outcome, or of a request for no GPU; "" on success, else
    the one-line failure (never raises: a record must never block a container). An MPS client's
    record names the process that runs the runtime's create (``caller``)."""
    from gpuhook.records import writer

    try:
        creator = None
        if caller and getattr(decided, "mps", None) is not None:
            from gpuhook.mps import admission

            creator = admission.creator(caller)
        record = writer.build(
            args.container_id,
            bundle,
            decided,
            runtime=config.runtime,
            root=args.root,
            config=config.source,
            creator=creator,
        )
        return writer.write(config, args.container_id, bundle, record)
    except Exception as exc:
        return f"record failed: {exc!r}"


def _log_no_request(args: RuntimeArgs, bundle: str, req: Request | None, note: str) -> None:
    """A container that asked for no GPU: a debug ``decision`` event shaped as the GPU path's
    (no record: records are kept for containers whose spec carries a GPU marker)."""
    from gpuhook import log

    if not log.debug_enabled():
        return
    from gpuhook.pipeline import policy

    decision = policy.no_request(note, ignored=req.ignored if req is not None else ())
    _logger(args, bundle).debug(
        "decision",
        gpu_container=decision.gpu_container,
        channel=decision.channel,
        devices=[],
        refused=decision.refused,
        reasons=[r.to_dict() for r in decision.reasons],
        kubernetes=req.kubernetes.to_dict() if req is not None and req.kubernetes else None,
        spec_changed=False,
    )


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
    if log_format == runc_argv.LOG_FORMAT_JSON:
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
    compiled dispatcher that execs runc for non-create calls without starting Python)."""
    raise SystemExit(main(sys.argv))


if __name__ == "__main__":
    console_main()

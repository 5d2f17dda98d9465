"""``gpuhook hook <verb>``: work inside the container's namespaces that spec edits cannot do.

Run by the OCI runtime as a hook, with the explicit minimal environment gpuhook put in the spec,
never the container's. Standard library only: this runs on every GPU container's creation.

``update-ldcache``: add the injected libraries to the container's ``/etc/ld.so.cache`` so they
resolve by soname, first. The host's ldconfig runs on each injected folder alone and its entries
are merged into the image's own cache, which is otherwise kept as it is
(:mod:`gpuhook.runtime.ldmerge`): the cost does not grow with the image's libraries. Where that
cannot be done exactly, the hook runs ``ldconfig -X -r <rootfs> <folders>`` as it always did:
ldconfig chroots into the rootfs before it reads or writes anything, so the image's symlinks
(``/etc``, ``/etc/ld.so.conf.d``, the cache itself) resolve inside the container and can never
reach a host path. Either way ``-X`` leaves the image's library symlinks alone (the injected
sonames are bind mounts already), and the ``--folder`` folders come first, in their order (the
loader takes the first entry of a soname), ahead of the image's own. A rootfs without even
``/etc`` gets one, so that the cache can be written.

Before that it makes the driver's links (``--link LINK=TARGET``: ``libcuda.so -> libcuda.so.1``
in gpuhook's library folder, the GLX indirect and GBM backend links) inside the rootfs, each
folder resolved in the rootfs (:mod:`gpuhook.runtime.imagefs`), so ldconfig lists them. With
``--cuda-compat DRIVER_VERSION:BRANDS`` (the CDI spec's form: it is written before any image is
known) it also decides whether the image's CUDA forward compatibility folder goes first
(:mod:`gpuhook.pipeline.compat`), reading the image the same way.

What ldconfig reads may be the image's (``/etc/ld.so.conf`` and what it includes, an image
folder), so every ldconfig run is bounded: at most ``LDCONFIG_DATA_LIMIT`` of heap (an
``ld.so.conf`` that is a link to ``/dev/zero`` is one endless line), ``LDCONFIG_CPU_S`` of CPU,
and ``--timeout`` seconds of wall time for all of them together (a FIFO blocks its reader
forever), well inside the hook's own timeout in the spec. Past a bound it is killed and the
container starts with the image's own cache, with a warning.

gpuhook-runtime writes the hook with ``--rootfs`` (resolved at create time) as
``gpuhook-runtime hook update-ldcache ...``: the static dispatcher runs that form itself
(``packaging/gpuhook-ldcache.c.in``, the same steps, environment, bounds and messages), so a GPU
container's start pays for no shell and no Python here. It hands this implementation whatever it
does not do itself: any other form, a link folder behind a link of the image, and the record of
a failed ldconfig (``--outcome CODE|timeout`` reports a run that already happened, and runs
nothing).
"""

from __future__ import annotations

import os
import sys

from gpuhook.errors import SpecError, UsageError, describe
from gpuhook.runtime.ldrun import (
    LDCONFIG_TIMEOUT_MAX_S,
    LDCONFIG_TIMEOUT_S,
    run_bounded,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpuhook.log import Logger

# update-ldcache's flags, each with a value. These bounds and flags are rendered into the
# static dispatcher's C hook (gpuhook.runtime.dispatch): one table. Python alone takes
# CUDA_COMPAT_FLAG and OUTCOME_FLAG (the dispatcher hands a hook with them here).
UPDATE_LDCACHE_FLAGS = ("--cache", "--folder", "--ldconfig", "--link", "--rootfs", "--timeout")
CUDA_COMPAT_FLAG = "--cuda-compat"
OUTCOME_FLAG = "--outcome"


class Plan:
    """What update-ldcache does: ``links`` (link, target) first, then the cache of ``rootfs``
    with ``folders`` first, its ldconfig runs within ``timeout`` seconds; ``cuda_compat``: the
    ``--cuda-compat`` value ("" for none); ``caches``: folder -> the host folder holding its
    prepared ldconfig entries (``--cache FOLDER=DIR``: no ldconfig runs for that folder)."""

    def __init__(
        self,
        ldconfig: str,
        rootfs: str,
        folders: list[str],
        timeout: float,
        links: list[tuple[str, str]],
        cuda_compat: str,
        caches: dict[str, str] | None = None,
    ) -> None:
        self.ldconfig = ldconfig
        self.rootfs = rootfs
        self.folders = folders
        self.timeout = timeout
        self.links = links
        self.cuda_compat = cuda_compat
        self.caches = caches or {}

    @property
    def command(self) -> list[str]:
        """The full run: ldconfig rebuilding the whole cache, chrooted into the rootfs."""
        return [self.ldconfig, "-X", "-r", self.rootfs, *self.folders]


def update_ldcache(argv: list[str], stdin: bytes) -> Plan:
    """The plan for the container whose OCI state is ``stdin``."""
    from gpuhook.runtime import ocispec

    values: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in (*UPDATE_LDCACHE_FLAGS, CUDA_COMPAT_FLAG) and i + 1 < len(argv):
            values.setdefault(arg, []).append(argv[i + 1])
            i += 2
            continue
        raise UsageError(f"hook update-ldcache: unexpected argument {arg!r}")
    ldconfig = (values.get("--ldconfig") or ["/sbin/ldconfig"])[-1]
    rootfs = (values.get("--rootfs") or [""])[-1]
    timeout = _seconds(values["--timeout"][-1]) if "--timeout" in values else LDCONFIG_TIMEOUT_S
    folders = values.get("--folder", [])
    links = [_link_arg(a) for a in values.get("--link", [])]
    compat = (values.get(CUDA_COMPAT_FLAG) or [""])[-1]
    caches = dict(_cache_arg(a) for a in values.get("--cache", []))
    if not ldconfig.startswith("/"):
        raise UsageError("hook update-ldcache: --ldconfig must be an absolute path")
    for folder in folders:
        if not folder.startswith("/") or ".." in folder.split("/"):
            raise UsageError(f"hook update-ldcache: invalid --folder {folder!r}")
    if compat and _compat_arg(compat) is None:
        raise UsageError(f"hook update-ldcache: invalid {CUDA_COMPAT_FLAG} {compat!r}")
    if rootfs:
        # gpuhook-runtime resolved it at create time (root.path against the bundle).
        if not rootfs.startswith("/"):
            raise UsageError("hook update-ldcache: --rootfs must be an absolute path")
    else:  # a spec written before --rootfs existed: find the rootfs through the OCI state
        state = ocispec.parse_state(stdin)
        bundle = state["bundle"]
        rootfs = ocispec.rootfs(bundle, ocispec.load(bundle))
    if not os.path.isdir(rootfs):
        raise SpecError(f"container rootfs {rootfs} is not a directory")
    if not os.access(ldconfig, os.X_OK):
        raise UsageError(
            f"hook update-ldcache: ldconfig {ldconfig} is not executable "
            "(hook.ldconfig in the gpuhook config)"
        )
    return Plan(ldconfig, rootfs, folders, timeout, links, compat, caches)


def _cache_arg(text: str) -> tuple[str, str]:
    """``FOLDER=DIR``: two absolute paths without ``..`` (DIR: gpuhook's own, on the host)."""
    folder, eq, where = text.partition("=")
    for path in (folder, where):
        if not eq or not path.startswith("/") or ".." in path.split("/") or "\0" in path:
            raise UsageError(f"hook update-ldcache: invalid --cache {text!r} (FOLDER=DIR)")
    return folder, where


def _link_arg(text: str) -> tuple[str, str]:
    """``LINK=TARGET``: an absolute link path without ``..`` and a relative target."""
    link, eq, target = text.partition("=")
    if (
        not eq
        or not link.startswith("/")
        or ".." in link.split("/")
        or link.endswith("/")
        or not target
        or target.startswith("/")
        or "\0" in text
    ):
        raise UsageError(f"hook update-ldcache: invalid --link {text!r} (LINK=TARGET)")
    return link, target


def _compat_arg(text: str) -> tuple[str, list[int]] | None:
    """``DRIVER_VERSION:BRAND[,BRAND...]`` -> (version, brands); None when malformed."""
    version, _, brands = text.partition(":")
    items = [b for b in brands.split(",") if b]
    if not version or not all(b.isdigit() for b in items):
        return None
    return version, [int(b) for b in items]


def prepare(plan: Plan) -> tuple[list[str], str]:
    """Before ldconfig runs: the links, a missing ``/etc``, and the CUDA forward compatibility
    folder when the hook decides it. Returns (warnings, none of which stops the container; the
    forward compatibility decision, "" when there was none to take)."""
    from gpuhook.runtime import imagefs

    warnings = [f"link {p} not made" for p in imagefs.make_links(plan.rootfs, plan.links)]
    _ensure_etc(plan.rootfs, warnings)
    parsed = _compat_arg(plan.cuda_compat) if plan.cuda_compat else None
    if parsed is None:
        return warnings, ""
    from gpuhook.pipeline import compat
    from gpuhook.runtime.decide import compat_library

    lib = compat_library(plan.rootfs)
    if lib is None:
        return warnings, ""
    choice = compat.choose(lib, parsed[0], parsed[1])
    if choice.folder:
        plan.folders.insert(0, choice.folder)
    return warnings, f"{choice.note.what}: {choice.note.why}"


def _ensure_etc(rootfs: str, warnings: list[str]) -> None:
    """A rootfs without ``/etc`` (a scratch-like image) gets the folder, made in the rootfs
    itself (no link followed: an existing ``/etc`` of any kind is left as it is)."""
    from gpuhook.runtime import imagefs

    try:
        fd = imagefs.open_root(rootfs)
    except OSError as exc:
        warnings.append(f"cannot open {rootfs}: {exc.strerror}")
        return
    try:
        os.mkdir("etc", 0o755, dir_fd=fd)
    except FileExistsError:
        pass
    except OSError as exc:
        warnings.append(f"cannot make {rootfs}/etc: {exc.strerror}")
    finally:
        os.close(fd)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= LDCONFIG_TIMEOUT_MAX_S:
        raise UsageError(
            f"hook update-ldcache: invalid --timeout {text!r} "
            f"(seconds, 0 < t <= {LDCONFIG_TIMEOUT_MAX_S})"
        )
    return value


VERBS: dict[str, Callable[[list[str], bytes], Plan]] = {"update-ldcache": update_ldcache}


def refresh(plan: Plan, logger: Logger | None = None) -> tuple[int | None, str]:
    """Update the container's cache (:mod:`gpuhook.runtime.ldmerge`), else the full run; all
    ldconfig runs within ``plan.timeout``. Returns (0, or the failed full run's exit code, None
    when it ran past its time; how: "merged" or "full")."""
    import time

    deadline = time.monotonic() + plan.timeout
    why = _merged(plan, deadline)
    if not why:
        return 0, "merged"
    if logger is not None:
        logger.debug("ldcache: the full ldconfig run", reason=why)
    return run_bounded(plan.command, deadline - time.monotonic()), "full"


def _merged(plan: Plan, deadline: float) -> str:
    """Merge the injected folders' entries into the image's cache; "" when done, else why not
    (the full run does it then)."""
    import time

    from gpuhook.runtime import imagefs, ldmerge

    try:
        root_fd = imagefs.open_root(plan.rootfs)
    except OSError as exc:
        return f"{plan.rootfs}: {exc.strerror}"
    try:
        image = ldmerge.image_entries(root_fd)
        injected = []
        for folder in plan.folders:
            if folder in plan.caches:  # prepared with the folder: nothing to run
                injected += ldmerge.prepared_entries(plan.caches[folder], folder)
                continue
            try:
                fd = imagefs.open_strict(root_fd, folder)
            except FileNotFoundError:
                continue  # as ldconfig skips a folder that is not there
            try:
                command = ldmerge.folder_command(plan.ldconfig)
                code = run_bounded(command, deadline - time.monotonic(), fd)
                if code != 0:
                    return f"ldconfig on {folder}: " + ("timeout" if code is None else str(code))
                injected += ldmerge.folder_entries(fd, folder)
            finally:
                os.close(fd)
        merged = ldmerge.merge(injected, image)
        if merged:
            ldmerge.write(root_fd, merged)
        return ""
    except ldmerge.Unmergeable as exc:
        return str(exc)
    except OSError as exc:
        return f"{exc.filename or plan.rootfs}: {exc.strerror}"
    finally:
        os.close(root_fd)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in VERBS:
        sys.stderr.write(f"gpuhook hook: unknown verb; known: {', '.join(VERBS)}\n")
        return 2
    import time

    stdin = b""
    logger: Logger | None = None
    try:
        stdin = sys.stdin.buffer.read()
        logger = _logger(argv[0], stdin)
        args, outcome = _outcome(argv[1:])
        plan = VERBS[argv[0]](args, stdin)
        started = time.monotonic()
        os.chdir("/")
        how = "full"
        if outcome == "":  # else the dispatcher made the links and ran ldconfig already
            _prepare(plan, logger)
            code, how = refresh(plan, logger)
        else:
            code = _reported(outcome)
        command, timeout = plan.command, plan.timeout
        elapsed_ms = round((time.monotonic() - started) * 1000, 1)
        if code != 0:
            # The image may lack /etc or ship no ld.so.conf (a scratch image has no dynamic
            # loader to use a cache anyway), or feed ldconfig something endless: warn, do not
            # fail the container.
            what = f"exited with {code}" if code is not None else f"ran past {timeout:g}s"
            sys.stderr.write(
                f"gpuhook hook update-ldcache: {command[0]} {what}; "
                "the container's ld.so.cache was not refreshed\n"
            )
            if logger is not None:
                logger.warning("ldcache not refreshed", command=command, exit_code=code)
        elif logger is not None:
            logger.debug("ldcache refreshed", command=command, how=how, elapsed_ms=elapsed_ms)
        return 0
    except Exception as exc:
        code, message = describe(exc)
        message = message.removeprefix(f"hook {argv[0]}: ")  # said once, in front
        sys.stderr.write(f"gpuhook hook {argv[0]}: {message}\n")
        if logger is not None:
            logger.error("hook failed", error=message)
        return code


def _prepare(plan: Plan, logger: Logger | None) -> None:
    warnings, compat = prepare(plan)
    for warning in warnings:
        sys.stderr.write(f"gpuhook hook update-ldcache: {warning}\n")
        if logger is not None:
            logger.warning("hook preparation incomplete", problem=warning)
    if compat and logger is not None:
        logger.info("cuda forward compatibility", decision=compat)


def _outcome(argv: list[str]) -> tuple[list[str], str]:
    """``argv`` without a trailing ``--outcome VALUE``, and VALUE ("" when absent)."""
    if len(argv) >= 2 and argv[-2] == OUTCOME_FLAG:
        return argv[:-2], argv[-1]
    return argv, ""


def _reported(outcome: str) -> int | None:
    """The exit code the dispatcher's ldconfig run ended with (None: it ran past its time)."""
    if outcome == "timeout":
        return None
    try:
        return int(outcome)
    except ValueError:
        raise UsageError(f"hook update-ldcache: invalid {OUTCOME_FLAG} {outcome!r}") from None


def _logger(verb: str, stdin: bytes) -> Logger | None:
    """The hook's logger, configured from gpuhook's config (GPUHOOK_CONFIG and GPUHOOK_DEBUG
    reach the hook through the env gpuhook-runtime gave it); None when there is no usable
    config. Bound to the container id of the OCI state."""
    from gpuhook import log
    from gpuhook.config import loading as config_loading

    try:
        config = config_loading.load()
    except Exception:
        return None
    log.configure(config.log_level, config.log_file)
    from gpuhook.runtime import ocispec

    try:
        container_id = str(ocispec.parse_state(stdin).get("id", ""))
    except SpecError:
        container_id = ""  # the verb reports the malformed state itself
    return log.get_logger(container_id=container_id, hook=verb)

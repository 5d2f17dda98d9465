"""``gpuhook hook <verb>``: work inside the container's namespaces that spec edits cannot do.

Run by the OCI runtime as a hook, with the explicit minimal environment gpuhook put in the spec,
never the container's. Standard library only: this runs on every GPU container's creation.

``update-ldcache``: refresh the container's ``/etc/ld.so.cache`` so the injected libraries
resolve by soname. It runs the host's ldconfig with ``-r <rootfs>``: ldconfig chroots into the
rootfs before it reads or writes anything, so the image's symlinks (``/etc``, ``/etc/ld.so.conf.d``,
the cache itself) resolve inside the container and can never reach a host path. ``-X`` leaves
the image's own library symlinks alone; the injected sonames are bind mounts already.
"""

from __future__ import annotations

import os
import sys

from gpuhook.errors import SpecError, UsageError, describe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpuhook.log import Logger

SAFE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


def update_ldcache(argv: list[str], stdin: bytes) -> list[str]:
    """The ldconfig command line for the container whose OCI state is ``stdin``."""
    from gpuhook import ocispec

    folders: list[str] = []
    ldconfig = "/sbin/ldconfig"
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--folder", "--ldconfig") and i + 1 < len(argv):
            if arg == "--folder":
                folders.append(argv[i + 1])
            else:
                ldconfig = argv[i + 1]
            i += 2
            continue
        raise UsageError(f"hook update-ldcache: unexpected argument {arg!r}")
    if not ldconfig.startswith("/"):
        raise UsageError("hook update-ldcache: --ldconfig must be an absolute path")
    for folder in folders:
        if not folder.startswith("/") or ".." in folder.split("/"):
            raise UsageError(f"hook update-ldcache: invalid --folder {folder!r}")
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
    return [ldconfig, "-X", "-r", rootfs, *folders]


VERBS: dict[str, Callable[[list[str], bytes], list[str]]] = {"update-ldcache": update_ldcache}


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
        command = VERBS[argv[0]](argv[1:], stdin)
        started = time.monotonic()
        os.chdir("/")
        pid = os.fork()
        if pid == 0:  # pragma: no cover - replaced by exec
            try:
                os.execve(command[0], command, SAFE_ENV)
            finally:
                os._exit(127)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        elapsed_ms = round((time.monotonic() - started) * 1000, 1)
        if code != 0:
            # The image may lack /etc or ship no ld.so.conf (a scratch image has no dynamic
            # loader to use a cache anyway): warn, do not fail the container.
            sys.stderr.write(
                f"gpuhook hook update-ldcache: {command[0]} exited with {code}; "
                "the container's ld.so.cache was not refreshed\n"
            )
            if logger is not None:
                logger.warning("ldcache not refreshed", command=command, exit_code=code)
        elif logger is not None:
            logger.debug("ldcache refreshed", command=command, elapsed_ms=elapsed_ms)
        return 0
    except Exception as exc:
        code, message = describe(exc)
        sys.stderr.write(f"gpuhook hook {argv[0]}: {message}\n")
        if logger is not None:
            logger.error("hook failed", error=message)
        return code


def _logger(verb: str, stdin: bytes) -> Logger | None:
    """The hook's logger, configured from gpuhook's config (GPUHOOK_CONFIG and GPUHOOK_DEBUG
    reach the hook through the env gpuhook-runtime gave it); None when there is no usable
    config. Bound to the container id of the OCI state."""
    from gpuhook import config as config_mod
    from gpuhook import log

    try:
        config = config_mod.load()
    except Exception:
        return None
    log.configure(config.log_level, config.log_file)
    from gpuhook import ocispec

    try:
        container_id = str(ocispec.parse_state(stdin).get("id", ""))
    except SpecError:
        container_id = ""  # the verb reports the malformed state itself
    return log.get_logger(container_id=container_id, hook=verb)

"""``gpuhook hook <verb>``: work inside the container's namespaces that spec edits cannot do.

Run by the OCI runtime as a hook, with the explicit minimal environment gpuhook put in the spec,
never the container's. Standard library only: this runs on every GPU container's creation.

``update-ldcache``: refresh the container's ``/etc/ld.so.cache`` so the injected libraries
resolve by soname. It runs the host's ldconfig with ``-r <rootfs>``: ldconfig chroots into the
rootfs before it reads or writes anything, so the image's symlinks (``/etc``, ``/etc/ld.so.conf.d``,
the cache itself) resolve inside the container and can never reach a host path. ``-X`` leaves
the image's own library symlinks alone; the injected sonames are bind mounts already.

gpuhook-runtime writes the hook with ``--rootfs`` (resolved at create time), a form the installed
``gpuhook`` POSIX sh dispatcher runs itself, with the same environment, bounds and messages, so a
GPU container's start pays for no Python here; this implementation serves every other form.
"""

from __future__ import annotations

import os
import sys

from gpuhook.errors import SpecError, UsageError, describe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

SAFE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


def update_ldcache(argv: list[str], stdin: bytes) -> list[str]:
    """The ldconfig command line for the container whose OCI state is ``stdin``."""
    from gpuhook import ocispec

    folders: list[str] = []
    ldconfig = "/sbin/ldconfig"
    rootfs = ""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--folder", "--ldconfig", "--rootfs") and i + 1 < len(argv):
            if arg == "--folder":
                folders.append(argv[i + 1])
            elif arg == "--rootfs":
                rootfs = argv[i + 1]
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
    return [ldconfig, "-X", "-r", rootfs, *folders]


VERBS: dict[str, Callable[[list[str], bytes], list[str]]] = {"update-ldcache": update_ldcache}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in VERBS:
        sys.stderr.write(f"gpuhook hook: unknown verb; known: {', '.join(VERBS)}\n")
        return 2
    try:
        command = VERBS[argv[0]](argv[1:], sys.stdin.buffer.read())
        os.chdir("/")
        pid = os.fork()
        if pid == 0:  # pragma: no cover - replaced by exec
            try:
                os.execve(command[0], command, SAFE_ENV)
            finally:
                os._exit(127)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            # The image may lack /etc or ship no ld.so.conf (a scratch image has no dynamic
            # loader to use a cache anyway): warn, do not fail the container.
            sys.stderr.write(
                f"gpuhook hook update-ldcache: {command[0]} exited with {code}; "
                "the container's ld.so.cache was not refreshed\n"
            )
        return 0
    except Exception as exc:
        code, message = describe(exc)
        sys.stderr.write(f"gpuhook hook {argv[0]}: {message}\n")
        return code

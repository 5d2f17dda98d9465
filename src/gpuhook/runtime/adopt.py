"""Becoming the caller's process in a runtime service worker: its stdio and working folder (the
descriptors it sent), its umask and environment, the shim's argv (:func:`adopt`), and the shim's
exec turned into the :data:`~gpuhook.runtime.wire.EXEC` reply that has the caller exec the
runtime itself (:func:`executor`).
"""

from __future__ import annotations

import os
import sys

from gpuhook.config import locate
from gpuhook.runtime import pool
from gpuhook.runtime.wire import EXEC, Request, encode_reply

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import NoReturn

    from gpuhook.runtime.shim import Execute

# sys.argv[0] of the shim as the dispatcher starts it (locate.running_program reads it)
SHIM_ENTRY = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), locate.SHIM_ENTRY
)


def adopt(request: Request, fds: list[int], umask: int) -> list[str]:
    """Become the caller's process: its stdio, working folder, umask, environment, a fresh
    process's logging, the shim's argv; return that argv."""
    from gpuhook import log

    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)  # inheritable, as a process's stdio
    for fd in fds[:3]:
        os.close(fd)
    os.fchdir(fds[3])
    os.close(fds[3])
    os.umask(umask)
    os.environ.clear()
    os.environ.update(request.env)
    log.configure("info", "")  # as before the shim's own configure in a new process
    sys.argv = [SHIM_ENTRY, *request.argv[1:]]
    return sys.argv


def executor(conn: socket.socket, argv: list[str]) -> Execute:
    """The shim's exec: reply EXEC with the runtime's path once it is an executable file
    (else the OSError execv would raise, for the shim's own failure line)."""
    import errno
    import stat

    def execute(path: str, runtime_argv: list[str]) -> NoReturn:
        if runtime_argv[1:] != argv[1:]:
            raise RuntimeError("the runtime's arguments differ from the caller's")
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        flush()
        pool.unbind()
        try:
            conn.send(encode_reply(EXEC, os.fsencode(os.path.abspath(path))))
        except OSError:
            os._exit(1)  # the caller is gone: nobody to tell
        pool.finish(0)

    return execute


def flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass

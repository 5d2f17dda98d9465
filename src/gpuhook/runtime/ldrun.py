"""The host's ldconfig, run bounded: an explicit minimal environment, CPU, memory and wall-time
limits (the ldcache hook's runs, and the driver folders prepared at ``inventory refresh``).

The bounds are rendered into the static dispatcher's C hook too (:mod:`gpuhook.runtime.dispatch`).
Stdlib only: the hook's hot path imports it.
"""

from __future__ import annotations

import os

SAFE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
LDCONFIG_TIMEOUT_S = 15.0  # wall time; the hook's own timeout in the spec is 30 s
LDCONFIG_CPU_S = 10
LDCONFIG_DATA_LIMIT = 256 << 20  # RLIMIT_DATA: heap; read-only maps of big libraries do not count
LDCONFIG_TIMEOUT_MAX_S = 3600


def run_bounded(command: list[str], timeout: float, cwd_fd: int | None = None) -> int | None:
    """Run ``command`` with the explicit SAFE_ENV, cwd ``/`` (or the folder ``cwd_fd``), and the
    resource limits above.

    Returns its exit code (negative: killed by that signal), or None when it outlived ``timeout``
    and was killed.
    """
    pid = os.fork()
    if pid == 0:  # pragma: no cover - replaced by exec
        try:
            import resource

            if cwd_fd is None:
                os.chdir("/")
            else:
                os.fchdir(cwd_fd)
            resource.setrlimit(resource.RLIMIT_DATA, (LDCONFIG_DATA_LIMIT, LDCONFIG_DATA_LIMIT))
            resource.setrlimit(resource.RLIMIT_CPU, (LDCONFIG_CPU_S, LDCONFIG_CPU_S))
            os.execve(command[0], command, SAFE_ENV)
        finally:
            os._exit(127)
    if not _wait_until(pid, timeout):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        return None
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _wait_until(pid: int, timeout: float) -> bool:
    """Whether child ``pid`` exited within ``timeout`` seconds (it is not reaped)."""
    import select

    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # kernel before 5.3: poll
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            time.sleep(0.01)
        return False
    try:
        ready, _, _ = select.select([pidfd], [], [], max(timeout, 0.0))
        return bool(ready)
    finally:
        os.close(pidfd)

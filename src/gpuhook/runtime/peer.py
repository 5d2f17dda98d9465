"""Whom the runtime service serves (SECURITY.md class G): a request decoded whole with exactly
the descriptors the protocol names, from a caller that could have started the shim itself in
the same view of the system: the service's own user, mount, pid and user namespaces and root
folder, every capability the service has and no confinement it lacks, and the process that
connected (not another that got its pid). Anything else is :class:`~gpuhook.runtime.wire.Declined`
before anything is read or written for the caller, and the dispatcher runs Python in its own
context.
"""

from __future__ import annotations

import os

from gpuhook.runtime.wire import FDS, MAX_REQUEST, Declined, Request, decode_request

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from typing import Any


def admit(
    conn: socket.socket, data: bytes, fds: list[int], flags: int, accepted: float
) -> tuple[Request, int, int]:
    """The request, the caller's umask and its pid, or :class:`Declined`."""
    import socket
    import stat

    if flags & socket.MSG_TRUNC:
        raise Declined(f"request over {MAX_REQUEST} bytes")
    if flags & socket.MSG_CTRUNC or len(fds) != FDS:
        more = " or more" if flags & socket.MSG_CTRUNC else ""
        raise Declined(f"{len(fds)}{more} descriptors passed, not {FDS}")
    request = decode_request(data)
    umask, caller = _caller(conn, accepted)
    if not stat.S_ISDIR(os.fstat(fds[3]).st_mode):
        raise Declined("the fourth descriptor is not a folder")
    return request, umask, caller


def _caller(conn: socket.socket, accepted: float) -> tuple[int, int]:
    """Check the connecting process; return its umask and pid. SO_PEERCRED names it as it connected;
    a process with that pid started after the connection was accepted is another one."""
    import socket
    import struct

    cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
    pid, uid, _gid = struct.unpack("iII", cred)
    if uid != os.geteuid():
        raise Declined(f"the caller runs as uid {uid}, the runtime service as uid {os.geteuid()}")
    if pid <= 0:
        raise Declined("the caller is not in the runtime service's pid namespace")
    started = _start_time(pid)
    if started > accepted:
        raise Declined(f"process {pid} started after it connected (not the caller)")
    ours = own()
    for ns in _NAMESPACES:
        if _identity(f"/proc/{pid}/ns/{ns}") != ours[ns]:
            raise Declined(f"the caller (pid {pid}) is in another {ns} namespace")
    if _identity(f"/proc/{pid}/root") != ours["root"]:
        raise Declined(f"the caller (pid {pid}) has another root folder")
    umask = _confinement(pid)
    if _start_time(pid) != started:
        raise Declined(f"the caller (pid {pid}) exited during the checks")
    return umask, pid


_NAMESPACES = ("mnt", "pid", "user")
_OWN: dict[str, Any] = {}


def own() -> dict[str, Any]:
    """The service's own namespaces, root folder and /proc status, fixed for its life: read once
    (by :func:`gpuhook.runtime.service.serve` before it forks workers, so no call pays for them)."""
    if not _OWN:
        _OWN.update({ns: _identity(f"/proc/self/ns/{ns}") for ns in _NAMESPACES})
        _OWN.update(root=_identity("/"), status=_status("self"))
    return _OWN


def _identity(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise Declined(f"cannot read {path}: {exc.strerror}") from None
    return st.st_dev, st.st_ino


def _start_time(pid: int) -> float:
    """When process ``pid`` started, in seconds of CLOCK_BOOTTIME."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat_line = fh.read()
        ticks = int(stat_line.rpartition(b")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        raise Declined(f"cannot read the start time of the caller (pid {pid})") from None
    return ticks / os.sysconf("SC_CLK_TCK")


def _status(pid: int | str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        raise Declined(f"cannot read /proc/{pid}/status: {exc.strerror}") from None
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def _confinement(pid: int) -> int:
    """The caller has every capability of the service and no confinement the service lacks
    (the service must not do for it what it could not do itself); return its umask."""
    theirs, ours = _status(pid), own()["status"]
    try:
        missing = int(ours["CapEff"], 16) & ~int(theirs["CapEff"], 16)
        umask = int(theirs["Umask"], 8)
    except (KeyError, ValueError):
        raise Declined(
            f"cannot read the capabilities and umask of the caller (pid {pid})"
        ) from None
    if missing:
        raise Declined(f"the caller (pid {pid}) lacks capabilities of the service ({missing:#x})")
    for key, what in (("NoNewPrivs", "no_new_privs"), ("Seccomp", "a seccomp filter")):
        if theirs.get(key, "0") != "0" and ours.get(key, "0") == "0":
            raise Declined(f"the caller (pid {pid}) runs under {what}, the service does not")
    return umask

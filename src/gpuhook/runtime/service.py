"""The runtime service: a resident gpuhook that decides GPU creates for ``gpuhook-runtime``.

Wire protocol (one ``SOCK_SEQPACKET`` message each way; the dispatcher's side is rendered from
these constants by :mod:`gpuhook.runtime.dispatch`):

request
    ``PROTOCOL NUL``, ``<argc> NUL``, argc NUL-terminated argv strings (argv[0] included),
    ``<envc> NUL``, envc NUL-terminated ``KEY=VALUE`` strings; with ``SCM_RIGHTS`` carrying
    exactly four descriptors: the caller's stdin, stdout, stderr and its working folder (opened
    ``O_PATH | O_DIRECTORY``). At most :data:`MAX_REQUEST` bytes.
reply
    :data:`EXEC` + the runtime's path: the dispatcher execs it with its own argv[1:];
    :data:`EXIT` + a decimal exit code: the dispatcher exits with it (the one-line error is
    already on its stderr); :data:`DECLINE` + a reason: the dispatcher starts Python itself.
    At most :data:`MAX_REPLY` bytes (a reason is cut to fit).

The service (:func:`serve`, ``gpuhook runtime serve``) listens on a socket only its user may
connect to (mode 0600) and imports everything the shim's create path imports before it accepts,
so a request costs no interpreter start, no import and no wait for a ``fork``: :data:`POOL`
forked workers wait in ``accept``, each serves one connection in its own process and exits, and
the parent forks the next as soon as one is taken. The worker declines (and the dispatcher runs
Python in its own context, as without the service) any request it cannot take whole: a malformed
message, a wrong number of descriptors, or a caller that is not the service's own user in the
service's own mount, pid and user namespaces with the same root folder, the capabilities the
service has and no confinement (``no_new_privs``, seccomp) the service lacks (the caller is the
process SO_PEERCRED names, checked in /proc; one that started after the connection was accepted
is another process that got its pid). Otherwise the child takes the caller's stdio, working
folder, environment and umask and runs :func:`gpuhook.runtime.shim.main` as the process would
(``sys.argv[0]`` is the shim's entry script, logging starts unconfigured), with one difference:
where the shim would exec the runtime, the child checks that it is an executable file and
replies :data:`EXEC`; the caller's process execs it, so the runtime's parent is the engine's
shim and the runtime runs with the caller's cgroup, limits and credentials, as without the
service (the shim's own work runs in the service's). A failure the shim reports (one line on the
caller's stderr and in runc's ``--log``) is replied as :data:`EXIT`; an unexpected one gets one
line of its own and exit code 1. A connection closed before any request (``gpuhook doctor``'s
probe) is not answered.
"""

from __future__ import annotations

import os
import sys

from gpuhook.runtime import locate

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn

    from gpuhook.runtime.shim import Execute

PROTOCOL = b"gpuhook-runtime/1"
EXEC = b"X"
EXIT = b"R"
DECLINE = b"F"
MAX_REQUEST = 1 << 20
FDS = 4
MAX_REPLY = 1 + 4096  # the kind and a path of PATH_MAX bytes
POOL = 4  # forked workers waiting for a call (each serves one; the parent forks the next)

# What the service imports before it forks, so that a request imports nothing (but pynvml for a
# lazy inventory refresh, and yaml and jsonschema to compile a config edited since its cache was
# written): every module of the packages the shim may import (gpuhook.runtime's "May import" set,
# which tests/unit/test_layout.py enforces), gpuhook's top-level modules but the entry scripts,
# and the standard library modules the shim imports inside functions.
# tests/integration/test_runtime_service.py checks it against what the shim imports as a process.
PRELOAD_PACKAGES = (
    "gpuhook.config",
    "gpuhook.runtime",
    "gpuhook.pipeline",
    "gpuhook.records",
    "gpuhook.mps",
    "gpuhook.inventory",
    "gpuhook.model",
)
# Top-level modules that run as scripts (never imported ahead of time).
ENTRY_SCRIPTS = frozenset({"__main__", *(n.removesuffix(".py") for n in locate.ENTRY_SCRIPTS)})
PRELOAD_STDLIB = ("subprocess",)
# sys.argv[0] of the shim as the dispatcher starts it (locate.running_program reads it)
SHIM_ENTRY = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), locate.SHIM_ENTRY
)


class Declined(Exception):
    """A request the service leaves to the dispatcher; ``str()`` is the reason it is sent."""


class Request:
    """A decoded request: the caller's argv (argv[0] included) and environment (the first of a
    repeated name wins, as for a process)."""

    __slots__ = ("argv", "env")

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.env = env


# --- the wire format (pure) ------------------------------------------------------------------


def encode_request(argv: Sequence[str | bytes], env: Sequence[str | bytes]) -> bytes:
    """The request message for ``argv`` and ``env`` (``KEY=VALUE`` strings)."""
    fields = [
        PROTOCOL,
        str(len(argv)).encode(),
        *(os.fsencode(a) for a in argv),
        str(len(env)).encode(),
        *(os.fsencode(e) for e in env),
    ]
    if any(b"\0" in field for field in fields):
        raise ValueError("a request field holds a NUL byte")
    return b"".join(field + b"\0" for field in fields)


def decode_request(data: bytes) -> Request:
    """Parse a request message; raises :class:`Declined` with the reason when it is malformed."""
    if len(data) > MAX_REQUEST:
        raise Declined(f"request of {len(data)} bytes (at most {MAX_REQUEST})")
    if not data.startswith(PROTOCOL + b"\0"):
        raise Declined(f"not a {PROTOCOL.decode()} request")
    if not data.endswith(b"\0"):
        raise Declined("the request does not end with a NUL byte")
    fields = data[:-1].split(b"\0")
    argv, pos = _strings(fields, 1, "argv")
    if not argv:
        raise Declined("argc is 0: argv[0] is missing")
    entries, pos = _strings(fields, pos, "environment")
    if pos != len(fields):
        raise Declined(f"{len(fields) - pos} fields after the environment")
    env: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise Declined(f"environment entry {entry[:40]!r} is not KEY=VALUE")
        env.setdefault(key, value)
    return Request(argv, env)


def _strings(fields: list[bytes], pos: int, what: str) -> tuple[list[str], int]:
    """The count at ``fields[pos]`` and that many strings after it; the position after them."""
    if pos >= len(fields):
        raise Declined(f"the {what} count is missing")
    field = fields[pos]
    if not field.isdigit() or len(field) > 7 or (len(field) > 1 and field.startswith(b"0")):
        raise Declined(f"the {what} count {field[:20]!r} is not a decimal number")
    count = int(field)
    end = pos + 1 + count
    if end > len(fields):
        raise Declined(f"the {what} count is {count} but {len(fields) - pos - 1} fields follow")
    return [os.fsdecode(f) for f in fields[pos + 1 : end]], end


def encode_reply(kind: bytes, payload: bytes) -> bytes:
    """A reply message; a :data:`DECLINE` reason is cut to :data:`MAX_REPLY`."""
    if kind not in (EXEC, EXIT, DECLINE):
        raise ValueError(f"unknown reply kind {kind!r}")
    reply = kind + payload
    if kind == DECLINE:
        return reply[:MAX_REPLY]
    if len(reply) > MAX_REPLY or b"\0" in payload:
        raise ValueError(f"reply {reply[:40]!r} is too long or holds a NUL byte")
    return reply


def decode_reply(data: bytes) -> tuple[bytes, bytes]:
    """``(kind, payload)`` of a reply (what the dispatcher reads); ValueError when malformed."""
    kind, payload = data[:1], data[1:]
    if len(data) > MAX_REPLY:
        raise ValueError(f"reply of {len(data)} bytes (at most {MAX_REPLY})")
    if kind == EXEC and payload.startswith(b"/") and b"\0" not in payload:
        return kind, payload
    if kind == EXIT and payload.isdigit() and len(payload) <= 3 and int(payload) <= 255:
        return kind, payload
    if kind == DECLINE:
        return kind, payload
    raise ValueError(f"malformed reply {data[:40]!r}")


def probe(path: str) -> str:
    """Whether a service listens on ``path``: "" when a connection is accepted, else why not
    (the connection is closed unused; the service does not answer it)."""
    error = _connect_error(path)
    if error is None:
        return ""
    if isinstance(error, FileNotFoundError):
        return f"no socket at {path}"
    if isinstance(error, ConnectionRefusedError):
        return f"{path} refuses connections (a socket left by a service that is gone)"
    return f"cannot connect to {path}: {error.strerror or error}"


def _connect_error(path: str) -> OSError | None:
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.settimeout(5)
    try:
        sock.connect(path)
    except OSError as exc:
        return exc
    finally:
        sock.close()
    return None


# --- serving -----------------------------------------------------------------------------------


class _Stop(BaseException):
    """SIGTERM or SIGINT in the service: leave the accept loop (not an Exception: nothing may
    catch it on the way)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def serve(socket_path: str, announce: Callable[[str], None]) -> int:
    """Listen on ``socket_path`` and serve until SIGTERM or SIGINT; returns that signal's
    number, after closing and removing the socket. ``announce`` is called with one line once
    the service accepts. Raises :class:`gpuhook.errors.ServiceError` when it cannot listen.

    Where the process has not imported structlog (``gpuhook runtime serve`` does not), the shim
    logs through the same writer as in its own process (:mod:`gpuhook.log`)."""
    import gc
    import signal
    import socket

    def stop(signum: int, _frame: object) -> None:
        raise _Stop(signum)

    _ensure_stdio()
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
    previous = {sig: signal.getsignal(sig) for sig in handled}
    held = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)  # until the socket is there to remove
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        listener, identity = listen(socket_path)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        preload()
        _own()
        gc.collect()
        gc.freeze()  # the children share these pages instead of copying them on collection
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
        announce(f"gpuhook runtime service: listening on {socket_path} (pid {os.getpid()})")
        _flush()  # nothing buffered may reach a child
        _accept(listener)
    except _Stop as stopped:
        return stopped.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _remove_socket(socket_path, identity)
        try:
            listener.shutdown(socket.SHUT_RDWR)  # the idle workers' accept ends: they exit
        except OSError:
            pass
        listener.close()


def listen(path: str) -> tuple[socket.socket, tuple[int, int]]:
    """A listening socket at ``path`` (mode 0600, its folder made 0755 when missing; a socket
    left by a service that is gone is replaced) and its (device, inode)."""
    import socket

    from gpuhook.errors import ServiceError

    try:
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        _clear_stale(path)
    except OSError as exc:
        raise ServiceError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)  # born 0600: no moment where another user may connect
    try:
        sock.bind(path)
        os.chmod(path, 0o600)
        st = os.lstat(path)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ServiceError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old)
    return sock, (st.st_dev, st.st_ino)


def _clear_stale(path: str) -> None:
    """Remove a socket at ``path`` that nothing listens on; refuse anything else there."""
    import stat

    from gpuhook.errors import ServiceError

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ServiceError(f"{path} exists and is not a socket; remove it or choose another path")
    error = _connect_error(path)
    if error is None:
        raise ServiceError(f"another runtime service is listening on {path}")
    if not isinstance(error, ConnectionRefusedError):
        raise ServiceError(probe(path))
    os.unlink(path)


def _remove_socket(path: str, identity: tuple[int, int]) -> None:
    """Unlink the socket, unless it is no longer ours (a new service bound the path)."""
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == identity:
            os.unlink(path)
    except OSError:
        pass


def _ensure_stdio() -> None:
    """fds 0-2 open (on /dev/null when closed), so no received descriptor lands there."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def preload() -> list[str]:
    """Import what the shim may import lazily (see :data:`PRELOAD_PACKAGES`); the modules, in
    order."""
    import importlib
    import pkgutil

    import gpuhook

    names = [*PRELOAD_STDLIB]
    names += [
        f"gpuhook.{m.name}"
        for m in pkgutil.iter_modules(gpuhook.__path__)
        if not m.ispkg and m.name not in ENTRY_SCRIPTS
    ]
    for package in PRELOAD_PACKAGES:
        path = importlib.import_module(package).__path__
        names += [m.name for m in pkgutil.iter_modules(path, package + ".") if not m.ispkg]
    for name in names:
        importlib.import_module(name)
    return names


def _accept(listener: socket.socket) -> NoReturn:
    """Keep :data:`POOL` forked workers waiting in ``accept``, so that a call finds its process
    already forked. Each worker serves one connection and exits; as soon as it has one it writes
    its pid to a pipe, and the parent forks the next. Workers that died idle are replaced."""
    import select
    import struct

    ready_fd, told_fd = os.pipe()
    idle: set[int] = set()
    while True:
        while len(idle) < POOL:
            pid = _spawn(listener, ready_fd, told_fd)
            if not pid:
                break
            idle.add(pid)
        if select.select([ready_fd], [], [], 5.0)[0]:
            data = os.read(ready_fd, 4096)  # whole 4-byte records: each write is atomic
            idle.difference_update(pid for (pid,) in struct.iter_unpack("i", data))
        else:
            idle = {pid for pid in idle if _alive(pid)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def _spawn(listener: socket.socket, ready_fd: int, told_fd: int) -> int:
    """Fork one worker; its pid (0 when the fork failed: logged, retried a little later).
    SIGTERM and SIGINT wait until the worker has its own handlers."""
    import signal
    import time

    from gpuhook import log

    held = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        pid = os.fork()
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        log.get_logger().warning("runtime service cannot fork", error=str(exc))
        time.sleep(0.1)
        return 0
    if pid == 0:
        os.close(ready_fd)
        _worker(listener, told_fd)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    return pid


def _worker(listener: socket.socket, told_fd: int) -> NoReturn:
    """Wait for one connection (the parent shutting the listener down ends an idle worker),
    tell the parent, serve it."""
    import signal
    import struct
    import time

    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # idle: nothing to finish
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        conn, _ = listener.accept()
        accepted = time.clock_gettime(time.CLOCK_BOOTTIME)
        os.write(told_fd, struct.pack("i", os.getpid()))
        os.close(told_fd)
    except BaseException:  # the listener is gone: the service is stopping
        os._exit(0)
    _child(listener, conn, accepted)


def _child(listener: socket.socket, conn: socket.socket, accepted: float) -> NoReturn:
    import signal

    try:
        listener.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the shim may wait for subprocesses
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        _handle(conn, accepted)
    except BaseException:  # noqa: S110 - the dispatcher sees the connection close unanswered
        pass
    finally:
        os._exit(0)


# --- one request, in its child ------------------------------------------------------------------


def _handle(conn: socket.socket, accepted: float) -> None:
    import socket

    data, fds, flags, _ = socket.recv_fds(conn, MAX_REQUEST, FDS, socket.MSG_CMSG_CLOEXEC)
    if not data and not fds:
        return  # closed before any request: a probe
    try:
        request, umask, caller = _admit(conn, data, fds, flags, accepted)
    except Exception as exc:  # nothing done yet: the dispatcher runs Python itself
        for fd in fds:
            os.close(fd)
        reason = str(exc) if isinstance(exc, Declined) else f"the service failed: {exc!r}"
        _decline(conn, reason)
        return
    _run(conn, request, fds, umask, caller)


def _admit(
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
    umask, caller = _peer(conn, accepted)
    if not stat.S_ISDIR(os.fstat(fds[3]).st_mode):
        raise Declined("the fourth descriptor is not a folder")
    return request, umask, caller


def _peer(conn: socket.socket, accepted: float) -> tuple[int, int]:
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
    own = _own()
    for ns in _NAMESPACES:
        if _identity(f"/proc/{pid}/ns/{ns}") != own[ns]:
            raise Declined(f"the caller (pid {pid}) is in another {ns} namespace")
    if _identity(f"/proc/{pid}/root") != own["root"]:
        raise Declined(f"the caller (pid {pid}) has another root folder")
    umask = _confinement(pid)
    if _start_time(pid) != started:
        raise Declined(f"the caller (pid {pid}) exited during the checks")
    return umask, pid


_NAMESPACES = ("mnt", "pid", "user")
_OWN: dict[str, Any] = {}


def _own() -> dict[str, Any]:
    """The service's own namespaces, root folder and /proc status, fixed for its life: read once
    (by :func:`serve` before it forks workers, so no call pays for them)."""
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
    theirs, ours = _status(pid), _own()["status"]
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


def _run(conn: socket.socket, request: Request, fds: list[int], umask: int, caller: int) -> None:
    """Run the shim in the caller's context (``caller``: its pid, which runs the runtime);
    reply EXEC (from the executor) or EXIT."""
    try:
        argv = _adopt(request, fds, umask)
    except Exception as exc:  # nothing of the shim ran: the dispatcher may run Python itself
        _decline(conn, f"cannot take the caller's context: {exc}")
        return
    from gpuhook.runtime import shim

    try:
        code = shim.main(argv, _executor(conn, argv), caller)
    except BaseException as exc:
        code = _internal_error(exc)
    _flush()
    _send(conn, EXIT, str(code & 0xFF).encode())


def _adopt(request: Request, fds: list[int], umask: int) -> list[str]:
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


def _executor(conn: socket.socket, argv: list[str]) -> Execute:
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
        _flush()
        try:
            conn.send(encode_reply(EXEC, os.fsencode(os.path.abspath(path))))
        except OSError:
            os._exit(1)  # the caller is gone: nobody to tell
        os._exit(0)

    return execute


def _internal_error(exc: BaseException) -> int:
    """One line on the caller's stderr for a failure the shim did not report; the exit code."""
    from gpuhook import log
    from gpuhook.errors import ServiceError, describe

    text = " ".join(str(exc).split())
    error = ServiceError(f"internal error in the runtime service: {type(exc).__name__}: {text}")
    code, message = describe(error)
    log.get_logger().error("runtime service internal error", error=repr(exc))
    try:
        sys.stderr.write(f"gpuhook: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return code


def _decline(conn: socket.socket, reason: str) -> None:
    from gpuhook import log

    log.get_logger().info("runtime service declined", reason=reason)
    _send(conn, DECLINE, reason.encode("utf-8", "replace"))


def _send(conn: socket.socket, kind: bytes, payload: bytes) -> None:
    try:
        conn.send(encode_reply(kind, payload))
    except OSError:
        pass  # the caller is gone


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass

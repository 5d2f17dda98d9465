"""The runtime service: a resident gpuhook that decides GPU creates for ``gpuhook-runtime``.

The service (:func:`serve`, ``gpuhook runtime serve``) listens on a socket only its user may
connect to (mode 0600) and imports everything the shim's create path imports before it accepts,
so a request costs no interpreter start, no import and no wait for a ``fork``: forked workers
wait in ``accept`` (:mod:`gpuhook.runtime.pool`). One message each way, in the protocol the C
dispatcher shares (:mod:`gpuhook.runtime.wire`). The worker declines (and the dispatcher runs
Python in its own context, as without the service) any request it cannot take whole, or from a
caller that could not have started the shim itself (:mod:`gpuhook.runtime.peer`, SECURITY.md
class G). Otherwise the child takes the caller's stdio, working folder, environment and umask
(:mod:`gpuhook.runtime.adopt`) and runs :func:`gpuhook.runtime.shim.main` as the process would
(``sys.argv[0]`` is the shim's entry script, logging starts unconfigured), with one difference:
where the shim would exec the runtime, the child checks that it is an executable file and
replies :data:`~gpuhook.runtime.wire.EXEC`; the caller's process execs it, so the runtime's
parent is the engine's shim and the runtime runs with the caller's cgroup, limits and
credentials, as without the service (the shim's own work runs in the service's). A failure the
shim reports (one line on the caller's stderr and in runc's ``--log``) is replied as
:data:`~gpuhook.runtime.wire.EXIT`; an unexpected one gets one line of its own and exit code 1.
A connection closed before any request (``gpuhook doctor``'s probe) is not answered.

``gpuhook runtime serve`` binds the socket in the CLI's process (:func:`start`), then execs the
service's own process (:func:`main`, ``_service_entry.py``) with the listening socket: the
workers are forked from an interpreter that holds what a create needs and nothing of the CLI
(click, yaml, jsonschema and what they load more than doubled the memory each fork copies the
page tables of and each worker's exit unmaps).
"""

from __future__ import annotations

import os
import sys

from gpuhook.config import locate
from gpuhook.runtime import adopt, peer, pool
from gpuhook.runtime.wire import DECLINE, EXIT, FDS, MAX_REQUEST, Declined, Request, encode_reply

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable
    from typing import NoReturn

    from gpuhook.config.types import Config

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


def serve(
    listener: socket.socket,
    socket_path: str,
    identity: tuple[int, int],
    announce: Callable[[str], None],
) -> int:
    """Serve on ``listener`` (bound at ``socket_path`` by :func:`listen`, its (device, inode)
    ``identity``; SIGTERM and SIGINT blocked by the caller) until SIGTERM or SIGINT; return that
    signal's number, after closing and removing the socket. ``announce`` is called with one line
    once the service accepts.

    Where the process has not imported structlog (the service's process does not), the shim logs
    through the same writer as in its own process (:mod:`gpuhook.log`)."""
    import gc
    import signal
    import socket

    from gpuhook.runtime import prefault

    def stop(signum: int, _frame: object) -> None:
        raise _Stop(signum)

    _ensure_stdio()
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
    previous = {sig: signal.getsignal(sig) for sig in handled}
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _held())
        preload()
        peer.own()
        learned = prefault.Learned()  # the pages workers write, learned from them
        gc.collect()
        gc.freeze()  # the children share these pages instead of copying them on collection
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
        announce(f"gpuhook runtime service: listening on {socket_path} (pid {os.getpid()})")
        adopt.flush()  # nothing buffered may reach a child
        pool.run(listener, _handle, learned)
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


def _held() -> set[int]:
    """SIGTERM and SIGINT: blocked while the socket could not be removed on them."""
    import signal

    return {signal.SIGTERM, signal.SIGINT}


# --- the service's own process -------------------------------------------------------------------

ENTRY = os.path.join(  # the file start() execs
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    locate.SERVICE_ENTRY,
)


def start(socket_path: str, config_file: str | None) -> NoReturn:
    """``gpuhook runtime serve``: listen on ``socket_path`` in this process (its failures are
    this process's :class:`~gpuhook.errors.ServiceError`), then exec the service's own process
    (:func:`main`) with the listening socket and the config file the CLI named (None: the
    process's ``GPUHOOK_CONFIG`` or the default, as the CLI resolved it). SIGTERM and SIGINT
    stay blocked across the exec until the service can remove its socket."""
    import signal

    from gpuhook.errors import ServiceError

    signal.pthread_sigmask(signal.SIG_BLOCK, _held())
    try:
        listener, (dev, ino) = listen(socket_path)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _held())
        raise
    fd = listener.fileno()
    argv = [*interpreter(), ENTRY, str(fd), socket_path, f"{dev}:{ino}"]
    try:
        os.set_inheritable(fd, True)
        os.execv(argv[0], [*argv, *([config_file] if config_file else [])])
    except OSError as exc:
        _remove_socket(socket_path, (dev, ino))
        listener.close()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _held())
        raise ServiceError(
            f"cannot start the runtime service's process {argv[0]}: {exc.strerror or exc}"
        ) from None


def interpreter() -> list[str]:
    """The command that started this Python, up to its script: the words of
    ``/proc/self/cmdline`` before ``sys.argv[0]`` (with a dynamic loader and its options, as
    ``gpuhook node install``'s /opt/gpuhook starts python3, and the dispatcher's ``-I -S``); else
    ``sys.executable -I -S``."""
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            words = [os.fsdecode(w) for w in fh.read().split(b"\0")[:-1]]
    except OSError:
        words = []
    if sys.argv and sys.argv[0] in words[1:]:
        return words[: words.index(sys.argv[0], 1)]
    return [sys.executable, "-I", "-S"]


def main(args: list[str]) -> int:
    """The service's process, as :func:`start` execs it (``_service_entry.py FD SOCKET
    DEV:INO [CONFIG]``): serve on the inherited listening socket until SIGTERM or SIGINT, logging
    its start and stop as the CLI configures logging; an exit code (0 when stopped by a signal)."""
    import signal
    import socket

    from gpuhook import __version__, log
    from gpuhook.config import loading
    from gpuhook.errors import describe

    fd, socket_path, identity = int(args[0]), args[1], args[2]
    dev, _, ino = identity.partition(":")
    listener = socket.socket(fileno=fd)
    os.set_inheritable(fd, False)
    try:
        config = loading.load(args[3] if len(args) > 3 else None)
    except Exception as exc:
        _remove_socket(socket_path, (int(dev), int(ino)))
        listener.close()
        code, message = describe(exc)
        sys.stderr.write(f"gpuhook: {message}\n")
        return code
    log.configure(config.log_level, config.log_file)
    logger = log.get_logger(socket=socket_path, pid=os.getpid())

    def announce(line: str) -> None:
        logger.info("runtime service started", version=__version__, config=config.source)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    _sweep_records(config)
    signum = serve(listener, socket_path, (int(dev), int(ino)), announce)
    logger.info("runtime service stopped", signal=signal.Signals(signum).name)
    return 0


def _sweep_records(config: Config) -> None:
    """Sweep the whole records folder once, in a process of its own (detached: the service
    never waits for it), so that a node upgraded with a backlog of dangling links (left by an
    older gpuhook, or by crashes) does not wait for the creates' bounded sweeps
    (:mod:`gpuhook.records.sweep`); MPS admission reads that folder on every create."""
    import time

    from gpuhook.records import sweep

    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        if os.fork() == 0:
            os.setsid()
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the listening socket above all
            sweep.run(config, time.time(), budget=1 << 62)
    finally:
        os._exit(0)


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


# --- one request, in its child ------------------------------------------------------------------


def _handle(conn: socket.socket, accepted: float) -> None:
    import socket

    data, fds, flags, _ = socket.recv_fds(conn, MAX_REQUEST, FDS, socket.MSG_CMSG_CLOEXEC)
    if not data and not fds:
        return  # closed before any request: a probe
    try:
        request, umask, caller = peer.admit(conn, data, fds, flags, accepted)
    except Exception as exc:  # nothing done yet: the dispatcher runs Python itself
        for fd in fds:
            os.close(fd)
        reason = str(exc) if isinstance(exc, Declined) else f"the service failed: {exc!r}"
        _decline(conn, reason)
        return
    _run(conn, request, fds, umask, caller)


def _run(conn: socket.socket, request: Request, fds: list[int], umask: int, caller: int) -> None:
    """Run the shim in the caller's context (``caller``: its pid, which runs the runtime);
    reply EXEC (from the executor) or EXIT."""
    try:
        argv = adopt.adopt(request, fds, umask)
    except Exception as exc:  # nothing of the shim ran: the dispatcher may run Python itself
        _decline(conn, f"cannot take the caller's context: {exc}")
        return
    from gpuhook.runtime import shim

    pool.bind_to_caller(conn)  # a caller killed meanwhile (a kubelet's timeout) ends this worker
    try:
        code = shim.main(argv, adopt.executor(conn, argv), caller)
    except BaseException as exc:
        code = _internal_error(exc)
    adopt.flush()
    _send(conn, EXIT, str(code & 0xFF).encode())


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
    pool.unbind()
    try:
        conn.send(encode_reply(kind, payload))
    except OSError:
        pass  # the caller is gone



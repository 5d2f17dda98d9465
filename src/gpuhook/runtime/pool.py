"""The runtime service's worker pool: :data:`POOL` forked workers wait in ``accept``, so that a
call finds its process already forked; each serves one connection in its own process and exits,
and the parent forks the next once the taken one has replied (:func:`run`). A new worker first
copies the service's pages that earlier workers wrote (:mod:`gpuhook.runtime.prefault`), and a
worker reports those it wrote when it exits (:func:`finish`).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable
    from typing import NoReturn

    from gpuhook.runtime.prefault import Learned

    # serves one accepted connection in its worker: (connection, CLOCK_BOOTTIME of the accept)
    Handler = Callable[[socket.socket, float], None]

POOL = 4  # forked workers waiting for a call (each serves one; the parent forks the next)
# A taken worker is replaced once it has replied: the parent, woken at the accept, forked beside
# the worker deciding a create and held it up (~0.7 ms on a 2-CPU machine). One that has not
# replied within REFILL_S (a slow create, a caller that sends nothing) is replaced then.
REFILL_S = 0.2
PRUNE_S = 5.0  # how often the parent checks that its idle workers are alive
_learned: Learned | None = None  # the pages workers wrote (made by run, inherited by workers)
_replied_fd = -1  # a worker writes its pid here once it has replied (inherited)


def run(listener: socket.socket, handle: Handler, learned: Learned) -> NoReturn:
    """Keep :data:`POOL` forked workers waiting in ``accept``, so that a call finds its process
    already forked. Each worker serves one connection and exits. When it has one it writes its
    pid to the taken pipe, which nobody waits on; once it has replied, to the replied pipe, which
    wakes the parent: it reads the taken pipe then (or every :data:`REFILL_S`) and forks the next.
    Workers that died idle are replaced. ``learned``: the pages workers wrote, made before the
    service's memory was frozen."""
    import select
    import time

    global _learned, _replied_fd
    _learned = learned
    taken_fd, told_fd = os.pipe()
    replied_fd, _replied_fd = os.pipe()
    for fd in (taken_fd, _replied_fd):  # the parent never waits on one, a worker never on the other
        os.set_blocking(fd, False)
    watched = [replied_fd] + ([learned.read_fd] if learned.read_fd >= 0 else [])
    idle: set[int] = set()
    pruned = time.monotonic()
    while True:
        while len(idle) < POOL:
            pid = _spawn(listener, (taken_fd, replied_fd, learned.read_fd), told_fd, handle)
            if not pid:
                break
            idle.add(pid)
        ready = select.select(watched, [], [], REFILL_S)[0]
        if learned.read_fd in ready:
            learned.take()
        if replied_fd in ready:
            os.read(replied_fd, 4096)  # a wakeup: the taken pipe says which workers are gone
        idle.difference_update(_pids(taken_fd))
        if time.monotonic() - pruned >= PRUNE_S:
            idle = {pid for pid in idle if _alive(pid)}
            pruned = time.monotonic()


def _pids(fd: int) -> list[int]:
    """The pids waiting in the (non-blocking) pipe ``fd``: whole 4-byte records (each write of
    one is atomic)."""
    import struct

    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            break
        data += chunk
        if len(chunk) < 4096:
            break
    return [pid for (pid,) in struct.iter_unpack("i", data[: len(data) // 4 * 4])]


def finish(code: int) -> NoReturn:
    """End a worker that has replied (or never will): wake the parent, which forks its
    replacement, report the pages it wrote, exit."""
    import struct

    try:
        os.write(_replied_fd, struct.pack("i", os.getpid()))
    except OSError:
        pass  # the pipe is full: the parent reads the taken pipe within REFILL_S anyway
    if _learned is not None:
        _learned.report()
    os._exit(code)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def _spawn(
    listener: socket.socket, parents: tuple[int, ...], told_fd: int, handle: Handler
) -> int:
    """Fork one worker; its pid (0 when the fork failed: logged, retried a little later).
    SIGTERM and SIGINT wait until the worker has its own handlers."""
    import signal
    import time

    from gpuhook import log

    held = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    if _learned is not None:
        _learned.fork_next()
    try:
        pid = os.fork()
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        log.get_logger().warning("runtime service cannot fork", error=str(exc))
        time.sleep(0.1)
        return 0
    if pid == 0:
        for fd in parents:  # the parent's ends of its pipes
            if fd >= 0:
                os.close(fd)
        _worker(listener, told_fd, handle)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
    return pid


def _worker(listener: socket.socket, told_fd: int, handle: Handler) -> NoReturn:
    """Wait for one connection (the parent shutting the listener down ends an idle worker),
    tell the parent, serve it."""
    import signal
    import struct
    import time

    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # idle: nothing to finish
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        if _learned is not None:
            _learned.copy()  # while no call waits for this worker
        conn, _ = listener.accept()
        accepted = time.clock_gettime(time.CLOCK_BOOTTIME)
        os.write(told_fd, struct.pack("i", os.getpid()))
        os.close(told_fd)
    except BaseException:  # the listener is gone: the service is stopping
        os._exit(0)
    _child(listener, conn, accepted, handle)


def _child(
    listener: socket.socket, conn: socket.socket, accepted: float, handle: Handler
) -> NoReturn:
    import signal

    try:
        listener.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the shim may wait for subprocesses
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        handle(conn, accepted)
    except BaseException:  # noqa: S110 - the dispatcher sees the connection close unanswered
        pass
    finally:
        finish(0)


# --- a worker lives no longer than its caller -----------------------------------------------------

# A call that has not replied by then is ended: the kubelet gives a create two minutes
# (--runtime-request-timeout) and the engine's shim has given up on it long before this.
CALL_LIMIT_S = 180


def bind_to_caller(conn: socket.socket) -> None:
    """End this worker (SIGIO's default action) as soon as its caller is gone, and once
    :data:`CALL_LIMIT_S` pass (SIGALRM's): the caller sends one message and waits, so any event
    on the connection is its end (its process killed, as by a kubelet's timeout). A worker that
    ends leaves nothing held: its locks are descriptors, and the caller gets no answer. Called
    once the request is taken; :func:`unbind` before the reply."""
    import fcntl
    import select
    import signal

    fd = conn.fileno()
    signal.signal(signal.SIGIO, signal.SIG_DFL)
    fcntl.fcntl(fd, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)
    signal.alarm(CALL_LIMIT_S)
    watch = select.poll()
    watch.register(fd, select.POLLIN | select.POLLRDHUP)
    if watch.poll(0):  # gone before the watch was set
        os.kill(os.getpid(), signal.SIGIO)


def unbind() -> None:
    """The reply is being sent: the caller closing the connection after it is no news."""
    import signal

    signal.signal(signal.SIGIO, signal.SIG_IGN)
    signal.alarm(0)

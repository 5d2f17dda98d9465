"""The folders an MPS group shares with its client containers (I/O, the CLI's ``mps start|stop``).

Two folders of a group are written by its tenants (container root, read-write bind mounts), so
each is a filesystem of the group's own, made new at each daemon start (issue 36):

* the pipe folder ``<mps.root>/<group>/pipe``: a tmpfs of ``mps.pipe_size`` bytes and one inode
  per 4 KiB of it (``mode=0755``, ``nosuid,nodev,noexec``). A tenant that fills it fills its
  group's folder, never ``/run`` (where ``mps.root`` lives by default, beside runc's and
  containerd's state) nor another group's;
* with ``mps.shm`` on, the shm folder ``<mps.root>/<group>/shm``: a tmpfs of ``mps.shm_size``
  (``mode=1777``, as ``/dev/shm``), mounted at the container's ``/dev/shm`` and at the control
  daemon's (the daemon runs in a mount namespace of its own where it is ``/dev/shm``, so the MPS
  servers it starts share memory with their clients there): the group's tenants share it, as
  MPS needs; no other group and not the host.

The folder a daemon used is never walked on the next start: its tmpfs is detached (``umount
-l``), and its contents go with the last container that still has it mounted. A folder that is
not a mount (made by an older gpuhook) is renamed away and removed by :func:`remove_tree`:
bounded in entries and open descriptors, iterative (no Python recursion, whatever its depth),
never following a link.
"""

from __future__ import annotations

import errno
import os
import stat

from gpuhook.errors import MpsError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

PIPE = "pipe"
SHM = "shm"
INODE_BYTES = 4096  # the pipe tmpfs gets one inode per 4 KiB of its size
REMOVE_LIMIT = 200_000  # entries removed from one folder an older gpuhook left
_MAX_OPEN = 64  # folders open at once while removing; deeper ones are moved up first
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CLONE_NEWNS = 0x00020000
_MS_BIND = 4096
_MS_REC = 16384
_MS_SLAVE = 1 << 19


def is_mount(path: str) -> bool:
    """Whether ``path`` is a mount point (a link never is)."""
    return not os.path.islink(path) and os.path.ismount(path)


def fresh_tmpfs(path: str, options: str) -> list[str]:
    """A new, empty tmpfs at ``path`` with ``options``: the one there is detached, a folder an
    older gpuhook made is renamed away and removed. Warnings (a leftover it could not remove);
    raises :class:`MpsError` (one line) when the tmpfs cannot be mounted."""
    warnings = clear(path)
    os.mkdir(path, 0o755)
    _run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], f"cannot mount a tmpfs at {path}")
    return warnings


def detach(path: str) -> None:
    """The tmpfs at ``path`` detached (``umount -l``): containers that mounted it keep it."""
    while is_mount(path):
        _run(["umount", "-l", path], f"cannot unmount {path}")


def clear(path: str) -> list[str]:
    """Nothing at ``path`` afterwards: its tmpfs detached, a folder renamed away and removed."""
    detach(path)
    if not os.path.lexists(path):
        return []
    old = f"{path}.old-{os.getpid()}"
    os.rename(path, old)
    if not os.path.isdir(old) or os.path.islink(old):
        os.unlink(old)
        return []
    try:
        remove_tree(old)
    except OSError as exc:
        return [f"left {old}: {exc.strerror or exc}"]
    return []


def not_own(paths: list[str], group: str) -> list[str]:
    """A line for each of a running daemon's folders that is not a filesystem of its own."""
    return [
        f"{path} is not a filesystem of the group's own (the daemon was started by an older "
        f"gpuhook): restart it: gpuhook mps stop {group} && gpuhook mps start {group}"
        for path in paths
        if not is_mount(path)
    ]


def pipe_options(size: str) -> str:
    """tmpfs options of a pipe folder of ``size`` (``mps.pipe_size``, checked by the loader)."""
    from gpuhook.config.units import parse_size

    value = parse_size(size)
    inodes = max(64, value // INODE_BYTES)
    return f"size={value},nr_inodes={inodes},mode=0755,nosuid,nodev,noexec"


def shm_options(size: str) -> str:
    """tmpfs options of a shm folder of ``size`` (``mps.shm_size``: a size or ``N%``)."""
    from gpuhook.config.units import parse_size

    value = size if size.endswith("%") else str(parse_size(size))
    return f"size={value},mode=1777,nosuid,nodev,noexec"


def _run(argv: list[str], what: str) -> None:
    import subprocess

    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MpsError(f"{what}: {exc}") from None
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        raise MpsError(f"{what}: {lines[-1] if lines else f'exit {proc.returncode}'}")


def with_shm(shm: str) -> Callable[[], None]:
    """A ``preexec_fn`` that puts the process in a mount namespace of its own (receiving the
    host's later mounts, sending none) where ``shm`` is mounted at ``/dev/shm``."""

    def enter() -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        unshare, mount = libc.unshare, libc.mount
        unshare.argtypes = [ctypes.c_int]
        mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]

        def check(code: int) -> None:  # one step at a time: never a mount in the host's ns
            if code != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))

        check(unshare(_CLONE_NEWNS))
        check(mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None))
        check(mount(os.fsencode(shm), b"/dev/shm", None, _MS_BIND, None))

    return enter


# --- removing a folder tenants wrote ----------------------------------------------------------


class _Frame:
    """One open folder of the walk: its descriptor, its name in its parent, its entries left."""

    __slots__ = ("fd", "name", "names")

    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        self.name = name
        try:
            self.names = os.listdir(fd)
        except BaseException:
            os.close(fd)
            raise


def remove_tree(path: str, limit: int = REMOVE_LIMIT) -> int:
    """Remove the folder ``path`` and everything in it; the entries removed. Never follows a
    link (every folder is opened ``O_NOFOLLOW`` relative to its parent), holds at most
    :data:`_MAX_OPEN` folders open (a deeper one is first moved up to ``path`` itself: it stays
    inside the tree), no recursion. Raises OSError, ``E2BIG`` past ``limit`` entries."""
    parent = os.open(os.path.dirname(path) or ".", _DIR)
    try:
        stack = [_Frame(os.open(os.path.basename(path), _DIR, dir_fd=parent), "")]
        try:
            removed = _drain(stack, limit)
        finally:
            for frame in stack:
                os.close(frame.fd)
        os.rmdir(os.path.basename(path), dir_fd=parent)
    finally:
        os.close(parent)
    return removed + 1


def _drain(stack: list[_Frame], limit: int) -> int:
    """Empty the folder at the bottom of ``stack`` (its frames closed as they are done)."""
    removed = moved = 0
    while len(stack) > 1 or stack[0].names:
        top = stack[-1]
        if not top.names:
            stack.pop()
            os.close(top.fd)
            try:
                os.rmdir(top.name, dir_fd=stack[-1].fd)
            except OSError as exc:  # written meanwhile: go through it again
                if exc.errno != errno.ENOTEMPTY:
                    raise
                stack.append(_Frame(os.open(top.name, _DIR, dir_fd=stack[-1].fd), top.name))
            removed += 1
            continue
        name = top.names.pop()
        if removed + moved >= limit:
            raise OSError(errno.E2BIG, f"more than {limit} entries")
        try:
            st = os.stat(name, dir_fd=top.fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            _unlink(name, top.fd)
            removed += 1
        elif len(stack) < _MAX_OPEN:
            stack.append(_Frame(os.open(name, _DIR, dir_fd=top.fd), name))
        else:  # too deep to keep open: move it up to the top folder, to be walked from there
            moved += 1
            stack[0].names.append(_move_up(name, top.fd, stack[0].fd, moved))
    return removed


def _move_up(name: str, dir_fd: int, top_fd: int, n: int) -> str:
    """Move the folder ``name`` of ``dir_fd`` into the top folder under a free name."""
    while True:
        up = f".gpuhook-up-{n}"
        try:
            os.rename(name, up, src_dir_fd=dir_fd, dst_dir_fd=top_fd)
            return up
        except OSError as exc:  # a name the tenant took: the next one
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
            n += 1_000_000


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass

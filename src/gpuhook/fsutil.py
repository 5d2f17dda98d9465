"""Atomic file writes and advisory locks, with :mod:`os` alone (imported on the hot path)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType

TMP_MARK = ".gpuhook-tmp-"


def temp_name(path: str) -> str:
    """The temp file name used while ``path`` is being replaced (same folder, hidden)."""
    folder, _, base = path.rpartition("/")
    return f"{folder or '.'}/.{base}{TMP_MARK}{os.getpid()}-{os.urandom(4).hex()}"


def temp_base(name: str) -> str:
    """The base name whose temp file ``name`` is (see :func:`temp_name`); "" for other names."""
    base, mark, _ = name[1:].partition(TMP_MARK)
    return base if name.startswith(".") and mark else ""


def atomic_write(
    path: str,
    data: bytes,
    mode: int | None = None,
    *,
    fsync: bool = True,
    before_replace: object = None,
) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never a part.

    The temp file is created in the same folder (so ``os.replace`` is a rename), written,
    fsync'ed, given ``mode`` (default: the mode of the file it replaces, else 0644) and renamed
    over ``path``. On any failure the temp file is removed and the old file is untouched.
    ``before_replace`` is a callable run between fsync and rename (a seam for fault tests).
    """
    if mode is None:
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fchmod(fd, mode)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if callable(before_replace):
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_symlink(target: str, link: str) -> None:
    """Make or re-point ``link`` to ``target`` atomically (a temp link in the same folder, then
    ``os.replace``); the temp link is removed when the replace fails. Raises OSError."""
    tmp = temp_name(link)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except OSError:
        os.unlink(tmp)
        raise


def remove_stale_temps(path: str) -> int:
    """Remove temp files that an interrupted :func:`atomic_write` of ``path`` left behind.

    Only temp files whose writer process is gone are removed. Returns how many were removed.
    """
    folder, _, base = path.rpartition("/")
    folder = folder or "."
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    prefix = f".{base}{TMP_MARK}"
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix) :].partition("-")[0]
        if pid_text.isdigit() and _alive(int(pid_text)):
            continue
        try:
            os.unlink(f"{folder}/{name}")
            removed += 1
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own earlier, abandoned attempt
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def makedirs(path: str, mode: int = 0o755) -> None:
    os.makedirs(path, mode=mode, exist_ok=True)


class FileLock:
    """An exclusive ``flock`` on a lock file, as a context manager.

    ``timeout`` (seconds) bounds the wait; ``None`` waits forever. Raises ``TimeoutError``.
    """

    def __init__(self, path: str, timeout: float | None = None) -> None:
        self.path = path
        self.timeout = timeout
        self._fd = -1

    def __enter__(self) -> FileLock:
        import fcntl

        folder = self.path.rpartition("/")[0]
        if folder:
            os.makedirs(folder, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            if self.timeout is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                import time

                deadline = time.monotonic() + self.timeout
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise TimeoutError(f"timed out waiting for lock {self.path}") from None
                        time.sleep(0.02)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = -1


def resolve_in_root(root: str, path: str, max_links: int = 40) -> str:
    """Resolve ``path`` as if ``root`` were ``/``: symlinks (absolute or ``..``) never leave root.

    Returns the host path (``root`` + the resolved in-root path). The final component need not
    exist. Raises ``OSError`` (ELOOP) on too many links. This is how gpuhook reads a driver root
    that is not ``/`` (e.g. a driver container's root): its absolute symlinks point inside it.
    """
    import errno
    import stat

    root = os.path.abspath(root)
    prefix = "" if root == "/" else root
    parts = [p for p in path.split("/") if p not in ("", ".")]
    resolved: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = prefix + "/" + "/".join([*resolved, part])
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            resolved.append(part)
            continue
        if not stat.S_ISLNK(st.st_mode):
            resolved.append(part)
            continue
        links += 1
        if links > max_links:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", prefix + path)
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    return (prefix + "/" + "/".join(resolved)) if resolved else (prefix or "/")

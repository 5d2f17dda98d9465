"""Read and write inside a container's rootfs from the host without following the image's links
out of it (CVE-2024-0132 and CVE-2025-23359 came from following them).

Every path is resolved one component at a time from a descriptor of the rootfs: each component is
opened with ``O_NOFOLLOW`` relative to the one before, and a symbolic link is read and resolved
by gpuhook as if the rootfs were ``/`` (an absolute target starts again at the rootfs, ``..``
stops there). The kernel never follows a link of the image, so nothing outside the rootfs is
reached, even if the image swaps a folder for a link meanwhile (the ``O_NOFOLLOW`` open fails).

Used on the container-create path (stdlib only: :mod:`os`, :mod:`stat`): whether the image
ships CUDA forward compatibility libraries (:func:`compat_library`), and by the ldcache hook to
make the driver's links in gpuhook's library folders (:func:`make_links`) and to read and replace
the image's ld.so.cache (:func:`open_strict`, :func:`read_regular`: folders reached without any
link at all, regular files only).
"""

from __future__ import annotations

import errno
import os
import stat

from gpuhook.pipeline.compat import COMPAT_DIR, NOTE_OWNER, NOTE_SECTION, CompatLibrary

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

MAX_LINKS = 40
MAX_COMPAT_ENTRIES = 4096  # NVIDIA's compat folder holds about ten files
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_root(rootfs: str) -> int:
    """A descriptor of the rootfs folder itself (a path the engine chose, not the image)."""
    return os.open(rootfs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_dir(root_fd: int, path: str) -> tuple[int, str]:
    """The folder at ``path`` inside the rootfs ``root_fd``: (an open descriptor, its resolved
    path in the container). Raises OSError (ENOENT, ENOTDIR, ELOOP...)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    stack: list[tuple[int, str]] = [(os.dup(root_fd), "")]
    links = 0
    try:
        while parts:
            part = parts.pop(0)
            fd = stack[-1][0]
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
                target = os.readlink(part, dir_fd=fd)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise OSError(errno.ENOTDIR, "not a directory", path)
            stack.append((os.open(part, _DIR_FLAGS, dir_fd=fd), part))
    except BaseException:
        for fd, _ in stack:
            os.close(fd)
        raise
    for fd, _ in stack[:-1]:
        os.close(fd)
    return stack[-1][0], "/" + "/".join(name for _, name in stack[1:])


def compat_library(rootfs: str) -> CompatLibrary | None:
    """The forward compatibility libcuda the image at ``rootfs`` ships in
    ``/usr/local/cuda/compat``, None when it has none."""
    try:
        root_fd = open_root(rootfs)
    except OSError:
        return None
    try:
        try:
            dir_fd, folder = open_dir(root_fd, COMPAT_DIR)
        except OSError:
            return None
        try:
            return _compat_in(dir_fd, folder)
        finally:
            os.close(dir_fd)
    finally:
        os.close(root_fd)


def _compat_in(dir_fd: int, folder: str) -> CompatLibrary | None:
    try:
        names = _listing(dir_fd)
    except OSError as exc:
        return CompatLibrary(folder, problem=f"{folder} cannot be listed ({exc.strerror})")
    if names is None:
        too_many = f"{folder} holds more than {MAX_COMPAT_ENTRIES} entries"
        return CompatLibrary(folder, problem=too_many)
    if not names:
        return None
    if len(names) > 1:
        return CompatLibrary(folder, problem=f"{folder} holds {len(names)} libcuda versions")
    name = names[0]
    version = name[len("libcuda.so.") :]
    try:
        drivers, brands = _note_of(dir_fd, name)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        return CompatLibrary(folder, name, version, problem=f"{folder}/{name} unreadable: {why}")
    return CompatLibrary(folder, name, version, drivers, brands)


def _listing(dir_fd: int) -> list[str] | None:
    """The versioned libcuda names of the folder, None past :data:`MAX_COMPAT_ENTRIES` entries
    (an image's folder: its listing is bounded too)."""
    names = []
    with os.scandir(dir_fd) as entries:
        for count, entry in enumerate(entries):
            if count >= MAX_COMPAT_ENTRIES:
                return None
            if _versioned_libcuda(entry.name):
                names.append(entry.name)
    return sorted(names)


def _versioned_libcuda(name: str) -> bool:
    """``libcuda.so.<digits>.<digits>[...]``, as the forward compatibility package names it."""
    rest = name[len("libcuda.so.") :] if name.startswith("libcuda.so.") else ""
    parts = rest.split(".")
    return len(parts) >= 2 and all(p.isdigit() for p in parts)


def _note_of(dir_fd: int, name: str) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(drivers, brands) of the library's forward compatibility note; (None, None) without one.
    Only a regular file is opened (never a link, device or FIFO of the image)."""
    from gpuhook.inventory import elf
    from gpuhook.pipeline.compat import note_fields

    before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(before.st_mode):
        raise ValueError("not a regular file")
    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise ValueError("replaced while it was read")
        desc = elf.note_from_file(f, st.st_size, NOTE_SECTION, NOTE_OWNER)
    return note_fields(desc) if desc is not None else (None, None)


def make_links(rootfs: str, links: Iterable[tuple[str, str]]) -> list[str]:
    """Make each ``(link, target)`` (``link`` a container path) inside the rootfs: its folder is
    resolved in the rootfs, the link made there. An existing link with that target is kept.
    Returns one line per link that could not be made."""
    problems: list[str] = []
    root_fd = open_root(rootfs)
    try:
        for link, target in links:
            folder, _, name = link.rpartition("/")
            try:
                dir_fd, _resolved = open_dir(root_fd, folder or "/")
            except OSError as exc:
                problems.append(f"{link}: {folder} {exc.strerror}")
                continue
            try:
                problem = _link(dir_fd, name, target)
            finally:
                os.close(dir_fd)
            if problem:
                problems.append(f"{link}: {problem}")
    finally:
        os.close(root_fd)
    return problems


def _link(dir_fd: int, name: str, target: str) -> str:
    try:
        os.symlink(target, name, dir_fd=dir_fd)
        return ""
    except FileExistsError:
        try:
            current = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            return "exists and is not a link"
        return "" if current == target else f"exists, a link to {current}"
    except OSError as exc:
        return exc.strerror or str(exc)


def open_strict(root_fd: int, path: str) -> int:
    """The folder at ``path`` inside the rootfs ``root_fd``, reached without any symbolic link
    (each component opened with ``O_NOFOLLOW``): the path is exactly that folder of the rootfs.
    Raises OSError: ELOOP or ENOTDIR for a link or a file on the way, ENOENT..."""
    fd = os.dup(root_fd)
    try:
        for part in (p for p in path.split("/") if p not in ("", ".")):
            if part == "..":
                raise OSError(errno.EINVAL, "'..' in a path", path)
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(dir_fd: int, name: str, limit: int) -> bytes | None:
    """The bytes of the regular file ``name`` in the folder ``dir_fd``, None when there is none.
    Only a regular file is opened (never through a link, never a FIFO or a device node of the
    image). Raises OSError, and ValueError for anything else or more than ``limit`` bytes."""
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(before.st_mode):
        raise ValueError(f"{name} is not a regular file")
    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise ValueError(f"{name} was replaced while it was read")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{name} is larger than {limit} bytes")
    return data

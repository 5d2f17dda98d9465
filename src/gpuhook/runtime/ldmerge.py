"""The container's ld.so.cache after the ldcache hook: the image's own entries exactly as they
are, with the injected folders' entries added, first.

Rebuilding the whole cache (``ldconfig -r <rootfs>``) scans every library folder the image's
``ld.so.conf`` names: thousands of libraries in a CUDA or PyTorch image, at every GPU container
start. Instead the hook runs the host's ldconfig on each injected folder alone
(:func:`folder_command`: chrooted into that folder, with no configuration file, so no folder of
the image is scanned; its cache written into the folder as :data:`FOLDER_CACHE` and removed at
once) and merges those entries into the image's own cache (:func:`merge`): for every soname, the
injected entries come before the image's, in the order of the folders, and everything else of
the image's cache is kept in its order. The loader takes the first entry of a soname that fits
(glibc ``dl-cache.c``), so the container resolves what it resolved before, plus the injected
libraries first. An image without a cache gets one with the injected entries only (every other
library still resolves through the loader's default folders, as before).

Whatever this cannot do exactly raises :class:`Unmergeable`, and the hook runs the full
``ldconfig -X -r <rootfs> <folders>`` instead (as gpuhook always did): an image cache that is a
link, not a regular file, without a new-format section in this machine's byte order, unsorted,
with glibc-hwcaps entries (their extension section is not carried over) or keys whose order only
the loader's own arithmetic defines (:func:`gpuhook.inventory.ldcache.plain_key`); a folder
reached through a link; an ldconfig output it cannot read back.

Nothing of the image is followed on the host side: the rootfs is walked with ``O_NOFOLLOW``
(:mod:`gpuhook.runtime.imagefs`), the new cache is written as ``/etc/ld.so.cache~`` in the
image's ``/etc`` and renamed over ``/etc/ld.so.cache`` there. The static dispatcher's C hook
(``packaging/gpuhook-ldcache.c.in``) does the same, byte for byte.
"""

from __future__ import annotations

import itertools
import os

from gpuhook.inventory import ldcache
from gpuhook.runtime import imagefs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpuhook.inventory.ldcache import CacheEntry

CACHE_DIR = "etc"
CACHE_NAME = "ld.so.cache"
CACHE_TEMP = CACHE_NAME + "~"
# ldconfig's output inside an injected folder (it writes NAME~ first, then renames it).
FOLDER_CACHE = ".gpuhook-ld.so.cache"
MAX_CACHE_BYTES = 32 << 20  # the largest image cache read (a real one: a few MiB at most)
FOLDER_FLAGS = ("-X", "-i", "-c", "new", "-r", ".", "-f", "/.", "-C", "/" + FOLDER_CACHE, "/.")


class Unmergeable(Exception):
    """The merge cannot give exactly the cache it promises: the full ldconfig run must."""


def folder_command(ldconfig: str) -> list[str]:
    """ldconfig for the folder that is its working folder: chrooted there (``-r .``), reading
    no configuration (``-f /.``, a folder), scanning only that folder (``/.``), writing its cache
    there in the new format (``-c new``), making no link (``-X``), without the auxiliary cache
    (``-i``). The system folders it always adds do not exist in the folder (or are scanned as
    what they are: part of it). Its entries' values are ``/./<name>``."""
    return [ldconfig, *FOLDER_FLAGS]


def image_entries(root_fd: int) -> list[CacheEntry]:
    """The entries of the image's own ``/etc/ld.so.cache`` ([] when it has none). Raises
    :class:`Unmergeable`."""
    try:
        etc = imagefs.open_strict(root_fd, CACHE_DIR)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise Unmergeable(f"/{CACHE_DIR}: {exc.strerror}") from None
    try:
        data = imagefs.read_regular(etc, CACHE_NAME, MAX_CACHE_BYTES)
    except (OSError, ValueError) as exc:
        raise Unmergeable(f"/{CACHE_DIR}/{CACHE_NAME}: {exc}") from None
    finally:
        os.close(etc)
    if data is None:
        return []
    entries = _entries(data, "the image's cache")
    for before, after in itertools.pairwise(entries):
        if ldcache.libcmp(before.key, after.key) < 0:
            raise Unmergeable(f"the image's cache is not sorted ({before.key}, {after.key})")
    return entries


def folder_entries(dir_fd: int, folder: str) -> list[CacheEntry]:
    """The entries ldconfig wrote into the injected folder ``dir_fd`` (removed here), their
    values made the container paths in ``folder``. Raises :class:`Unmergeable`."""
    try:
        data = imagefs.read_regular(dir_fd, FOLDER_CACHE, MAX_CACHE_BYTES)
    except (OSError, ValueError) as exc:
        raise Unmergeable(f"{folder}/{FOLDER_CACHE}: {exc}") from None
    finally:
        for name in (FOLDER_CACHE, FOLDER_CACHE + "~"):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass
    return _rebased(data, folder)


def prepared_entries(where: str, folder: str) -> list[CacheEntry]:
    """The entries ldconfig wrote for a prepared folder, kept as :data:`FOLDER_CACHE` in the host
    folder ``where`` (gpuhook's own; read, never removed), their values made the container paths
    in ``folder``. Raises :class:`Unmergeable`."""
    try:
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise Unmergeable(f"{where}: {exc.strerror}") from None
    try:
        data = imagefs.read_regular(fd, FOLDER_CACHE, MAX_CACHE_BYTES)
    except (OSError, ValueError) as exc:
        raise Unmergeable(f"{where}/{FOLDER_CACHE}: {exc}") from None
    finally:
        os.close(fd)
    return _rebased(data, folder)


def _rebased(data: bytes | None, folder: str) -> list[CacheEntry]:
    """ldconfig's entries of ``folder`` (its values ``/./NAME``) with container paths."""
    if data is None:
        raise Unmergeable(f"ldconfig wrote no {folder}/{FOLDER_CACHE}")
    base = folder.rstrip("/")
    out = []
    for e in _entries(data, f"ldconfig's cache of {folder}"):
        if not e.value.startswith("/"):
            raise Unmergeable(f"ldconfig's cache of {folder} names {e.value!r}")
        rest = e.value[3:] if e.value.startswith("/./") else e.value[1:]
        out.append(
            ldcache.CacheEntry(e.key, f"{base}/{rest}", e.flags, e.arch, e.hwcap, e.osversion)
        )
    return out


def _entries(data: bytes, what: str) -> list[CacheEntry]:
    try:
        entries = list(ldcache.parse_new(data))
    except ldcache.LdCacheError as exc:
        raise Unmergeable(f"{what}: {exc}") from None
    for e in entries:
        if e.hwcap & ldcache.HWCAP_EXTENSION:
            raise Unmergeable(f"{what} has glibc-hwcaps entries ({e.value})")
        if not ldcache.plain_key(e.key):
            raise Unmergeable(f"{what} has the key {e.key!r}")
    return entries


def merge(injected: Sequence[CacheEntry], image: Sequence[CacheEntry]) -> list[CacheEntry]:
    """``image`` in its order with ``injected`` (the folders' entries, in folder order) placed
    by key, each before the image's entries of its key; an image entry equal to an injected one
    (key, value, flags) is listed once."""
    from functools import cmp_to_key

    def descending(a: CacheEntry, b: CacheEntry) -> int:
        return ldcache.libcmp(b.key, a.key)

    ordered = sorted(injected, key=cmp_to_key(descending))
    same = {(e.key, e.value, e.flags) for e in ordered}
    out: list[CacheEntry] = []
    i = 0
    for e in image:
        while i < len(ordered) and ldcache.libcmp(ordered[i].key, e.key) >= 0:
            out.append(ordered[i])
            i += 1
        if (e.key, e.value, e.flags) not in same:
            out.append(e)
    out += ordered[i:]
    return out


def write(root_fd: int, entries: Sequence[CacheEntry]) -> None:
    """Replace the image's ``/etc/ld.so.cache`` with ``entries`` (mode 0644): written as
    ``ld.so.cache~`` in its ``/etc`` (reached without a link), then renamed. Raises OSError."""
    data = ldcache.serialize(entries)
    etc = imagefs.open_strict(root_fd, CACHE_DIR)
    try:
        try:
            os.unlink(CACHE_TEMP, dir_fd=etc)
        except FileNotFoundError:
            pass
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(CACHE_TEMP, flags, 0o644, dir_fd=etc)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, 0o644)
        finally:
            os.close(fd)
        os.rename(CACHE_TEMP, CACHE_NAME, src_dir_fd=etc, dst_dir_fd=etc)
    finally:
        os.close(etc)

"""Read glibc's ``ld.so.cache`` without running ``ldconfig -p``.

Two layouts exist (glibc ``sysdeps/generic/dl-cache.h``, ``elf/cache.c``):

* the **new** format, written by default since glibc 2.32::

      "glibc-ld.so.cache" "1.1"               20 bytes of magic and version
      uint32 nlibs, uint32 len_strings
      uint8 flags (flags & 3: 0 unknown, 1 invalid, 2 little endian, 3 big endian), 3 pad bytes
      uint32 extension_offset, uint32 unused[3]          header: 48 bytes
      nlibs x {int32 flags, uint32 key, uint32 value, uint32 osversion, uint64 hwcap}  (24 bytes)
      string table (len_strings bytes), then the extension directory

  ``key`` and ``value`` are offsets from the start of the *new-format header*.

* the **old** libc5-compatible format (``ldconfig -c old``)::

      "ld.so-1.7.0" + 1 pad byte, uint32 nlibs   header: 16 bytes
      nlibs x {int32 flags, uint32 key, uint32 value}                                 (12 bytes)
      string table

  whose offsets count from the end of the entry array. ``ldconfig -c compat`` writes an old
  section first and hides a complete new-format section, aligned to 8 bytes, at the start of the
  old section's string table. :func:`parse` prefers that new section when it is there, as the
  dynamic loader does (it carries the hwcap information the old one lacks).

Strings are decoded as UTF-8 with ``surrogateescape``: that is how Python decodes file names
(``os.fsdecode``), so ``os.fsencode(entry.value)`` gives back the exact bytes in the file, and a
path that is not valid UTF-8 can still be opened. Every offset is bounds-checked; on any malformed
input :func:`parse` raises :class:`LdCacheError` (a :class:`ValueError`) and nothing else.

:func:`serialize` writes the new format (no extension section), and :func:`libcmp` is the order
of the keys in a cache, as the dynamic loader's binary search expects it: gpuhook's ldcache hook
adds the injected libraries' entries to an image's own cache with them
(:mod:`gpuhook.runtime.ldmerge`; the static dispatcher's C hook writes the same bytes).

This module is imported on the hot path: only :mod:`struct` and :mod:`sys` at runtime.
"""

from __future__ import annotations

import struct
import sys

from gpuhook.model.frozen import Frozen, _init

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "HWCAP_EXTENSION",
    "CacheEntry",
    "LdCacheError",
    "arch_of",
    "libcmp",
    "new_section",
    "parse",
    "parse_new",
    "plain_key",
    "read",
    "serialize",
]

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache"
NEW_VERSION = b"1.1"

_OLD_HEADER = 16  # magic (11 bytes) + 1 pad byte + uint32 nlibs
_OLD_ENTRY = 12
_NEW_HEADER = 48
_NEW_ENTRY = 24

#: Set in ``hwcap`` of entries for libraries in a ``glibc-hwcaps/<name>/`` subdirectory; the low
#: 32 bits then index the glibc-hwcaps extension section (bits 32-41: the x86 ISA level).
HWCAP_EXTENSION = 1 << 62

_NATIVE = "<" if sys.byteorder == "little" else ">"

# flags & 0xff: the library kind; flags & 0xff00: the ABI (glibc sysdeps/generic/ldconfig.h).
_KINDS = {0: "libc4", 1: "elf", 2: "libc5", 3: "libc6"}
_ABIS = {
    0x0100: "sparc64",
    0x0200: "ia64",
    0x0300: "x86-64",
    0x0400: "s390x",
    0x0500: "ppc64",
    0x0600: "mips64-n32",
    0x0700: "mips64",
    0x0800: "x32",
    0x0900: "arm-hf",
    0x0A00: "aarch64",
    0x0B00: "arm-sf",
    0x0C00: "mips-nan2008",
    0x0D00: "mips64-n32-nan2008",
    0x0E00: "mips64-nan2008",
    0x0F00: "riscv-soft-float",
    0x1000: "riscv-double-float",
    0x1100: "loongarch-soft-float",
    0x1200: "loongarch-double-float",
}


class LdCacheError(ValueError):
    """The bytes are not a well-formed ``ld.so.cache``; the message says what is wrong."""


def arch_of(flags: int) -> str:
    """Decode the ABI of a cache entry from its flags, as ``ldconfig -p`` does.

    An entry with an ABI field gets that ABI's name (``"x86-64"``, ``"aarch64"``, ``"x32"``...).
    One without gets its kind: ``"libc6"`` is the platform's default 32-bit ABI (i386 on an x86
    host, armel on ARM...), ``"elf"`` an ELF object that does not link libc. The flags alone
    cannot say more; :func:`gpuhook.inventory.elf.elf_class` can. ``"unknown"`` otherwise.
    """
    abi = flags & 0xFF00
    if abi:
        return _ABIS.get(abi, "unknown")
    return _KINDS.get(flags & 0xFF, "unknown")


class CacheEntry(Frozen):
    """One cache entry: ``key`` is the soname, ``value`` the path the loader would open;
    ``osversion`` the minimum kernel version of its ELF note (new format only)."""

    key: str
    value: str
    flags: int
    arch: str
    hwcap: int
    osversion: int

    def __init__(
        self,
        key: str,
        value: str,
        flags: int,
        arch: str | None = None,
        hwcap: int = 0,
        osversion: int = 0,
    ) -> None:
        _init(
            self,
            key=key,
            value=value,
            flags=flags,
            arch=arch_of(flags) if arch is None else arch,
            hwcap=hwcap,
            osversion=osversion,
        )


class _Strings:
    """NUL-terminated strings at offsets from ``base``, decoded once each."""

    __slots__ = ("_base", "_data", "_seen")

    def __init__(self, data: bytes, base: int) -> None:
        self._data = data
        self._base = base
        self._seen: dict[int, str] = {}

    def __call__(self, offset: int) -> str:
        text = self._seen.get(offset)
        if text is None:
            data = self._data
            start = self._base + offset
            if start >= len(data):
                raise LdCacheError(
                    f"string offset {offset} (file offset {start}) is out of range "
                    f"(file has {len(data)} bytes)"
                )
            end = data.find(b"\0", start)
            if end < 0:
                raise LdCacheError(f"string at file offset {start} is not NUL-terminated")
            text = data[start:end].decode("utf-8", "surrogateescape")
            self._seen[offset] = text
        return text


def _parse_new(data: bytes, base: int) -> tuple[CacheEntry, ...]:
    size = len(data)
    if size - base < _NEW_HEADER:
        raise LdCacheError(
            f"truncated: the new-format header at offset {base} needs {_NEW_HEADER} bytes, "
            f"{size - base} left"
        )
    endian = data[base + 28] & 3
    if endian == 1:
        raise LdCacheError("the cache is marked invalid (header flags & 3 == 1)")
    order = "<" if endian == 2 else ">" if endian == 3 else _NATIVE
    nlibs, len_strings = struct.unpack_from(order + "II", data, base + 20)
    first = base + _NEW_HEADER
    if nlibs > (size - first) // _NEW_ENTRY:
        raise LdCacheError(
            f"truncated: {nlibs} entries need {nlibs * _NEW_ENTRY} bytes after the header, "
            f"{size - first} left"
        )
    end = first + nlibs * _NEW_ENTRY
    if len_strings > size - end:
        raise LdCacheError(
            f"truncated: the string table needs {len_strings} bytes, {size - end} left"
        )
    string = _Strings(data, base)
    return tuple(
        CacheEntry(string(key), string(value), flags, None, hwcap, osversion)
        for flags, key, value, osversion, hwcap in struct.iter_unpack(
            order + "iIIIQ", data[first:end]
        )
    )


def _hidden_new(data: bytes, end: int) -> int | None:
    """The offset of the new-format section hidden at the start of an old-format string table
    that ends its entries at ``end`` ("ldconfig -c compat"), aligned for struct cache_file_new:
    8 bytes on most ABIs, 4 on some (i386); None without one."""
    for base in (end + (-end % 8), end):
        if data.startswith(NEW_MAGIC + NEW_VERSION, base):
            return base
    return None


def new_section(data: bytes) -> int | None:
    """Where the new-format header of a cache starts (0, or inside a compat cache), and only
    when its byte order is this machine's (or unmarked); None for anything else (old format
    only, the other byte order, not a cache). What the loader reads of a cache is this part."""
    base: int | None = 0
    if not data.startswith(NEW_MAGIC + NEW_VERSION):
        if not data.startswith(OLD_MAGIC) or len(data) < _OLD_HEADER:
            return None
        (nlibs,) = struct.unpack_from(_NATIVE + "I", data, 12)
        end = _OLD_HEADER + nlibs * _OLD_ENTRY
        base = _hidden_new(data, end) if end <= len(data) else None
    if base is None or len(data) < base + _NEW_HEADER:
        return None
    return base if data[base + 28] & 3 in (0, 2 if _NATIVE == "<" else 3) else None


def _parse_old(data: bytes) -> tuple[CacheEntry, ...]:
    size = len(data)
    if size < _OLD_HEADER:
        raise LdCacheError(
            f"truncated: the old-format header needs {_OLD_HEADER} bytes, file has {size}"
        )
    room = (size - _OLD_HEADER) // _OLD_ENTRY
    # The old format records no byte order: try the host's, then the other one.
    order = _NATIVE
    (nlibs,) = struct.unpack_from(order + "I", data, 12)
    if nlibs > room:
        swapped = ">" if order == "<" else "<"
        (other,) = struct.unpack_from(swapped + "I", data, 12)
        if other > room:
            raise LdCacheError(
                f"truncated: {nlibs} old-format entries need {nlibs * _OLD_ENTRY} bytes, "
                f"{size - _OLD_HEADER} left"
            )
        order, nlibs = swapped, other
    end = _OLD_HEADER + nlibs * _OLD_ENTRY
    base = _hidden_new(data, end)
    if base is not None:
        return _parse_new(data, base)
    string = _Strings(data, end)
    return tuple(
        CacheEntry(string(key), string(value), flags)
        for flags, key, value in struct.iter_unpack(order + "iII", data[_OLD_HEADER:end])
    )


def parse(data: bytes) -> tuple[CacheEntry, ...]:
    """The entries of an ``ld.so.cache`` image, in file order.

    Raises :class:`LdCacheError` (and nothing else) when the bytes are not a valid cache.
    """
    if data.startswith(NEW_MAGIC):
        version = data[len(NEW_MAGIC) : len(NEW_MAGIC) + len(NEW_VERSION)]
        if version != NEW_VERSION:
            raise LdCacheError(f"unsupported new-format cache version {version!r}")
        return _parse_new(data, 0)
    if data.startswith(OLD_MAGIC):
        return _parse_old(data)
    if not data:
        raise LdCacheError("empty file")
    raise LdCacheError(f"bad magic {data[:20]!r}: not an ld.so.cache")


def parse_new(data: bytes) -> tuple[CacheEntry, ...]:
    """The entries of the new-format section alone (:func:`new_section`), what the loader of
    a glibc >= 2.2 reads. Raises :class:`LdCacheError` when there is none in this machine's byte
    order, or when it is malformed."""
    base = new_section(data)
    if base is None:
        raise LdCacheError("no new-format section in this machine's byte order")
    return _parse_new(data, base)


def read(path: str) -> tuple[CacheEntry, ...]:
    """Parse the cache file at ``path``. :class:`OSError` propagates."""
    with open(path, "rb") as f:
        data = f.read()
    return parse(data)


def libcmp(a: str, b: str) -> int:
    """The loader's order of two keys (glibc ``_dl_cache_libcmp``): > 0 when ``a`` sorts after
    ``b``, runs of digits compared as numbers. A cache lists its keys from the greatest down.
    Meant for ASCII keys whose digit runs fit in 9 digits (what :func:`plain_key` accepts):
    beyond that the loader's own arithmetic overflows."""
    i = j = 0
    while i < len(a):
        if _digit(a, i):
            if not _digit(b, j):
                return 1
            i2, j2 = _digits_end(a, i), _digits_end(b, j)
            diff = int(a[i:i2]) - int(b[j:j2])
            if diff:
                return diff
            i, j = i2, j2
        elif _digit(b, j):
            return -1
        elif j >= len(b) or a[i] != b[j]:
            return ord(a[i]) - (ord(b[j]) if j < len(b) else 0)
        else:
            i, j = i + 1, j + 1
    return -ord(b[j]) if j < len(b) else 0


def _digit(text: str, at: int) -> bool:
    return at < len(text) and "0" <= text[at] <= "9"


def _digits_end(text: str, start: int) -> int:
    end = start
    while _digit(text, end):
        end += 1
    return end


def plain_key(key: str) -> bool:
    """An ASCII key without a run of more than 9 digits: one :func:`libcmp` orders as the
    loader does on every architecture."""
    if not key.isascii():
        return False
    run = 0
    for ch in key:
        run = run + 1 if "0" <= ch <= "9" else 0
        if run > 9:
            return False
    return True


def serialize(entries: Sequence[CacheEntry]) -> bytes:
    """A new-format cache listing ``entries`` in that order: the 48-byte header (this machine's
    byte order, no extension section), the entries, then each entry's key and value as
    NUL-terminated strings, in entry order. :func:`parse` gives the same entries back."""
    order = _NATIVE
    strings = bytearray()
    table = bytearray()
    base = _NEW_HEADER + _NEW_ENTRY * len(entries)
    for e in entries:
        key = e.key.encode("utf-8", "surrogateescape")
        value = e.value.encode("utf-8", "surrogateescape")
        key_at = base + len(strings)
        strings += key + b"\0"
        table += struct.pack(
            order + "iIIIQ", e.flags, key_at, base + len(strings), e.osversion, e.hwcap
        )
        strings += value + b"\0"
    endian = 2 if order == "<" else 3
    header = NEW_MAGIC + NEW_VERSION
    header += struct.pack(order + "IIB3xI3I", len(entries), len(strings), endian, 0, 0, 0, 0)
    return bytes(header + table + strings)

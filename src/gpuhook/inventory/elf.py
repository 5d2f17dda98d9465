"""Read the DT_SONAME of an ELF shared object, reading only the bytes that lead to it.

Driver libraries can be 100+ MB, so a file is never read whole: the ELF header first, then the
section header table, the dynamic section and the one string, each by seek and a bounded read.

The dynamic section is found through the section headers (``SHT_DYNAMIC``; its ``sh_link`` names
its string table). When a file has no section headers (stripped to the bone, ``e_shoff == 0``),
has no ``SHT_DYNAMIC`` section, or its section headers are damaged, the program headers are used
instead: ``PT_DYNAMIC`` gives the dynamic array, whose ``DT_STRTAB`` is a virtual address that is
translated to a file offset through the ``PT_LOAD`` segment holding it. (That second route is the
only one ``ldconfig`` and the dynamic loader use.)

ELF32 and ELF64, little and big endian. Strings are decoded as UTF-8 with ``surrogateescape``,
like file names. Malformed input raises :class:`ElfError` (a :class:`ValueError`); a file that
cannot be read raises :class:`OSError`. Nothing else escapes.

This module is imported on the hot path: only :mod:`struct` and :mod:`os` at runtime.
"""

from __future__ import annotations

import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO

__all__ = ["ElfError", "elf_class", "note_from_file", "read_soname", "soname_from_bytes"]

ELF_MAGIC = b"\x7fELF"

_SHT_DYNAMIC = 6
_SHT_NOTE = 7
_MAX_NOTE = 64 << 10  # one note section
_PT_LOAD = 1
_PT_DYNAMIC = 2
_PN_XNUM = 0xFFFF
_DT_NULL = 0
_DT_STRTAB = 5
_DT_STRSZ = 10
_DT_SONAME = 14

# Sanity limits: far above anything a linker writes, low enough to bound memory on junk.
_MAX_TABLE = 16 << 20  # section or program header table, dynamic array
_MAX_STRING = 64 << 10  # one soname
_CHUNK = 256  # string reads from a file
# An image's file (the forward compatibility note): bounded by what a shared library needs.
# NVIDIA's libcuda has about 40 sections and a section name table of a few hundred bytes.
_MAX_NOTE_SECTIONS = 1024
_MAX_NAMES = 64 << 10
_MAX_ENTRY = 256  # a section header entry: 40 (ELF32) or 64 (ELF64) bytes


class ElfError(ValueError):
    """The bytes are not a well-formed ELF object; the message says what is wrong."""


class _Layout:
    """The struct formats of one ELF class and byte order."""

    __slots__ = ("dyn", "ehdr", "phdr", "shdr")

    def __init__(self, order: str, is64: bool) -> None:
        if is64:
            # e_type..e_shstrndx; after the 16 bytes of e_ident.
            self.ehdr = struct.Struct(order + "16xHHIQQQIHHHHHH")
            # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info, ...
            self.shdr = struct.Struct(order + "IIQQQQIIQQ")
            # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
            self.phdr = struct.Struct(order + "IIQQQQQQ")
            self.dyn = struct.Struct(order + "qQ")
        else:
            self.ehdr = struct.Struct(order + "16xHHIIIIIHHHHHH")
            self.shdr = struct.Struct(order + "IIIIIIIIII")
            # p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align
            self.phdr = struct.Struct(order + "IIIIIIII")
            self.dyn = struct.Struct(order + "iI")

    def section(self, raw: tuple[int, ...]) -> tuple[int, int, int, int, int]:
        """(sh_type, sh_offset, sh_size, sh_link, sh_info) of an unpacked section header."""
        return raw[1], raw[4], raw[5], raw[6], raw[7]

    def segment(self, raw: tuple[int, ...]) -> tuple[int, int, int, int]:
        """(p_type, p_offset, p_vaddr, p_filesz) of an unpacked program header."""
        if self.phdr.size == 56:
            return raw[0], raw[2], raw[3], raw[5]
        return raw[0], raw[1], raw[2], raw[4]


_LAYOUTS: dict[tuple[int, int], _Layout] = {}


def _layout(elf_class: int, data: int) -> _Layout:
    layout = _LAYOUTS.get((elf_class, data))
    if layout is None:
        layout = _Layout("<" if data == 1 else ">", elf_class == 2)
        _LAYOUTS[(elf_class, data)] = layout
    return layout


# --- where the bytes come from ------------------------------------------------------------------


class _Bytes:
    __slots__ = ("_data", "size")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.size = len(data)

    def read(self, offset: int, length: int, what: str) -> bytes:
        if offset + length > self.size:
            raise _truncated(what, offset, length, self.size)
        return self._data[offset : offset + length]

    def string(self, offset: int, end: int, what: str) -> str:
        end = min(end, self.size, offset + _MAX_STRING)
        if offset >= end:
            raise ElfError(f"{what} at offset {offset} is out of range")
        stop = self._data.find(b"\0", offset, end)
        if stop < 0:
            raise ElfError(f"{what} at offset {offset} is not NUL-terminated")
        return self._data[offset:stop].decode("utf-8", "surrogateescape")


class _File:
    __slots__ = ("_f", "size")

    def __init__(self, f: BinaryIO, size: int) -> None:
        self._f = f
        self.size = size

    def read(self, offset: int, length: int, what: str) -> bytes:
        if offset + length > self.size:
            raise _truncated(what, offset, length, self.size)
        self._f.seek(offset)
        data = self._f.read(length)
        if len(data) != length:  # the file shrank under us
            raise _truncated(what, offset, length, offset + len(data))
        return data

    def string(self, offset: int, end: int, what: str) -> str:
        end = min(end, self.size, offset + _MAX_STRING)
        if offset >= end:
            raise ElfError(f"{what} at offset {offset} is out of range")
        self._f.seek(offset)
        parts: list[bytes] = []
        pos = offset
        while pos < end:
            chunk = self._f.read(min(_CHUNK, end - pos))
            if not chunk:
                break
            stop = chunk.find(b"\0")
            if stop >= 0:
                parts.append(chunk[:stop])
                return b"".join(parts).decode("utf-8", "surrogateescape")
            parts.append(chunk)
            pos += len(chunk)
        raise ElfError(f"{what} at offset {offset} is not NUL-terminated")


_Source = _Bytes | _File


def _truncated(what: str, offset: int, length: int, size: int) -> ElfError:
    return ElfError(
        f"truncated: {what} at offset {offset} ({length} bytes) runs past the end "
        f"of the file ({size} bytes)"
    )


# --- the parse ----------------------------------------------------------------------------------


def _ident(head: bytes) -> tuple[int, int]:
    """(EI_CLASS, EI_DATA) of a valid e_ident."""
    if len(head) < 16:
        raise ElfError(f"truncated: {len(head)} bytes, an ELF header needs at least 16")
    if head[:4] != ELF_MAGIC:
        raise ElfError(f"not an ELF file (magic {head[:4]!r})")
    elf_class, data = head[4], head[5]
    if elf_class not in (1, 2):
        raise ElfError(f"unknown ELF class {elf_class}")
    if data not in (1, 2):
        raise ElfError(f"unknown ELF data encoding {data}")
    return elf_class, data


def _dynamic(
    src: _Source, lay: _Layout, offset: int, size: int
) -> tuple[int | None, int | None, int | None]:
    """(DT_SONAME, DT_STRTAB, DT_STRSZ) values from the dynamic array at ``offset``."""
    if size > _MAX_TABLE:
        raise ElfError(f"dynamic array of {size} bytes is implausibly large")
    raw = src.read(offset, size - size % lay.dyn.size, "dynamic array")
    soname = strtab = strsz = None
    for tag, value in lay.dyn.iter_unpack(raw):
        if tag == _DT_NULL:
            break
        if tag == _DT_SONAME and soname is None:
            soname = value
        elif tag == _DT_STRTAB and strtab is None:
            strtab = value
        elif tag == _DT_STRSZ and strsz is None:
            strsz = value
    return soname, strtab, strsz


def _section_headers(
    src: _Source, lay: _Layout, shoff: int, shentsize: int, shnum: int
) -> list[tuple[int, int, int, int, int]]:
    """(sh_type, sh_offset, sh_size, sh_link, sh_info) of every section."""
    return [lay.section(raw) for raw in _raw_section_headers(src, lay, shoff, shentsize, shnum)]


def _raw_section_headers(
    src: _Source,
    lay: _Layout,
    shoff: int,
    shentsize: int,
    shnum: int,
    most: int | None = None,
) -> list[tuple[int, ...]]:
    """The unpacked section headers; ``most``: the largest count accepted (None: any whose
    table fits :data:`_MAX_TABLE`)."""
    if shentsize < lay.shdr.size:
        raise ElfError(f"section header size {shentsize} is too small")
    if shentsize > _MAX_ENTRY:
        raise ElfError(f"section header size {shentsize} is implausibly large")
    if shnum == 0:  # extended numbering: the count is in section 0's sh_size
        first = lay.section(lay.shdr.unpack(src.read(shoff, lay.shdr.size, "section header 0")))
        shnum = first[2]
    if most is not None and shnum > most:
        raise ElfError(
            f"{shnum} section headers is more than a shared library has (at most {most})"
        )
    if shnum * shentsize > _MAX_TABLE:
        raise ElfError(f"{shnum} section headers is implausibly many")
    table = src.read(shoff, shnum * shentsize, "section header table")
    unpack = lay.shdr.unpack_from
    return [unpack(table, i * shentsize) for i in range(shnum)]


def _via_sections(src: _Source, lay: _Layout, header: tuple[int, ...]) -> tuple[bool, str | None]:
    """(found a dynamic section, its soname) through the section headers."""
    shoff, shentsize, shnum = header[5], header[10], header[11]
    if shoff == 0:
        return False, None
    sections = _section_headers(src, lay, shoff, shentsize, shnum)
    for sh_type, offset, size, link, _info in sections:
        if sh_type != _SHT_DYNAMIC:
            continue
        if link >= len(sections):
            raise ElfError(f"dynamic section links to section {link} of {len(sections)}")
        soname, _strtab, _strsz = _dynamic(src, lay, offset, size)
        if soname is None:
            return True, None
        _type, str_offset, str_size, _link, _info = sections[link]
        if soname >= str_size:
            raise ElfError(f"DT_SONAME {soname} is outside its string table ({str_size} bytes)")
        return True, src.string(str_offset + soname, str_offset + str_size, "DT_SONAME")
    return False, None


def _via_segments(src: _Source, lay: _Layout, header: tuple[int, ...]) -> tuple[bool, str | None]:
    """(found PT_DYNAMIC, its soname) through the program headers."""
    phoff, shoff, phentsize, phnum = header[4], header[5], header[8], header[9]
    if phoff == 0 or phnum == 0:
        return False, None
    if phnum == _PN_XNUM and shoff:  # the real count is in section 0's sh_info
        raw = src.read(shoff, lay.shdr.size, "section header 0")
        phnum = lay.section(lay.shdr.unpack(raw))[4]
    if phentsize < lay.phdr.size:
        raise ElfError(f"program header size {phentsize} is too small")
    if phnum * phentsize > _MAX_TABLE:
        raise ElfError(f"{phnum} program headers is implausibly many")
    table = src.read(phoff, phnum * phentsize, "program header table")
    loads: list[tuple[int, int, int]] = []
    dynamic = None
    for i in range(phnum):
        p_type, offset, vaddr, filesz = lay.segment(lay.phdr.unpack_from(table, i * phentsize))
        if p_type == _PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif p_type == _PT_DYNAMIC and dynamic is None:
            dynamic = (offset, filesz)
    if dynamic is None:
        return False, None
    soname, strtab, strsz = _dynamic(src, lay, *dynamic)
    if soname is None:
        return True, None
    if strtab is None:
        raise ElfError("DT_SONAME without DT_STRTAB")
    for vaddr, offset, filesz in loads:
        if vaddr <= strtab < vaddr + filesz:
            start = offset + (strtab - vaddr)
            end = offset + filesz
            if strsz is not None:
                if soname >= strsz:
                    raise ElfError(f"DT_SONAME {soname} is outside DT_STRSZ ({strsz})")
                end = min(end, start + strsz)
            return True, src.string(start + soname, end, "DT_SONAME")
    raise ElfError(f"DT_STRTAB address {strtab:#x} is in no PT_LOAD segment")


def _soname(src: _Source) -> str | None:
    elf_class, data = _ident(src.read(0, min(16, src.size), "ELF identification"))
    lay = _layout(elf_class, data)
    header = lay.ehdr.unpack(src.read(0, lay.ehdr.size, "ELF header"))
    problem: ElfError | None = None
    try:
        found, name = _via_sections(src, lay, header)
        if found:
            return name
    except ElfError as e:  # damaged section headers: the program headers may still do
        problem = e
    try:
        found, name = _via_segments(src, lay, header)
    except ElfError:
        if problem is not None:
            raise problem from None
        raise
    if found:
        return name
    if problem is not None:
        raise problem
    return None


def _note(src: _Source, section: str, owner: str) -> bytes | None:
    """The description of the first note of ``owner`` in the ``SHT_NOTE`` section named
    ``section`` (found through the section headers and their string table), or None.

    The file is an image's (untrusted): the work is bounded by what a shared library needs, not
    by what its headers claim. At most :data:`_MAX_NOTE_SECTIONS` section headers, a section name
    table of at most :data:`_MAX_NAMES` bytes read once, one note section of at most
    :data:`_MAX_NOTE` bytes: five reads at most, under 200 KiB, whatever the file says."""
    elf_class, data = _ident(src.read(0, min(16, src.size), "ELF identification"))
    lay = _layout(elf_class, data)
    header = lay.ehdr.unpack(src.read(0, lay.ehdr.size, "ELF header"))
    shoff, shentsize, shnum, shstrndx = header[5], header[10], header[11], header[12]
    if shoff == 0:
        return None
    raw = _raw_section_headers(src, lay, shoff, shentsize, shnum, _MAX_NOTE_SECTIONS)
    if shstrndx >= len(raw):
        raise ElfError(f"section name table {shstrndx} of {len(raw)} sections")
    names = _names(src, lay.section(raw[shstrndx]))
    wanted = section.encode() + b"\0"
    order = "<" if data == 1 else ">"
    for fields in raw:
        sh_type, offset, size, _link, _info = lay.section(fields)
        name_at = fields[0]
        if sh_type != _SHT_NOTE or size > _MAX_NOTE or name_at >= len(names):
            continue
        if names[name_at : name_at + len(wanted)] == wanted:
            return _note_desc(src.read(offset, size, "note section"), order, owner)
    return None


def _names(src: _Source, shstrtab: tuple[int, int, int, int, int]) -> bytes:
    """The section name table, read whole once (at most :data:`_MAX_NAMES` bytes)."""
    _type, offset, size, _link, _info = shstrtab
    if size > _MAX_NAMES:
        raise ElfError(
            f"section name table of {size} bytes is implausibly large (at most {_MAX_NAMES})"
        )
    return src.read(offset, size, "section name table")


def _note_desc(raw: bytes, order: str, owner: str) -> bytes | None:
    """The description of ``owner``'s note among the notes of ``raw`` (4-byte aligned)."""
    pos = 0
    while pos + 12 <= len(raw):
        namesz, descsz, _type = struct.unpack_from(order + "III", raw, pos)
        name_start = pos + 12
        desc_start = name_start + namesz + (-namesz % 4)
        desc_end = desc_start + descsz
        if desc_end > len(raw):
            raise ElfError("truncated note")
        if raw[name_start : name_start + namesz].rstrip(b"\0") == owner.encode():
            return raw[desc_start:desc_end]
        pos = desc_end + (-descsz % 4)
    return None


# --- the API ------------------------------------------------------------------------------------


def soname_from_bytes(data: bytes) -> str | None:
    """The DT_SONAME of the ELF image ``data``; None when it has none (or no dynamic section)."""
    return _soname(_Bytes(data))


def read_soname(path: str) -> str | None:
    """The DT_SONAME of the ELF file at ``path``; None when it has none (or no dynamic section).

    Raises :class:`ElfError` for a malformed file and :class:`OSError` for an unreadable one.
    """
    with open(path, "rb") as f:
        return _soname(_File(f, os.fstat(f.fileno()).st_size))


def note_from_file(f: BinaryIO, size: int, section: str, owner: str) -> bytes | None:
    """The description of ``owner``'s note in the note section ``section`` of the open ELF file
    ``f`` (``size`` bytes), or None when there is none. Reads only the headers and that section.

    Raises :class:`ElfError` for a malformed file and :class:`OSError` for an unreadable one.
    """
    return _note(_File(f, size), section, owner)


def elf_class(path: str) -> str:
    """``"32"`` or ``"64"``: the ELF class of ``path`` (tells 32-bit compat libraries apart)."""
    with open(path, "rb") as f:
        head = f.read(16)
    return "64" if _ident(head)[0] == 2 else "32"

"""A crafted CUDA forward compatibility library (issue 36.1): an ELF32 file whose section headers
make a naive reader do work far beyond what a real library needs.

``e_shnum = 0`` (extended numbering: the count, 419,430, is section 0's ``sh_size``),
``e_shstrndx = 1``; every section after 0 is a note of 16 bytes whose name (offset 0 of the name
table) is 65,535 bytes long; section 1, the name table, is itself a note, 65,536 bytes (the
name and its NUL) so that it is read like any other. 16.8 MB in all (48 KB compressed). Read one
256-byte chunk at a time per section, the name alone is 107 million reads.
"""

from __future__ import annotations

import struct
from pathlib import Path

SECTIONS = 419_430
NAME = 65_535
_EHDR = 52
_SHDR = 40
_SHT_NOTE = 7


def write(path: Path, sections: int = SECTIONS, name: int = NAME) -> int:
    """Write the crafted library at ``path``; its size in bytes."""
    names_at = _EHDR + sections * _SHDR
    ident = b"\x7fELF" + bytes([1, 1, 1]) + bytes(9)  # ELF32, little endian, version 1
    # e_type DYN, e_machine 386, e_version, e_entry, e_phoff, e_shoff, e_flags, e_ehsize,
    # e_phentsize, e_phnum, e_shentsize, e_shnum (0: extended), e_shstrndx
    header = ident + struct.pack("<HHIIIIIHHHHHH", 3, 3, 1, 0, 0, _EHDR, 0, _EHDR, 0, 0, 40, 0, 1)
    shdr = struct.Struct("<IIIIIIIIII")
    first = shdr.pack(0, 0, 0, 0, 0, sections, 0, 0, 0, 0)
    table = shdr.pack(0, _SHT_NOTE, 0, 0, names_at, name + 1, 0, 0, 1, 0)
    note = shdr.pack(0, _SHT_NOTE, 0, 0, names_at, 16, 0, 0, 4, 0)
    with open(path, "wb") as f:
        f.write(header)
        f.write(first)
        f.write(table)
        chunk = note * 4096
        left = sections - 2
        while left > 0:
            n = min(left, 4096)
            f.write(chunk if n == 4096 else note * n)
            left -= n
        f.write(b"A" * name + b"\0")
    return names_at + name + 1

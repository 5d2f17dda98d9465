"""The self-contained runtime a node gets under ``/opt/gpuhook``, copied from the image it runs in.

Layout (paths as the host sees them)::
    /opt/gpuhook/bin/python3              the image's interpreter
    /opt/gpuhook/bin/gpuhook-runtime      the image's dispatchers (C, static; POSIX sh), which
    /opt/gpuhook/bin/gpuhook              start Python through the loader
    /opt/gpuhook/bin/ldconfig             the image's (static) ldconfig, for the ld.so.cache hook
    /opt/gpuhook/lib/ld-linux-x86-64.so.2 the image's dynamic loader (the interpreter's PT_INTERP)
    /opt/gpuhook/lib/lib*.so.*            every shared library the interpreter and the extension
                                          modules need (the loader's ``--list``), by soname
    /opt/gpuhook/lib/python3.11/          the standard library (Python finds it from bin/python3)
    /opt/gpuhook/lib/python3/dist-packages/  gpuhook and its dependencies (Debian's site folder)

Python is always started as ``<loader> --library-path /opt/gpuhook/lib /opt/gpuhook/bin/python3``,
so nothing is taken from the host but the kernel: not its loader, libc or Python. Programs that
gpuhook starts (runc, ldconfig, hooks) are started normally and see none of this.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import gpuhook
from gpuhook.errors import NodeInstallError
from gpuhook.model.frozen import Frozen
from gpuhook.runtime import dispatch

PREFIX = "/opt/gpuhook"
LIB = f"{PREFIX}/lib"
SITE_REL = "lib/python3/dist-packages"
DISPATCHERS = ("gpuhook-runtime", "gpuhook")
# Parts of the standard library that gpuhook never imports.
STDLIB_SKIP = frozenset(
    ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data")
)
PT_INTERP = 3


class Source(Frozen):
    """Where the image keeps what is copied: interpreter, stdlib, site folder, dispatchers."""

    python: str
    stdlib: str
    site: str
    bin_dir: str
    ldconfig: str
    python_cmd: str


def image_source() -> Source:
    """This interpreter and the packages it runs gpuhook from (Debian's layout in the image)."""

    site = os.path.dirname(os.path.dirname(os.path.abspath(gpuhook.__file__)))
    return Source(
        python=os.path.realpath(sys.executable),
        stdlib=os.path.dirname(os.path.abspath(os.__file__)),
        site=site,
        bin_dir="/usr/bin",
        ldconfig="/sbin/ldconfig",
        python_cmd="/usr/bin/python3",
    )


def interpreter_of(path: str) -> str:
    """The PT_INTERP (dynamic loader) of an ELF64 little-endian executable."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if head[:6] != b"\x7fELF\x02\x01":
            raise NodeInstallError(f"{path}: not a 64-bit little-endian ELF file")
        phoff, phentsize, phnum = (
            struct.unpack_from("<Q", head, 32)[0],
            *struct.unpack_from("<HH", head, 54),
        )
        for i in range(phnum):
            fh.seek(phoff + i * phentsize)
            p_type, _, p_offset, _, _, p_filesz = struct.unpack("<IIQQQQ", fh.read(40))
            if p_type == PT_INTERP:
                fh.seek(p_offset)
                return fh.read(p_filesz).rstrip(b"\0").decode()
    raise NodeInstallError(f"{path}: no program interpreter (a static executable?)")


def launcher(loader_name: str) -> str:
    """The command line that starts the copied interpreter on the host."""
    return f"{LIB}/{loader_name} --library-path {LIB} {PREFIX}/bin/python3"


def tree(src: str, dest_rel: str, skip: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """``(source file, destination relative to PREFIX)`` for every file under ``src``; symlinks
    to files are copied as files, symlinks to folders and top-level names in ``skip`` left out."""
    out: list[tuple[str, str]] = []
    for folder, dirs, files in os.walk(src):
        if folder == src:
            dirs[:] = [d for d in dirs if d not in skip]
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(folder, d)))
        rel = os.path.relpath(folder, src)
        for name in sorted(files):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                out.append((path, os.path.normpath(os.path.join(dest_rel, rel, name))))
    return out


def is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def needed_libraries(loader: str, elf_files: list[str]) -> dict[str, str]:
    """``{soname: resolved path}`` of every library the loader's ``--list`` resolves for the
    files; a library it cannot find is left out (only an extension module gpuhook does not
    import can need one)."""
    found: dict[str, str] = {}
    for path in elf_files:
        out = subprocess.run(
            [loader, "--list", path], capture_output=True, text=True, timeout=60, check=False
        )
        for line in out.stdout.splitlines():
            name, arrow, rest = line.strip().partition(" => ")
            target = rest.split(" (", 1)[0].strip()
            if arrow and target.startswith("/"):
                found.setdefault(name, os.path.realpath(target))
    return found


def files(source: Source) -> tuple[list[tuple[str, str]], str]:
    """Every file of the runtime (dispatchers aside) as ``(source, relative destination)``, and
    the loader's file name."""
    loader = interpreter_of(source.python)
    copied = [(source.python, "bin/python3"), (source.ldconfig, "bin/ldconfig")]
    copied += tree(source.stdlib, f"lib/{os.path.basename(source.stdlib)}", STDLIB_SKIP)
    copied += tree(source.site, SITE_REL)
    elves = [src for src, _ in copied if src.endswith(".so") or src == source.python]
    libs = needed_libraries(loader, [p for p in elves if is_elf(p)])
    loader_name = os.path.basename(loader)
    copied.append((os.path.realpath(loader), f"lib/{loader_name}"))
    copied += [(path, f"lib/{name}") for name, path in sorted(libs.items()) if name != loader_name]
    return copied, loader_name


def dispatcher(name: str, data: bytes, source: Source, loader_name: str) -> bytes:
    """The image's dispatcher ``name`` with its interpreter and package folder replaced by the
    copies: written into the compiled gpuhook-runtime's interpreter region, replaced in the sh
    text of gpuhook."""

    if name == "gpuhook-runtime":
        old = dispatch.python_command(source.python_cmd, source.site)
        try:
            found = dispatch.command_of(data)
        except ValueError as exc:
            raise NodeInstallError(f"the image's {name}: {exc}") from None
        if found != old:
            raise NodeInstallError(
                f"the image's {name} starts {' '.join(found)!r}, not {' '.join(old)!r}; "
                "cannot relocate it"
            )
        new = dispatch.python_command(launcher(loader_name), f"{PREFIX}/{SITE_REL}")
        return dispatch.relocate(data, new)
    text = data.decode()
    start = f"{source.python_cmd} -I -S {source.site}/gpuhook/"
    if start not in text:
        raise NodeInstallError(f"the image's {name} does not start {start!r}; cannot relocate it")
    return text.replace(
        start, f"{launcher(loader_name)} -I -S {PREFIX}/{SITE_REL}/gpuhook/"
    ).encode()

"""DT_SONAME reading: real objects from gcc, the host's libraries checked against readelf, and
hand-built ELF images for the layouts gcc will not make here (big endian, no section headers)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuhook.inventory import elf, ldcache
from gpuhook.inventory.elf import ElfError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

GCC = shutil.which("gcc")
HOST_CACHE = "/etc/ld.so.cache"


# --- a hand-made ELF image ----------------------------------------------------------------------

BASE = 0x10000  # load address: DT_STRTAB is a virtual address, not a file offset


def build_elf(
    soname: str | None,
    *,
    is64: bool = True,
    big: bool = False,
    sections: bool = True,
    strtab_addr: int | None = None,
) -> bytes:
    """A minimal ET_DYN image: ELF header, PT_LOAD + PT_DYNAMIC, .dynstr, .dynamic and (with
    ``sections``) section headers [null, .dynstr, .dynamic]. Written from the ELF spec."""
    o = ">" if big else "<"
    ehsize, phsize, shsize = (64, 56, 64) if is64 else (52, 32, 40)
    dyn_fmt = o + ("qQ" if is64 else "iI")
    dynstr = b"\0libc.so.6\0" + (soname.encode() + b"\0" if soname else b"")
    str_off = ehsize + 2 * phsize
    dyn_off = str_off + len(dynstr) + (-(str_off + len(dynstr)) % 8)
    tags = [(1, 1), (5, BASE + str_off if strtab_addr is None else strtab_addr)]
    tags += [(10, len(dynstr))]
    if soname:
        tags.append((14, len(b"\0libc.so.6\0")))
    tags.append((0, 0))
    dynamic = b"".join(struct.pack(dyn_fmt, t, v) for t, v in tags)
    sh_off = dyn_off + len(dynamic)
    total = sh_off + (3 * shsize if sections else 0)
    if is64:
        ehdr = struct.pack(
            o + "HHIQQQIHHHHHH",
            3,
            62,
            1,
            0,
            ehsize,
            sh_off if sections else 0,
            0,
            ehsize,
            phsize,
            2,
            shsize,
            3 if sections else 0,
            0,
        )
        phdrs = struct.pack(o + "IIQQQQQQ", 1, 5, 0, BASE, BASE, dyn_off, dyn_off, 0x1000)
        phdrs += struct.pack(
            o + "IIQQQQQQ",
            2,
            6,
            dyn_off,
            BASE + dyn_off,
            BASE + dyn_off,
            len(dynamic),
            len(dynamic),
            8,
        )
        shdr = o + "IIQQQQIIQQ"
        shdrs = bytes(shsize)
        shdrs += struct.pack(shdr, 0, 3, 2, BASE + str_off, str_off, len(dynstr), 0, 0, 1, 0)
        shdrs += struct.pack(shdr, 0, 6, 3, BASE + dyn_off, dyn_off, len(dynamic), 1, 0, 8, 16)
    else:
        ehdr = struct.pack(
            o + "HHIIIIIHHHHHH",
            3,
            3,
            1,
            0,
            ehsize,
            sh_off if sections else 0,
            0,
            ehsize,
            phsize,
            2,
            shsize,
            3 if sections else 0,
            0,
        )
        phdrs = struct.pack(o + "IIIIIIII", 1, 0, BASE, BASE, dyn_off, dyn_off, 5, 0x1000)
        phdrs += struct.pack(
            o + "IIIIIIII",
            2,
            dyn_off,
            BASE + dyn_off,
            BASE + dyn_off,
            len(dynamic),
            len(dynamic),
            6,
            4,
        )
        shdr = o + "IIIIIIIIII"
        shdrs = bytes(shsize)
        shdrs += struct.pack(shdr, 0, 3, 2, BASE + str_off, str_off, len(dynstr), 0, 0, 1, 0)
        shdrs += struct.pack(shdr, 0, 6, 3, BASE + dyn_off, dyn_off, len(dynamic), 1, 0, 4, 8)
    ident = b"\x7fELF" + bytes([2 if is64 else 1, 2 if big else 1, 1]) + bytes(9)
    image = ident + ehdr + phdrs + dynstr
    image += bytes(dyn_off - len(image)) + dynamic + (shdrs if sections else b"")
    assert len(image) == total
    return image


def without_section_headers(data: bytes) -> bytes:
    """A copy with e_shoff, e_shnum and e_shstrndx zeroed (little-endian ELF64 only)."""
    out = bytearray(data)
    struct.pack_into("<Q", out, 0x28, 0)
    struct.pack_into("<HH", out, 0x3C, 0, 0)
    return bytes(out)


LAYOUTS = [
    pytest.param(
        is64,
        big,
        sections,
        id=f"elf{64 if is64 else 32}-{'be' if big else 'le'}-"
        f"{'sections' if sections else 'segments'}",
    )
    for is64 in (True, False)
    for big in (False, True)
    for sections in (True, False)
]


# --- objects from gcc ---------------------------------------------------------------------------


def gcc(out: Path, *args: str) -> bool:
    src = out.parent / f"{out.name}.c"
    src.write_text("int gpuhook_probe(void) { return 42; }\nint main(void) { return 0; }\n")
    done = subprocess.run(
        [GCC or "gcc", *args, "-o", str(out), str(src)],
        capture_output=True,
        check=False,
        timeout=60,
    )
    return done.returncode == 0


@pytest.fixture(scope="module")
def objs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if GCC is None:
        pytest.skip("needs gcc")
    d = tmp_path_factory.mktemp("elf")
    made = {
        "libfoo": (d / "libfoo.so.1.2.3", ["-shared", "-fPIC", "-Wl,-soname,libfoo.so.1"]),
        "nosoname": (d / "libnosoname.so", ["-shared", "-fPIC"]),
        "utf8": (d / "libü.so.1", ["-shared", "-fPIC", "-Wl,-soname,libü.so.1"]),
        "exe": (d / "prog", []),
        "object": (d / "foo.o", ["-c"]),
        "static": (d / "static", ["-static"]),
        "lib32": (
            d / "libfoo32.so.1",
            ["-m32", "-nostdlib", "-shared", "-fPIC", "-Wl,-soname,libfoo32.so.1"],
        ),
    }
    out = {}
    for name, (path, args) in made.items():
        if gcc(path, *args):
            out[name] = path
    assert {"libfoo", "nosoname", "utf8", "exe", "object"} <= out.keys()
    stripped = d / "libfoo-stripped.so"
    shutil.copy(out["libfoo"], stripped)
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-all", str(stripped)], check=True, timeout=60)
    out["stripped"] = stripped
    noshdr = d / "libfoo-noshdr.so"
    noshdr.write_bytes(without_section_headers(out["libfoo"].read_bytes()))
    out["noshdr"] = noshdr
    return out


@pytest.mark.parametrize(
    ("name", "soname"),
    [
        ("libfoo", "libfoo.so.1"),
        ("stripped", "libfoo.so.1"),
        ("noshdr", "libfoo.so.1"),
        ("utf8", "libü.so.1"),
        ("nosoname", None),
        ("exe", None),
        ("object", None),
        ("static", None),
        ("lib32", "libfoo32.so.1"),
    ],
)
def test_gcc_objects(objs: dict[str, Path], name: str, soname: str | None) -> None:
    if name not in objs:
        pytest.skip(f"gcc could not build {name} here")
    path = objs[name]
    assert elf.read_soname(str(path)) == soname
    assert elf.soname_from_bytes(path.read_bytes()) == soname


def test_elf_class(objs: dict[str, Path]) -> None:
    assert elf.elf_class(str(objs["libfoo"])) == "64"
    if "lib32" in objs:
        assert elf.elf_class(str(objs["lib32"])) == "32"
    with pytest.raises(ElfError, match="not an ELF file"):
        elf.elf_class(str(objs["libfoo"].parent / "libfoo.so.1.2.3.c"))


def test_damaged_section_headers_fall_back_to_program_headers(objs: dict[str, Path]) -> None:
    data = bytearray(objs["libfoo"].read_bytes())
    assert data[4] == 2 and data[5] == 1, "this test patches a little-endian ELF64"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for i in range(shnum):
        at = shoff + i * shentsize
        if struct.unpack_from("<I", data, at + 4)[0] == 6:  # SHT_DYNAMIC: break its sh_link
            struct.pack_into("<I", data, at + 40, 0xFFFF)
    assert elf.soname_from_bytes(bytes(data)) == "libfoo.so.1"
    # Section headers pointing past the end of the file: the same.
    struct.pack_into("<Q", data, 0x28, len(data) + 1)
    assert elf.soname_from_bytes(bytes(data)) == "libfoo.so.1"
    # With the program headers gone too, the section-header error is the one reported.
    struct.pack_into("<Q", data, 0x20, len(data) + 1)
    with pytest.raises(ElfError, match="section header"):
        elf.soname_from_bytes(bytes(data))


def test_host_libraries_agree_with_readelf() -> None:
    if not (os.path.exists(HOST_CACHE) and shutil.which("readelf")):
        pytest.skip("needs /etc/ld.so.cache and readelf")
    paths = sorted({os.path.realpath(e.value) for e in ldcache.read(HOST_CACHE)})
    paths = [p for p in paths if os.path.isfile(p)]
    out = subprocess.run(
        ["readelf", "-d", "-W", *paths], capture_output=True, check=False, timeout=120
    ).stdout.decode("utf-8", "surrogateescape")
    expected: dict[str, str | None] = dict.fromkeys(paths)
    current = paths[0]
    for line in out.splitlines():
        if line.startswith("File: "):
            current = line[len("File: ") :]
        elif "(SONAME)" in line:
            expected[current] = line[line.index("[") + 1 : line.rindex("]")]
    got = {p: elf.read_soname(p) for p in paths}
    assert got == expected
    assert sum(v is not None for v in got.values()) > len(paths) // 2


# --- hand-made layouts --------------------------------------------------------------------------


@pytest.mark.parametrize(("is64", "big", "sections"), LAYOUTS)
def test_every_class_and_byte_order(tmp_path: Path, is64: bool, big: bool, sections: bool) -> None:
    image = build_elf("libnvidia-ml.so.1", is64=is64, big=big, sections=sections)
    assert elf.soname_from_bytes(image) == "libnvidia-ml.so.1"
    path = tmp_path / "lib.so"
    path.write_bytes(image)
    assert elf.read_soname(str(path)) == "libnvidia-ml.so.1"
    assert elf.elf_class(str(path)) == ("64" if is64 else "32")
    assert elf.soname_from_bytes(build_elf(None, is64=is64, big=big, sections=sections)) is None


def test_section_route_does_not_need_dt_strtab() -> None:
    # DT_STRTAB points nowhere: only the section headers (sh_link) can find the string.
    assert elf.soname_from_bytes(build_elf("libx.so.1", strtab_addr=0x99999999)) == "libx.so.1"
    with pytest.raises(ElfError, match="DT_STRTAB address 0x99999999 is in no PT_LOAD segment"):
        elf.soname_from_bytes(build_elf("libx.so.1", strtab_addr=0x99999999, sections=False))


def test_long_soname_is_read_in_chunks(tmp_path: Path) -> None:
    name = "lib" + "x" * 1000 + ".so.1"
    for sections in (True, False):
        path = tmp_path / f"long{sections}.so"
        path.write_bytes(build_elf(name, sections=sections))
        assert elf.read_soname(str(path)) == name


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated: 0 bytes"),
        (b"\x7fELF", "truncated: 4 bytes"),
        (b"#!/bin/sh\n" + bytes(60), "not an ELF file"),
        (b"\x7fELF\x03\x01\x01" + bytes(60), "unknown ELF class 3"),
        (b"\x7fELF\x02\x00\x01" + bytes(60), "unknown ELF data encoding 0"),
        (b"\x7fELF\x02\x01\x01" + bytes(20), "truncated: ELF header at offset 0"),
    ],
)
def test_errors_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(ElfError, match=message) as info:
        elf.soname_from_bytes(data)
    assert "\n" not in str(info.value)


def test_truncated_images(objs: dict[str, Path]) -> None:
    for is64 in (True, False):
        bare = build_elf("libt.so.1", is64=is64, sections=False)
        for cut in range(len(bare)):
            with pytest.raises(ElfError):
                elf.soname_from_bytes(bare[:cut])
        # Cut inside the section headers (which come last), the program headers still work.
        full = build_elf("libt.so.1", is64=is64)
        for cut in range(len(full)):
            if cut < len(bare):
                with pytest.raises(ElfError):
                    elf.soname_from_bytes(full[:cut])
            else:
                assert elf.soname_from_bytes(full[:cut]) == "libt.so.1"
    # A real object cut short: the dynamic segment sits early, so the program headers may
    # still find the soname once the section headers at the end are gone.
    data = objs["libfoo"].read_bytes()
    for cut in range(0, len(data), 53):
        try:
            assert elf.soname_from_bytes(data[:cut]) == "libfoo.so.1"
        except ElfError:
            pass


def test_oserror_propagates(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        elf.read_soname(str(tmp_path / "missing"))
    with pytest.raises(IsADirectoryError):
        elf.read_soname(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        elf.elf_class(str(tmp_path / "missing"))


# --- fuzzing ------------------------------------------------------------------------------------

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SEEDS = [
    build_elf("libs.so.1", is64=a, big=b, sections=c)
    for a in (True, False)
    for b in (False, True)
    for c in (True, False)
]


def mutate(seed: bytes, data: st.DataObject) -> bytes:
    buf = bytearray(seed)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(buf) - 8))
        kind = data.draw(st.integers(0, 2))
        if kind == 0:
            buf[pos] = data.draw(st.integers(0, 255))
        else:  # a whole (possibly huge) field
            value = data.draw(st.sampled_from([0, 1, 0xFFFF, 0xFFFFFFFF, len(buf), len(buf) - 1]))
            struct.pack_into("<I" if kind == 1 else ">I", buf, pos, value)
    if data.draw(st.booleans()):
        del buf[data.draw(st.integers(0, len(buf))) :]
    return bytes(buf)


def soname_or_refusal(data: bytes) -> object:
    try:
        name = elf.soname_from_bytes(data)
    except ElfError as e:
        assert "\n" not in str(e)
        return ElfError
    assert name is None or isinstance(name, str)
    return name


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data: bytes) -> None:
    soname_or_refusal(data)


@FUZZ
@given(st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 0]), st.binary(max_size=400))
def test_fuzz_behind_a_valid_ident(elf_class: int, encoding: int, tail: bytes) -> None:
    soname_or_refusal(b"\x7fELF" + bytes([elf_class, encoding, 1]) + bytes(9) + tail)


@FUZZ
@given(st.data())
def test_fuzz_mutated_images(data: st.DataObject) -> None:
    soname_or_refusal(mutate(data.draw(st.sampled_from(SEEDS)), data))


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_file_reader_agrees_with_bytes_reader(fuzz_dir: Path, data: st.DataObject) -> None:
    image = mutate(data.draw(st.sampled_from(SEEDS)), data)
    path = fuzz_dir / "lib.so"
    path.write_bytes(image)
    try:
        from_file: object = elf.read_soname(str(path))
    except ElfError:
        from_file = ElfError
    assert from_file == soname_or_refusal(image)


def test_fuzz_mutated_real_object(objs: dict[str, Path]) -> None:
    seed = objs["libfoo"].read_bytes()
    (shoff,) = struct.unpack_from("<Q", seed, 0x28)

    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        buf = bytearray(seed)
        for _ in range(data.draw(st.integers(1, 4))):
            # Aim at the headers: the ELF header, program headers, and section headers.
            pos = data.draw(st.one_of(st.integers(0, 0x200), st.integers(shoff, len(buf) - 1)))
            buf[pos] = data.draw(st.integers(0, 255))
        soname_or_refusal(bytes(buf))

    run()

"""Images for the driver-file tests, built with the host's gcc: a probe that loads a library by
name the way a CUDA program does, a forward compatibility libcuda (with or without NVIDIA's
``.note.cuda.fwd_compatibility``) laid out as NVIDIA's CUDA images have it, the GNU linker in a
rootfs, and a distroless-like rootfs (a dynamic loader and libc, no ld.so.conf, no cache)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

# dlopen each argument (a name goes through the ld.so.cache, as -lcuda's NEEDED entry does), print
# the file the loader chose and what its fake_nvidia_driver_stub (or probe) says.
LOADER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW);
        if (!h) { printf("%s: %s\n", argv[i], dlerror()); bad = 1; continue; }
        struct link_map *map = 0;
        dlinfo(h, RTLD_DI_LINKMAP, &map);
        const char *(*f)(void) = (const char *(*)(void))dlsym(h, "probe");
        if (!f) f = (const char *(*)(void))dlsym(h, "fake_nvidia_driver_stub");
        printf("%s => %s: %s\n", argv[i], map ? map->l_name : "?", f ? f() : "(no symbol)");
    }
    return bad;
}
"""

# A library that calls into libcuda: linked inside the container with `ld ... -lcuda`.
PROBE_C = r"""
extern const char *fake_nvidia_driver_stub(void);
const char *probe(void) { return fake_nvidia_driver_stub(); }
"""

# A forward compatibility libcuda: the fake driver's one symbol, saying which file it is, and
# (with NOTE defined) NVIDIA's note, whose description is JSON.
COMPAT_C = r"""
#include <stdint.h>
const char *fake_nvidia_driver_stub(void) { return "compat libcuda " VERSION; }
#ifdef NOTE
struct note { uint32_t namesz, descsz, type; char name[20]; char desc[(sizeof NOTE + 3) & ~3]; };
__attribute__((section(".note.cuda.fwd_compatibility"), aligned(4), used))
static const struct note cuda_note = {19, sizeof NOTE, 1, "NVIDIA Corporation", NOTE};
#endif
"""


def _gcc(*args: str) -> None:
    subprocess.run(["gcc", "-O2", *args], check=True, capture_output=True, timeout=120)


def build_loader(dest: Path) -> Path:
    src = dest.with_suffix(".c")
    src.write_text(LOADER_C)
    _gcc("-o", str(dest), str(src))
    return dest


def build_probe_object(dest: Path) -> Path:
    src = dest.with_suffix(".c")
    src.write_text(PROBE_C)
    _gcc("-fPIC", "-c", "-o", str(dest), str(src))
    return dest


def c_string(text: str) -> str:
    return json.dumps(text)  # a JSON string of ASCII text is a C string literal


def install_compat(rootfs: Path, version: str, note: dict[str, object] | None) -> Path:
    """``/usr/local/cuda-X/compat/libcuda.so.<version>`` (soname libcuda.so.1, with its links),
    reached as NVIDIA's images reach it: ``/usr/local/cuda -> /etc/alternatives/cuda ->
    /usr/local/cuda-X`` (absolute links, resolved inside the image)."""
    real = rootfs / "usr/local/cuda-12.8"
    folder = real / "compat"
    folder.mkdir(parents=True)
    src = folder.parent / "compat.c"
    src.write_text(COMPAT_C)
    defines = [f"-DVERSION={c_string(version)}"]
    if note is not None:
        defines.append(f"-DNOTE={c_string(json.dumps(note))}")
    lib = folder / f"libcuda.so.{version}"
    _gcc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", *defines, "-o", str(lib), str(src))
    src.unlink()
    (folder / "libcuda.so.1").symlink_to(lib.name)
    (folder / "libcuda.so").symlink_to("libcuda.so.1")
    (rootfs / "etc/alternatives").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/alternatives/cuda").symlink_to("/usr/local/cuda-12.8")
    (rootfs / "usr/local/cuda").symlink_to("/etc/alternatives/cuda")
    return lib


def install_linker(rootfs: Path) -> None:
    """The host's GNU ld with the libraries it needs, in the rootfs's library folder."""
    ld = os.path.realpath(shutil.which("ld.bfd") or "/usr/bin/ld.bfd")
    shutil.copy2(ld, rootfs / "usr/bin/ld")
    out = subprocess.run(["ldd", ld], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and parts[parts.index("=>") + 1].startswith("/"):
            path = parts[parts.index("=>") + 1]
            target = rootfs / "usr/lib/x86_64-linux-gnu" / os.path.basename(path)
            if not target.exists():
                shutil.copy2(os.path.realpath(path), target)
    subprocess.run(["/sbin/ldconfig", "-r", str(rootfs)], check=True, capture_output=True)


def distroless(rootfs: Path, with_etc: bool = True) -> None:
    """Make ``rootfs`` distroless-like: the dynamic loader and libc, an /etc with passwd only
    (or none), no ld.so.conf, no ld.so.conf.d, no ld.so.cache, no shell."""
    keep = {"lib64", "lib", "proc", "sys", "dev", "tmp", "usr"}
    for entry in list(rootfs.iterdir()):
        if entry.name not in keep:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    if with_etc:
        (rootfs / "etc").mkdir()
        (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/sbin/nologin\n")

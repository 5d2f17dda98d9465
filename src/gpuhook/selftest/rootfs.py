"""The self test's root filesystem, made from the host's own files: no image, no registry.

A shell (the host's busybox, else its ``/bin/sh``), and for every dynamically linked program the
containers run (that shell, the driver's ``nvidia-smi`` and ``nvidia-cuda-mps-control``, which
gpuhook-runtime injects, and the CUDA program) the dynamic loader and the libraries it resolves
them to, at the paths the loader names, minus the driver's own libraries (gpuhook-runtime
injects those). ``/etc/ld.so.cache`` is built with the host's ldconfig. Each container gets its
own copy (:func:`clone`, hard links), so that no container sees what runc or the ldcache hook
left in another's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import TYPE_CHECKING

from gpuhook.errors import NodeInstallError
from gpuhook.model.frozen import Frozen
from gpuhook.node import bundle

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gpuhook.model.inventory import Inventory

FOLDERS = ("bin", "dev", "etc", "proc", "sys", "tmp", "run", "usr/bin", "usr/local/bin")
# Where the CUDA program is put in the rootfs.
CUDA_PROGRAM = "/usr/local/bin/gpuhook-cuda-probe"
SHELL = "/bin/sh"
ETC_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
    "etc/group": "root:x:0:\n",
    "etc/hostname": "gpuhook-selftest\n",
}


class Rootfs(Frozen):
    """A built template: its folder, what its shell is, and the libraries copied into it
    (container paths), for the report."""

    path: str
    shell: str
    libraries: tuple[str, ...]

    def describe(self) -> str:
        libs = len(self.libraries)
        more = f" and {libs} host {'library' if libs == 1 else 'libraries'}" if libs else ""
        return f"{self.shell}{more}"


def host_shell(which: str) -> tuple[str, str]:
    """The host program used as the container's /bin/sh and how to name it: busybox where the
    host has one (``which`` is its path, "" when none), else the host's own /bin/sh."""
    if which:
        linked = "static" if not _interpreter(which) else "dynamic"
        return which, f"busybox ({linked}, {which})"
    real = os.path.realpath(SHELL)
    return real, f"{SHELL} ({real})"


def build(
    dest: str,
    inventory: Inventory,
    busybox: str,
    programs: Iterable[str],
    ldconfig: str,
    files: Mapping[str, str],
) -> Rootfs:
    """Make the template under ``dest``. ``programs``: more host programs whose libraries the
    containers need (the driver binaries that get injected, the CUDA program); ``files``:
    container path -> host file, copied in (the CUDA program). Raises OSError or
    :class:`gpuhook.errors.NodeInstallError` (a program whose libraries cannot be resolved)."""
    shell, shell_name = host_shell(busybox)
    for folder in FOLDERS:
        os.makedirs(os.path.join(dest, folder), exist_ok=True)
    _copy_file(shell, dest, SHELL)
    for container_path, host in files.items():
        _copy_file(host, dest, container_path)
    for rel, text in ETC_FILES.items():
        with open(os.path.join(dest, rel), "w") as fh:
            fh.write(text)
    dynamic = [p for p in [shell, *programs] if _interpreter(p)]
    libraries: list[str] = []
    if dynamic:
        libraries = _copy_libraries(dest, inventory, dynamic)
        folders = sorted({os.path.dirname(p) for p in libraries})
        with open(os.path.join(dest, "etc/ld.so.conf"), "w") as fh:
            fh.write("".join(f"{f}\n" for f in folders))
        if os.access(ldconfig, os.X_OK):
            subprocess.run(
                [ldconfig, "-r", dest], capture_output=True, check=False, timeout=60
            )
    return Rootfs(dest, shell_name, tuple(sorted(libraries)))


def _interpreter(path: str) -> str:
    """The program's dynamic loader; "" for a static program (or a script)."""

    if not bundle.is_elf(path):
        return ""
    try:
        return bundle.interpreter_of(path)
    except NodeInstallError:
        return ""


def _copy_libraries(dest: str, inventory: Inventory, programs: list[str]) -> list[str]:
    """Copy the loaders and the libraries the programs need; their container paths."""
    driver_sonames = {lib.soname for lib in inventory.libraries}
    driver_files = {os.path.realpath(lib.path) for lib in inventory.libraries}
    driver_dirs = sorted({os.path.dirname(lib.path) for lib in inventory.libraries})
    copied: list[str] = []
    for program in programs:
        loader = _interpreter(program)
        if not os.path.lexists(os.path.join(dest, loader.lstrip("/"))):
            _copy_file(loader, dest, loader)
            copied.append(loader)
        for soname, path in resolved_libraries(loader, program, driver_dirs):
            if soname in driver_sonames or os.path.realpath(path) in driver_files:
                continue  # a driver library: gpuhook-runtime injects it
            if not os.path.lexists(os.path.join(dest, path.lstrip("/"))):
                _copy_file(path, dest, path)
                copied.append(path)
    return copied


def resolved_libraries(loader: str, program: str, extra_dirs: list[str]) -> list[tuple[str, str]]:
    """``(soname, path)`` of every library the loader's ``--list`` resolves for ``program``
    (the driver's library folders on the search path, so that a driver program's own libraries
    resolve). Raises :class:`NodeInstallError` when the loader cannot resolve them all."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LD_LIBRARY_PATH": ":".join(extra_dirs)}
    out = subprocess.run(
        [loader, "--list", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        raise NodeInstallError(f"{loader} --list {program}: {why}")
    found = []
    for line in out.stdout.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        path = rest.split(" (", 1)[0].strip()
        if arrow and path.startswith("/"):
            found.append((name, path))
    return found


def _copy_file(host: str, dest: str, container_path: str) -> None:
    """Copy the host file (its links resolved) to ``container_path`` under ``dest``."""
    target = os.path.join(dest, container_path.lstrip("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copy2(os.path.realpath(host), target)


def clone(template: str, dest: str) -> None:
    """A copy of the template whose files are hard links (a copy where links cannot be made):
    runc and the ldcache hook create and replace files in a container's rootfs, never write
    into one in place."""
    for folder, dirs, files in os.walk(template):
        rel = os.path.relpath(folder, template)
        target_dir = os.path.normpath(os.path.join(dest, rel))
        os.makedirs(target_dir, exist_ok=True)
        for name in dirs + files:
            src = os.path.join(folder, name)
            target = os.path.join(target_dir, name)
            if os.path.islink(src):
                os.symlink(os.readlink(src), target)
            elif os.path.isfile(src):
                try:
                    os.link(src, target)
                except OSError:
                    shutil.copy2(src, target)

"""Scan a driver root and a dev root: libraries, binaries, firmware, sockets, device nodes.

Libraries are found through the driver root's own ``ld.so.cache`` (parsed, never by running
``ldconfig -p`` per library). When the cache is missing or unreadable, a directory scan of the
usual library folders reads each candidate's ELF soname instead, with a warning. Paths under the
driver root are resolved as if it were ``/`` (its absolute symlinks stay inside it).
"""

from __future__ import annotations

import os
import stat

from gpuhook.fsutil import resolve_in_root
from gpuhook.inventory import catalog

# elf and ldcache (and struct under them) are imported by the scan functions only: the
# container-create path imports this module just for staleness_key().
from gpuhook.model.inventory import DeviceNode, HostFile, Library

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable


class ScanResult:
    """What a scan found; plain mutable accumulator, turned into the frozen Inventory later."""

    def __init__(self) -> None:
        self.libraries: list[Library] = []
        self.missing: dict[str, list[str]] = {}
        self.files: list[HostFile] = []
        self.control_nodes: list[DeviceNode] = []
        self.warnings: list[str] = []


def host_path(root: str, path: str) -> str:
    """``path`` (absolute, in-root) as a host path under ``root``, without resolving links."""
    return path if root in ("", "/") else os.path.abspath(root) + path


def scan(driver_root: str, dev_root: str, driver_version: str) -> ScanResult:
    from gpuhook.inventory import loaders

    result = ScanResult()
    _scan_libraries(driver_root, driver_version, result)
    result.files += loaders.scan(driver_root, result.libraries, result.warnings)
    _scan_binaries(driver_root, result)
    _scan_firmware(driver_root, driver_version, result)
    _scan_sockets(driver_root, result)
    _scan_control_nodes(dev_root, result)
    return result


# --- libraries -----------------------------------------------------------------------------------


class _Candidate:
    __slots__ = ("arch", "path", "soname")

    def __init__(self, soname: str, path: str, arch: str) -> None:
        self.soname = soname
        self.path = path  # in-root path as the cache (or scan) names it
        self.arch = arch


def _scan_libraries(root: str, driver_version: str, result: ScanResult) -> None:
    candidates = _from_ldcache(root, result)
    if candidates is None:
        candidates = _from_directories(root, result)
    found64: dict[str, Library] = {}
    found32: dict[str, Library] = {}
    for capability, names in catalog.LIBRARIES.items():
        for name in names:
            lib = _pick(root, name, capability, driver_version, candidates, want32=False)
            if lib is not None:
                found64[name] = lib
            else:
                result.missing.setdefault(capability, []).append(name)
    for name in (*catalog.LIBRARIES["compute"], *catalog.LIBRARIES["utility"]):
        lib = _pick(root, name, "compat32", driver_version, candidates, want32=True)
        if lib is not None:
            found32[name] = lib
    result.libraries = [*found64.values(), *found32.values()]
    for name in catalog.REQUIRED_LIBRARIES:
        if name not in found64:
            result.warnings.append(f"required driver library {name} not found under {root}")


def _from_ldcache(root: str, result: ScanResult) -> list[_Candidate] | None:
    from gpuhook.inventory import ldcache

    path = host_path(root, "/etc/ld.so.cache")
    try:
        entries = ldcache.read(path)
    except FileNotFoundError:
        result.warnings.append(f"{path} not found; scanned library folders instead")
        return None
    except OSError as exc:
        result.warnings.append(
            f"{path} unreadable ({exc.strerror}); scanned library folders instead"
        )
        return None
    except ldcache.LdCacheError as exc:
        result.warnings.append(
            f"{path} is not a valid ld.so.cache ({exc}); scanned library folders instead"
        )
        return None
    return [
        _Candidate(e.key, e.value, _arch_class(e.arch))
        for e in entries
        if not e.hwcap & ldcache.HWCAP_EXTENSION  # glibc-hwcaps variants: not driver files
    ]


def _arch_class(arch: str) -> str:
    return "32" if arch in ("i386", "x32", "libc6", "libc5", "elf") else "64"


def _from_directories(root: str, result: ScanResult) -> list[_Candidate]:
    from gpuhook.inventory import elf

    out: list[_Candidate] = []
    prefixes = tuple(n + "." for names in catalog.LIBRARIES.values() for n in names)
    exact = {n for names in catalog.LIBRARIES.values() for n in names}
    for folder, is32 in [(d, False) for d in catalog.LIBRARY_DIRS] + [
        (d, True) for d in catalog.LIBRARY_DIRS_32
    ]:
        host_folder = resolve_in_root(root, folder)
        try:
            names = sorted(os.listdir(host_folder))
        except FileNotFoundError:
            continue
        except OSError as exc:
            result.warnings.append(f"cannot list {host_folder}: {exc.strerror}")
            continue
        for name in names:
            if not (name in exact or name.startswith(prefixes)):
                continue
            full = os.path.join(host_folder, name)
            try:
                if not stat.S_ISREG(os.lstat(full).st_mode):
                    continue  # symlinks are names for files we see anyway
                soname = elf.read_soname(full) or name
                klass = elf.elf_class(full)
            except (OSError, elf.ElfError):
                continue
            arch = "32" if (is32 or klass == "32") else "64"
            out.append(_Candidate(soname, os.path.join(folder, name), arch))
    return out


def _pick(
    root: str,
    name: str,
    capability: str,
    driver_version: str,
    candidates: Iterable[_Candidate],
    want32: bool,
) -> Library | None:
    """The best file for one library name: matching arch, preferring the driver's version."""
    from gpuhook.inventory import elf

    best: tuple[int, Library, str] | None = None
    for cand in candidates:
        if (cand.arch == "32") != want32:
            continue
        if not (cand.soname == name or cand.soname.startswith(name + ".")):
            continue
        if not cand.path.startswith("/"):
            continue
        real = resolve_in_root(root, cand.path)
        try:
            if not stat.S_ISREG(os.stat(real).st_mode):
                continue
        except OSError:
            continue
        base = os.path.basename(real)
        version = base[len(name) + 1 :] if base.startswith(name + ".") else ""
        score = 2 if driver_version and version == driver_version else 1 if version else 0
        if best is not None and score <= best[0]:
            continue
        # A cache key is not always the soname (Debian lists dev links such as libfoo.so too):
        # the file's own DT_SONAME is what the container must find it by.
        try:
            soname = elf.read_soname(real) or cand.soname
        except (OSError, elf.ElfError):
            soname = cand.soname
        best = (score, Library(base, real, soname, version, capability), cand.path)
    if best is None:
        return None
    _score, lib, listed = best
    if not dev_link(root, name, lib.path, (os.path.dirname(listed), _in_root(root, lib.path))):
        return lib
    return lib.replace(dev_link=name)


def _in_root(root: str, host: str) -> str:
    """The in-root folder of ``host`` (a path under ``root``)."""
    prefix = "" if root in ("", "/") else os.path.abspath(root)
    return os.path.dirname(host[len(prefix) :]) or "/"


def dev_link(root: str, name: str, library: str, folders: Iterable[str]) -> bool:
    """Whether the driver installed ``name`` (``libcuda.so``) in one of ``folders`` (in-root)
    as a symbolic link that resolves to ``library`` (a host path): the development link that
    ``-lcuda`` finds."""
    try:
        want = os.stat(library)
    except OSError:
        return False
    for folder in dict.fromkeys(folders):
        try:
            if not stat.S_ISLNK(os.lstat(host_path(root, f"{folder}/{name}")).st_mode):
                continue
            st = os.stat(resolve_in_root(root, f"{folder}/{name}"))
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
            return True
    return False


# --- other files ------------------------------------------------------------------------------


def _scan_binaries(root: str, result: ScanResult) -> None:
    for name, capability in catalog.BINARIES.items():
        for folder in catalog.BINARY_DIRS:
            real = resolve_in_root(root, f"{folder}/{name}")
            try:
                st = os.stat(real)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o111:
                result.files.append(HostFile("binary", name, real, f"/usr/bin/{name}", capability))
                break


def _scan_firmware(root: str, driver_version: str, result: ScanResult) -> None:
    if not driver_version:
        return
    folder = f"{catalog.FIRMWARE_DIR}/{driver_version}"
    host_folder = resolve_in_root(root, folder)
    try:
        names = sorted(os.listdir(host_folder))
    except OSError:
        return
    for name in names:
        full = os.path.join(host_folder, name)
        if os.path.isfile(full):
            result.files.append(HostFile("firmware", name, full, f"{folder}/{name}", "compute"))


def _scan_sockets(root: str, result: ScanResult) -> None:
    seen: set[str] = set()
    for path, capability in catalog.IPC_SOCKETS.items():
        real = resolve_in_root(root, path)
        if real in seen:
            continue
        try:
            st = os.stat(real)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode):
            seen.add(real)
            name = path.split("/")[-2]
            result.files.append(HostFile("socket", name, real, path, capability))


# --- device nodes ------------------------------------------------------------------------------


def read_node(dev_root: str, path: str) -> DeviceNode | None:
    """A character device node under ``dev_root`` with its real major/minor/mode, or None."""
    host = host_path(dev_root, path)
    try:
        st = os.stat(host)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return DeviceNode(
        path, host, os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)
    )


def _scan_control_nodes(dev_root: str, result: ScanResult) -> None:
    for path in catalog.CONTROL_NODES:
        node = read_node(dev_root, path)
        if node is None:
            result.warnings.append(f"device node {host_path(dev_root, path)} not found")
        else:
            result.control_nodes.append(node)


def gpu_node(dev_root: str, minor: int) -> DeviceNode | None:
    return read_node(dev_root, f"/dev/nvidia{minor}")


def mig_cap_nodes(
    driver_root: str, dev_root: str, gpu_minor: int, gi: int, ci: int, warnings: list[str]
) -> tuple[DeviceNode, ...]:
    """The nvidia-caps nodes a MIG device needs: its GPU instance and compute instance access."""
    nodes: list[DeviceNode] = []
    for cap in (f"gpu{gpu_minor}/mig/gi{gi}/access", f"gpu{gpu_minor}/mig/gi{gi}/ci{ci}/access"):
        minor = cap_minor(driver_root, cap)
        if minor is None:
            warnings.append(f"no nvidia-caps minor for {cap} under {driver_root}/proc/driver")
            continue
        path = f"/dev/nvidia-caps/nvidia-cap{minor}"
        node = read_node(dev_root, path)
        if node is None:
            warnings.append(f"device node {host_path(dev_root, path)} not found")
            continue
        nodes.append(node)
    return tuple(nodes)


def cap_minor(driver_root: str, cap: str) -> int | None:
    """The device minor of an nvidia capability, from /proc/driver/nvidia/capabilities/<cap>,
    falling back to the driver's /proc/driver/nvidia-caps/mig-minors table."""
    text = _read_text(host_path(driver_root, f"/proc/driver/nvidia/capabilities/{cap}"))
    if text is not None:
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
                return int(value.strip())
    table = _read_text(host_path(driver_root, "/proc/driver/nvidia-caps/mig-minors"))
    if table is not None:
        key = cap.removesuffix("/access").replace("/mig/", "/")
        for line in table.splitlines():
            fields = line.split()
            if len(fields) == 2 and fields[0] in (f"{key}/access", key) and fields[1].isdigit():
                return int(fields[1])
    return None


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(65536)
    except OSError:
        return None


# --- staleness ------------------------------------------------------------------------------


def kernel_driver_version(driver_root: str) -> str:
    """The loaded kernel module's version, read without NVML ("" when unknown)."""
    text = _read_text(host_path(driver_root, "/sys/module/nvidia/version"))
    if text and text.strip():
        return text.strip()
    text = _read_text(host_path(driver_root, "/proc/driver/nvidia/version")) or ""
    for token in text.split():
        parts = token.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return token
    return ""


def staleness_key(driver_root: str, dev_root: str) -> str:
    """A cheap fingerprint that changes when the driver changes: a few stats and one small read.

    The inventory stores the key it was built under; a reader recomputes it and compares, so a
    stale inventory is detected without NVML.
    """
    parts = [
        os.path.abspath(driver_root),
        os.path.abspath(dev_root),
        kernel_driver_version(driver_root),
    ]
    for path in ("/etc/ld.so.cache",):
        try:
            st = os.stat(host_path(driver_root, path))
            parts.append(f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append("-")
    return "|".join(parts)

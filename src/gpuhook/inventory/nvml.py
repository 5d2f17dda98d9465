"""GPU facts from NVML, through pynvml. The only module of gpuhook that imports pynvml.

NVML is the single source of GPU facts (no parsing of nvidia-smi output). It is slow to
initialise on a node without nvidia-persistenced, which is why it runs only when the inventory is
refreshed, never per container.
"""

from __future__ import annotations

import os

from gpuhook.errors import InventoryError, NvmlNotFoundError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SONAME = "libnvidia-ml.so.1"


class GpuFacts:
    """One GPU as NVML reports it (device nodes are added by the driver-root scan)."""

    def __init__(
        self,
        index: int,
        uuid: str,
        minor: int,
        name: str,
        memory_total: int,
        pci_bus_id: str,
        compute_capability: str,
        mig_enabled: bool,
        migs: list[MigFacts],
        brand: int = 0,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.minor = minor
        self.name = name
        self.memory_total = memory_total
        self.pci_bus_id = pci_bus_id
        self.compute_capability = compute_capability
        self.mig_enabled = mig_enabled
        self.migs = migs
        self.brand = brand


class MigFacts:
    def __init__(
        self,
        index: int,
        uuid: str,
        gpu_instance_id: int,
        compute_instance_id: int,
        name: str,
        memory_total: int,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.gpu_instance_id = gpu_instance_id
        self.compute_instance_id = compute_instance_id
        self.name = name
        self.memory_total = memory_total


class NvmlFacts:
    def __init__(
        self, library: str, driver_version: str, cuda_driver_version: str, gpus: list[GpuFacts]
    ) -> None:
        self.library = library
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.gpus = gpus


# The oldest nvidia-ml-py gpuhook runs on: the release its Debian package is built from and tested
# with (packaging/nvidia-ml-py); the .deb's Depends and pyproject.toml ask for the same floor.
PYNVML_MINIMUM = "12.570"
_NEEDED = f"nvidia-ml-py >= {PYNVML_MINIMUM}"
_INSTALL = (
    f"pip install 'nvidia-ml-py>={PYNVML_MINIMUM}', or Debian: apt install python3-nvidia-ml-py"
)


def _import_pynvml() -> Any:
    """The ``pynvml`` module Python finds first, once its release is known to be new enough."""
    from gpuhook._site import enable_site_packages

    enable_site_packages()
    try:
        import pynvml
    except ImportError:
        raise NvmlNotFoundError(
            f"the Python NVML bindings (module pynvml) are not installed: gpuhook needs {_NEEDED} "
            f"({_INSTALL})"
        ) from None
    _check_release(str(getattr(pynvml, "__file__", "") or "pynvml"))
    return pynvml


def _check_release(module_file: str) -> None:
    found = bindings_release(module_file)
    if found is None:
        what = "come with no package metadata (no .dist-info or .egg-info beside them)"
    elif release_tuple(found[1]) < release_tuple(PYNVML_MINIMUM):
        what = f"are {found[0]} {found[1]}"
    else:
        return
    raise NvmlNotFoundError(
        f"the Python NVML bindings {module_file} {what}: gpuhook needs {_NEEDED} ({_INSTALL})"
    )


def bindings_release(module_file: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed distribution that holds ``module_file``, the
    pynvml module imported, read from the metadata in its sys.path folder (nvidia-ml-py's pynvml
    has no ``__version__``). None when no distribution there claims it."""
    from importlib.metadata import distributions
    from itertools import chain

    package = os.path.basename(module_file) == "__init__.py"
    relative = "pynvml/__init__.py" if package else "pynvml.py"
    folder = os.path.dirname(os.path.dirname(module_file) if package else module_file)
    # nvidia-ml-py's metadata first (found by its folder's name, without reading the others').
    found = chain(distributions(name="nvidia-ml-py", path=[folder]), distributions(path=[folder]))
    for dist in found:
        files = dist.files
        if files is not None:
            holds = any(f.as_posix() == relative for f in files)
        else:  # Debian's egg-info lists no files, only the top-level modules
            holds = "pynvml" in (dist.read_text("top_level.txt") or "").split()
        if holds:
            return str(dist.metadata["Name"]), dist.version
    return None


def release_tuple(version: str) -> tuple[int, ...]:
    """``"12.570.86"`` -> ``(12, 570, 86)``: the leading numeric parts (``"12.570.0rc1"`` gives
    ``(12, 570)``), for comparisons with :data:`PYNVML_MINIMUM`."""
    out: list[int] = []
    for part in version.split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def load_library(explicit: str, driver_root_candidates: list[str]) -> tuple[Any, str]:
    """Load libnvidia-ml into pynvml. Order: ``explicit`` (config nvml.library), the normal
    library search (LD_LIBRARY_PATH, ld.so.cache, default folders), then the driver root."""
    import ctypes

    pynvml = _import_pynvml()
    if pynvml.nvmlLib is not None:
        return pynvml, _loaded_path()
    tried: list[str] = []
    attempts = ([explicit] if explicit else []) + [SONAME] + driver_root_candidates
    for candidate in attempts:
        if candidate in tried:
            continue
        tried.append(candidate)
        try:
            pynvml.nvmlLib = ctypes.CDLL(candidate)
        except OSError:
            continue
        return pynvml, _loaded_path() or candidate
    searched = ", ".join(
        "the library search path (LD_LIBRARY_PATH, ld.so.cache)" if t == SONAME else t
        for t in tried
    )
    raise NvmlNotFoundError(
        f"NVML library {SONAME} not found (searched: {searched}); install the NVIDIA driver "
        "(Debian: apt install libnvidia-ml1 or the driver's package) or set nvml.library"
    )


def _loaded_path() -> str:
    """Which libnvidia-ml file this process mapped (for the inventory and `inspect node`)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) >= 6 and "libnvidia-ml.so" in fields[5]:
                    return os.path.realpath(fields[5])
    except OSError:
        pass
    return ""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _Session:
    """NVML between ``nvmlInit`` and ``nvmlShutdown``. An NVML error inside (or from init or
    shutdown) becomes an :class:`InventoryError` naming ``step``, the call being made."""

    def __init__(self, pynvml: Any) -> None:
        self.pynvml = pynvml
        self.step = "nvmlInit"

    def __enter__(self) -> _Session:
        try:
            self.pynvml.nvmlInit()
        except self.pynvml.NVMLError as exc:
            raise self.error(exc) from None
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        try:
            self.pynvml.nvmlShutdown()
        except self.pynvml.NVMLError as shutdown:
            if exc is None:
                self.step = "nvmlShutdown"
                raise self.error(shutdown) from None
        if isinstance(exc, self.pynvml.NVMLError):
            raise self.error(exc) from None

    def error(self, exc: BaseException) -> InventoryError:
        return InventoryError(f"NVML {self.step} failed: {_text(exc)}")


def query(explicit_library: str, driver_root_candidates: list[str]) -> NvmlFacts:
    """Every GPU and MIG device NVML reports, with driver and CUDA driver versions."""
    pynvml, library = load_library(explicit_library, driver_root_candidates)
    with _Session(pynvml) as nvml:
        nvml.step = "nvmlSystemGetDriverVersion"
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        nvml.step = "nvmlSystemGetCudaDriverVersion"
        cuda_int = int(pynvml.nvmlSystemGetCudaDriverVersion())
        cuda = f"{cuda_int // 1000}.{cuda_int % 1000 // 10}"
        nvml.step = "nvmlDeviceGetCount"
        gpus = [_gpu(pynvml, i) for i in range(int(pynvml.nvmlDeviceGetCount()))]
    return NvmlFacts(library, driver, cuda, gpus)


def _gpu(pynvml: Any, index: int) -> GpuFacts:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    major, minor_cc = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    try:
        mig_current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError_NotSupported:
        mig_current = 0
    migs: list[MigFacts] = []
    if mig_current:
        for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError_NotFound:
                continue  # an empty slot: MIG indices may have holes
            migs.append(
                MigFacts(
                    slot,
                    _text(pynvml.nvmlDeviceGetUUID(mh)),
                    int(pynvml.nvmlDeviceGetGpuInstanceId(mh)),
                    int(pynvml.nvmlDeviceGetComputeInstanceId(mh)),
                    _text(pynvml.nvmlDeviceGetName(mh)),
                    int(pynvml.nvmlDeviceGetMemoryInfo(mh).total),
                )
            )
    return GpuFacts(
        index,
        _text(pynvml.nvmlDeviceGetUUID(handle)),
        int(pynvml.nvmlDeviceGetMinorNumber(handle)),
        _text(pynvml.nvmlDeviceGetName(handle)),
        int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
        _text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
        f"{major}.{minor_cc}",
        bool(mig_current),
        migs,
        _brand(pynvml, handle),
    )


def _brand(pynvml: Any, handle: Any) -> int:
    """The GPU's nvmlBrandType_t; 0 (unknown) where the driver cannot say."""
    try:
        return int(pynvml.nvmlDeviceGetBrand(handle))
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return 0


# nvmlComputeMode_t
COMPUTE_MODES = {"DEFAULT": 0, "EXCLUSIVE_THREAD": 1, "PROHIBITED": 2, "EXCLUSIVE_PROCESS": 3}


def set_compute_mode(
    explicit_library: str, driver_root_candidates: list[str], uuids: list[str], mode: str
) -> None:
    """Put GPUs (by UUID) in a compute mode (``DEFAULT`` or ``EXCLUSIVE_PROCESS``); needs root.
    Raises :class:`InventoryError` naming the GPU and NVML's reason."""
    pynvml, _ = load_library(explicit_library, driver_root_candidates)
    value = COMPUTE_MODES[mode]
    with _Session(pynvml) as nvml:
        for uuid in uuids:
            nvml.step = f"nvmlDeviceGetHandleByUUID({uuid})"
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            nvml.step = f"nvmlDeviceSetComputeMode({uuid}, {mode})"
            pynvml.nvmlDeviceSetComputeMode(handle, value)


def compute_modes(
    explicit_library: str, driver_root_candidates: list[str], uuids: list[str]
) -> dict[str, str]:
    """The compute mode of each GPU (by UUID): ``DEFAULT``, ``EXCLUSIVE_PROCESS``, ..."""
    pynvml, _ = load_library(explicit_library, driver_root_candidates)
    names = {v: k for k, v in COMPUTE_MODES.items()}
    out: dict[str, str] = {}
    with _Session(pynvml) as nvml:
        for uuid in uuids:
            nvml.step = f"nvmlDeviceGetComputeMode({uuid})"
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            mode = int(pynvml.nvmlDeviceGetComputeMode(handle))
            out[uuid] = names.get(mode, str(mode))
    return out


class ProcessFacts:
    """One process NVML lists on one device (a GPU, or a MIG device by its own UUID): how it
    uses it (``compute``, ``graphics``, or ``mps`` for an MPS client), its host pid and the
    bytes of device memory it holds (0 where NVML cannot say)."""

    def __init__(self, uuid: str, kind: str, pid: int, used_memory: int) -> None:
        self.uuid = uuid
        self.kind = kind
        self.pid = pid
        self.used_memory = used_memory


_PROCESS_QUERIES = (
    ("compute", "nvmlDeviceGetComputeRunningProcesses"),
    ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
    ("mps", "nvmlDeviceGetMPSComputeRunningProcesses"),
)


def running_processes(
    explicit_library: str, driver_root_candidates: list[str], uuids: list[str]
) -> list[ProcessFacts]:
    """The processes on each device of ``uuids`` (GPU or MIG UUIDs), by NVML's compute, graphics
    and MPS client lists (a list the driver does not have is skipped). Raises
    :class:`InventoryError` naming the call that failed."""
    pynvml, _ = load_library(explicit_library, driver_root_candidates)
    skipped = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)
    out: list[ProcessFacts] = []
    with _Session(pynvml) as nvml:
        for uuid in uuids:
            nvml.step = f"nvmlDeviceGetHandleByUUID({uuid})"
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            for kind, name in _PROCESS_QUERIES:
                nvml.step = f"{name}({uuid})"
                try:
                    listed = getattr(pynvml, name)(handle)
                except skipped:
                    continue
                out.extend(
                    ProcessFacts(uuid, kind, int(p.pid), int(p.usedGpuMemory or 0)) for p in listed
                )
    return out

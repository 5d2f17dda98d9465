"""The node inventory as values: GPUs, MIG devices, device nodes, libraries, host files.

Written by ``gpuhook inventory refresh`` and read on the container-create path, where
:mod:`dataclasses` and :mod:`typing` are too expensive: plain slotted classes on
:class:`~gpuhook.model.frozen.Frozen`, each with its JSON form (``to_dict`` / ``from_dict``, which
checks types so a corrupted file surfaces as :class:`ValueError`, "stale, rebuild").
"""

from __future__ import annotations

from gpuhook.model.fields import _get, _objs, _opt, _strs
from gpuhook.model.frozen import Frozen, _init

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

# --- the node inventory ----------------------------------------------------------------------


class DeviceNode(Frozen):
    """A character device: ``path`` as the container sees it, ``host_path`` where it really is."""

    path: str
    host_path: str
    major: int
    minor: int
    mode: int = 0o666
    type: str = "c"

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "host_path": self.host_path,
            "type": self.type,
            "major": self.major,
            "minor": self.minor,
            "mode": self.mode,
        }

    @staticmethod
    def well_formed(d: Any) -> bool:
        """Whether :meth:`from_dict` accepts ``d`` for certain (a cheap check, no object built)."""
        return (
            type(d) is dict
            and type(d.get("path")) is str
            and type(d.get("host_path")) is str
            and type(d.get("major")) is int
            and type(d.get("minor")) is int
            and type(d.get("mode")) is int
            and type(d.get("type")) is str
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceNode:
        return cls(
            _get(d, "path", str),
            _get(d, "host_path", str),
            _get(d, "major", int),
            _get(d, "minor", int),
            _get(d, "mode", int),
            _get(d, "type", str),
        )


class Library(Frozen):
    """A driver library: its real host path, soname, version and capability group.

    ``dev_link``: the unversioned development name the driver installs beside it as a link to
    the soname (``libcuda.so`` -> ``libcuda.so.1``), what ``-lcuda`` finds; "" when it has none.
    """

    name: str
    path: str
    soname: str
    version: str
    capability: str
    dev_link: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "soname": self.soname,
            "version": self.version,
            "capability": self.capability,
            "dev_link": self.dev_link,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Library:
        return cls(
            _get(d, "name", str),
            _get(d, "path", str),
            _get(d, "soname", str),
            _get(d, "version", str),
            _get(d, "capability", str),
            _get(d, "dev_link", str),
        )


class HostFile(Frozen):
    """A driver file that is not a library: a binary, a firmware blob, an IPC socket, a graphics
    loader file (``loader``: EGL vendor, Vulkan ICD or implicit layer JSON), or a library that a
    loader file names by an absolute path (``loader-library``: mounted at that path).

    ``path`` is the host path; ``container_path`` where the file is mounted inside a container.
    """

    kind: str  # "binary" | "firmware" | "socket" | "loader" | "loader-library"
    name: str
    path: str
    container_path: str
    capability: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "path": self.path,
            "container_path": self.container_path,
            "capability": self.capability,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HostFile:
        return cls(
            _get(d, "kind", str),
            _get(d, "name", str),
            _get(d, "path", str),
            _get(d, "container_path", str),
            _get(d, "capability", str),
        )


class MigDevice(Frozen):
    """A MIG device of a MIG-enabled GPU, with the nvidia-caps nodes a container needs for it."""

    index: int
    uuid: str
    gpu_index: int
    gpu_instance_id: int
    compute_instance_id: int
    name: str
    memory_total: int
    caps: tuple[DeviceNode, ...] = ()

    @property
    def display_id(self) -> str:
        """The ``<gpu>:<mig>`` form NVIDIA_VISIBLE_DEVICES accepts."""
        return f"{self.gpu_index}:{self.index}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "gpu_index": self.gpu_index,
            "gpu_instance_id": self.gpu_instance_id,
            "compute_instance_id": self.compute_instance_id,
            "name": self.name,
            "memory_total": self.memory_total,
            "caps": [c.to_dict() for c in self.caps],
        }

    @staticmethod
    def well_formed(d: Any) -> bool:
        """Whether :meth:`from_dict` accepts ``d`` for certain (a cheap check, no object built)."""
        if type(d) is not dict:
            return False
        caps = d.get("caps")
        return (
            type(d.get("index")) is int
            and type(d.get("uuid")) is str
            and type(d.get("gpu_index")) is int
            and type(d.get("gpu_instance_id")) is int
            and type(d.get("compute_instance_id")) is int
            and type(d.get("name")) is str
            and type(d.get("memory_total")) is int
            and type(caps) is list
            and all(DeviceNode.well_formed(c) for c in caps)
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MigDevice:
        return cls(
            _get(d, "index", int),
            _get(d, "uuid", str),
            _get(d, "gpu_index", int),
            _get(d, "gpu_instance_id", int),
            _get(d, "compute_instance_id", int),
            _get(d, "name", str),
            _get(d, "memory_total", int),
            tuple(DeviceNode.from_dict(c) for c in _objs(d, "caps")),
        )


class _LazyMigs(Frozen):
    """Base of :class:`Gpu`: a Gpu read from the inventory file keeps its MIG devices in their
    JSON form (checked, not yet built) until something reads ``mig_devices``, and
    :meth:`Gpu.mig_by_uuid` builds only the device it finds. On a node with dozens of MIG devices
    this keeps the container-create path from building objects it never looks at. Not a field:
    equality, hashing, repr and ``replace`` see ``mig_devices`` (reading it builds them all)."""

    __slots__ = ("_mig_json",)
    _mig_json: list[dict[str, Any]] | None


class Gpu(_LazyMigs):
    """A physical GPU as NVML reports it, plus its device node read from ``dev_root``.

    ``brand``: NVML's brand type (``nvmlDeviceGetBrand``: 2 Tesla, 5 GeForce, 14 NVIDIA...),
    which tells data center GPUs (CUDA forward compatibility) from consumer ones; 0 unknown."""

    index: int
    uuid: str
    minor: int
    name: str
    memory_total: int
    pci_bus_id: str
    compute_capability: str
    mig_enabled: bool
    mig_devices: tuple[MigDevice, ...]
    node: DeviceNode | None
    brand: int

    def __init__(
        self,
        index: int,
        uuid: str,
        minor: int,
        name: str,
        memory_total: int,
        pci_bus_id: str,
        compute_capability: str,
        mig_enabled: bool = False,
        mig_devices: tuple[MigDevice, ...] = (),
        node: DeviceNode | None = None,
        brand: int = 0,
    ) -> None:
        _init(
            self,
            brand=brand,
            index=index,
            uuid=uuid,
            minor=minor,
            name=name,
            memory_total=memory_total,
            pci_bus_id=pci_bus_id,
            compute_capability=compute_capability,
            mig_enabled=mig_enabled,
            mig_devices=tuple(mig_devices),
            node=node,
            _mig_json=None,
        )

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            # Reached only when a slot is unset: mig_devices of a Gpu whose MIG devices are
            # still in JSON form. Build them all, once.
            raw = object.__getattribute__(self, "_mig_json") if name == "mig_devices" else None
            if raw is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            migs = tuple(MigDevice.from_dict(m) for m in raw)
            object.__setattr__(self, "mig_devices", migs)
            object.__setattr__(self, "_mig_json", None)
            return migs

    def mig_by_uuid(self, uuid: str) -> MigDevice | None:
        """This GPU's MIG device with ``uuid`` (case-insensitive), or None; builds only that
        one while the GPU's MIG devices are still in JSON form."""
        wanted = uuid.lower()
        raw = self._mig_json
        if raw is not None:
            for m in raw:
                if m["uuid"].lower() == wanted:
                    return MigDevice.from_dict(m)
            return None
        return next((m for m in self.mig_devices if m.uuid.lower() == wanted), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "minor": self.minor,
            "name": self.name,
            "memory_total": self.memory_total,
            "pci_bus_id": self.pci_bus_id,
            "compute_capability": self.compute_capability,
            "mig_enabled": self.mig_enabled,
            "mig_devices": [m.to_dict() for m in self.mig_devices],
            "node": self.node.to_dict() if self.node else None,
            "brand": self.brand,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Gpu:
        """The GPU; its MIG devices stay in JSON form when every one is well formed (a damaged
        one raises ValueError here, as an eager read would)."""
        node = _opt(d, "node", dict)
        migs = _objs(d, "mig_devices")
        lazy = all(MigDevice.well_formed(m) for m in migs)
        gpu = cls(
            _get(d, "index", int),
            _get(d, "uuid", str),
            _get(d, "minor", int),
            _get(d, "name", str),
            _get(d, "memory_total", int),
            _get(d, "pci_bus_id", str),
            _get(d, "compute_capability", str),
            _get(d, "mig_enabled", bool),
            () if lazy else tuple(MigDevice.from_dict(m) for m in migs),
            DeviceNode.from_dict(node) if node is not None else None,
            _get(d, "brand", int),
        )
        if lazy and migs:
            object.__delattr__(gpu, "mig_devices")
            object.__setattr__(gpu, "_mig_json", migs)
        return gpu


INVENTORY_SCHEMA_VERSION = 2  # 2: libraries' dev_link, GPUs' brand, graphics loader files


class Inventory(Frozen):
    """Everything the container-create path needs to know about the node, read from one file."""

    generated_at: float
    driver_root: str
    dev_root: str
    driver_version: str
    cuda_driver_version: str
    nvml_library: str
    gpus: tuple[Gpu, ...]
    control_nodes: tuple[DeviceNode, ...]
    libraries: tuple[Library, ...]
    files: tuple[HostFile, ...]
    missing_libraries: tuple[tuple[str, tuple[str, ...]], ...]
    staleness_key: str
    warnings: tuple[str, ...]
    # The driver files prepared on the host for capability sets (gpuhook.inventory.prepared):
    # (the sorted capabilities joined by ",", the prepared folder).
    prepared: tuple[tuple[str, str], ...]

    def __init__(
        self,
        generated_at: float,
        driver_root: str,
        dev_root: str,
        driver_version: str,
        cuda_driver_version: str,
        nvml_library: str,
        gpus: Iterable[Gpu],
        control_nodes: Iterable[DeviceNode],
        libraries: Iterable[Library],
        files: Iterable[HostFile],
        missing_libraries: Iterable[tuple[str, tuple[str, ...]]],
        staleness_key: str,
        warnings: Iterable[str] = (),
        prepared: Iterable[tuple[str, str]] = (),
    ) -> None:
        _init(
            self,
            generated_at=generated_at,
            driver_root=driver_root,
            dev_root=dev_root,
            driver_version=driver_version,
            cuda_driver_version=cuda_driver_version,
            nvml_library=nvml_library,
            gpus=tuple(gpus),
            control_nodes=tuple(control_nodes),
            libraries=tuple(libraries),
            files=tuple(files),
            missing_libraries=tuple((c, tuple(n)) for c, n in missing_libraries),
            staleness_key=staleness_key,
            warnings=tuple(warnings),
            prepared=tuple((str(k), str(v)) for k, v in prepared),
        )

    def prepared_folder(self, caps: Iterable[str]) -> str:
        """The prepared folder of the capability set ``caps`` ("" when there is none)."""
        key = ",".join(sorted(caps))
        return next((folder for k, folder in self.prepared if k == key), "")

    def files_of(self, kind: str) -> tuple[HostFile, ...]:
        return tuple(f for f in self.files if f.kind == kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": INVENTORY_SCHEMA_VERSION,
            "generated_at": self.generated_at,
            "driver_root": self.driver_root,
            "dev_root": self.dev_root,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "nvml_library": self.nvml_library,
            "gpus": [g.to_dict() for g in self.gpus],
            "control_nodes": [n.to_dict() for n in self.control_nodes],
            "libraries": [lib.to_dict() for lib in self.libraries],
            "files": [f.to_dict() for f in self.files],
            "missing_libraries": {cap: list(names) for cap, names in self.missing_libraries},
            "staleness_key": self.staleness_key,
            "warnings": list(self.warnings),
            "prepared": dict(self.prepared),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Inventory:
        if not isinstance(d, dict):
            raise ValueError("inventory is not a JSON object")
        if d.get("schema_version") != INVENTORY_SCHEMA_VERSION:
            raise ValueError(
                f"inventory schema version {d.get('schema_version')!r} is not supported"
            )
        missing = _opt(d, "missing_libraries", dict, {})
        return cls(
            _get(d, "generated_at", (int, float)),
            _get(d, "driver_root", str),
            _get(d, "dev_root", str),
            _get(d, "driver_version", str),
            _get(d, "cuda_driver_version", str),
            _get(d, "nvml_library", str),
            [Gpu.from_dict(g) for g in _objs(d, "gpus")],
            [DeviceNode.from_dict(n) for n in _objs(d, "control_nodes")],
            [Library.from_dict(lib) for lib in _objs(d, "libraries")],
            [HostFile.from_dict(f) for f in _objs(d, "files")],
            [(str(cap), tuple(str(n) for n in names)) for cap, names in missing.items()],
            _get(d, "staleness_key", str),
            _strs(d, "warnings"),
            [(str(k), str(v)) for k, v in _opt(d, "prepared", dict, {}).items()],
        )

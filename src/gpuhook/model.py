"""Frozen value objects shared by every step of the pipeline.

These are imported on the container-create hot path, where :mod:`dataclasses` (~17 ms) and
:mod:`typing` (~11 ms) are too expensive to import. So the classes are plain slotted classes with
explicit, typed constructors on a tiny frozen base. Each knows its JSON form (``to_dict`` /
``from_dict``); ``from_dict`` checks types so a corrupted file surfaces as :class:`ValueError`
(which the store maps to "stale, rebuild") rather than as an attribute error deep in the pipeline.
"""

from __future__ import annotations

# The frozen base lives in gpuhook._frozen (the shim's fast path imports it alone).
from gpuhook._frozen import Frozen as Frozen  # noqa: PLC0414 - explicit re-export (mypy)
from gpuhook._frozen import _init as _init  # noqa: PLC0414

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

# --- typed readers for from_dict --------------------------------------------------------------


def _get(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    try:
        value = d[key]
    except (KeyError, TypeError):
        raise ValueError(f"missing field {key!r}") from None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _opt(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    if d.get(key) is None:
        return default
    return _get(d, key, kind)


def _strs(d: Mapping[str, Any], key: str) -> tuple[str, ...]:
    values = _opt(d, key, list, [])
    if not all(isinstance(v, str) for v in values):
        raise ValueError(f"field {key!r} must hold strings")
    return tuple(values)


def _objs(d: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    values = _opt(d, key, list, [])
    if not all(isinstance(v, dict) for v in values):
        raise ValueError(f"field {key!r} must hold objects")
    return values  # type: ignore[no-any-return]


# --- the node inventory ----------------------------------------------------------------------


class DeviceNode(Frozen):
    """A character device: ``path`` as the container sees it, ``host_path`` where it really is."""

    __slots__ = ("host_path", "major", "minor", "mode", "path", "type")
    path: str
    host_path: str
    major: int
    minor: int
    mode: int
    type: str

    def __init__(
        self, path: str, host_path: str, major: int, minor: int, mode: int = 0o666, type: str = "c"
    ) -> None:
        _init(self, path=path, host_path=host_path, major=major, minor=minor, mode=mode, type=type)

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
    """A driver library: its real host path, soname, version and capability group."""

    __slots__ = ("capability", "name", "path", "soname", "version")
    name: str
    path: str
    soname: str
    version: str
    capability: str

    def __init__(self, name: str, path: str, soname: str, version: str, capability: str) -> None:
        _init(self, name=name, path=path, soname=soname, version=version, capability=capability)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "soname": self.soname,
            "version": self.version,
            "capability": self.capability,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Library:
        return cls(
            _get(d, "name", str),
            _get(d, "path", str),
            _get(d, "soname", str),
            _get(d, "version", str),
            _get(d, "capability", str),
        )


class HostFile(Frozen):
    """A driver file that is not a library: a binary, a firmware blob or an IPC socket.

    ``path`` is the host path; ``container_path`` where the file is mounted inside a container.
    """

    __slots__ = ("capability", "container_path", "kind", "name", "path")
    kind: str  # "binary" | "firmware" | "socket"
    name: str
    path: str
    container_path: str
    capability: str

    def __init__(
        self, kind: str, name: str, path: str, container_path: str, capability: str
    ) -> None:
        _init(
            self,
            kind=kind,
            name=name,
            path=path,
            container_path=container_path,
            capability=capability,
        )

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

    __slots__ = (
        "caps",
        "compute_instance_id",
        "gpu_index",
        "gpu_instance_id",
        "index",
        "memory_total",
        "name",
        "uuid",
    )
    index: int
    uuid: str
    gpu_index: int
    gpu_instance_id: int
    compute_instance_id: int
    name: str
    memory_total: int
    caps: tuple[DeviceNode, ...]

    def __init__(
        self,
        index: int,
        uuid: str,
        gpu_index: int,
        gpu_instance_id: int,
        compute_instance_id: int,
        name: str,
        memory_total: int,
        caps: tuple[DeviceNode, ...] = (),
    ) -> None:
        _init(
            self,
            index=index,
            uuid=uuid,
            gpu_index=gpu_index,
            gpu_instance_id=gpu_instance_id,
            compute_instance_id=compute_instance_id,
            name=name,
            memory_total=memory_total,
            caps=tuple(caps),
        )

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
    """A physical GPU as NVML reports it, plus its device node read from ``dev_root``."""

    __slots__ = (
        "compute_capability",
        "index",
        "memory_total",
        "mig_devices",
        "mig_enabled",
        "minor",
        "name",
        "node",
        "pci_bus_id",
        "uuid",
    )
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
    ) -> None:
        _init(
            self,
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
        )
        if lazy and migs:
            object.__delattr__(gpu, "mig_devices")
            object.__setattr__(gpu, "_mig_json", migs)
        return gpu


INVENTORY_SCHEMA_VERSION = 1


class Inventory(Frozen):
    """Everything the container-create path needs to know about the node, read from one file."""

    __slots__ = (
        "control_nodes",
        "cuda_driver_version",
        "dev_root",
        "driver_root",
        "driver_version",
        "files",
        "generated_at",
        "gpus",
        "libraries",
        "missing_libraries",
        "nvml_library",
        "staleness_key",
        "warnings",
    )
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
        )

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
        )


# --- what a container asks for ------------------------------------------------------------------

# Request channels, in priority order (DESIGN.md, trust model).
CHANNEL_CDI = "cdi-annotation"
CHANNEL_MOUNT = "mount-marker"
CHANNEL_DOCKER = "docker-gpus"
CHANNEL_ENV = "env"


class KubeIdentity(Frozen):
    """Who a Kubernetes container is, from the CRI annotations containerd or CRI-O set."""

    __slots__ = ("container_name", "container_type", "namespace", "pod_name", "pod_uid")
    pod_uid: str
    namespace: str
    pod_name: str
    container_name: str
    container_type: str  # "container" | "sandbox"

    def __init__(
        self, pod_uid: str, namespace: str, pod_name: str, container_name: str, container_type: str
    ) -> None:
        _init(
            self,
            pod_uid=pod_uid,
            namespace=namespace,
            pod_name=pod_name,
            container_name=container_name,
            container_type=container_type,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod_uid": self.pod_uid,
            "namespace": self.namespace,
            "pod_name": self.pod_name,
            "container_name": self.container_name,
            "container_type": self.container_type,
        }


class ChannelRequest(Frozen):
    """One ask for devices through one channel.

    ``ids`` are the raw device ids as written (``"all"`` and ``"none"`` included); ``source``
    says exactly where (the annotation key, the mount destination, the env variable).
    """

    __slots__ = ("channel", "ids", "source", "value")
    channel: str
    source: str
    value: str
    ids: tuple[str, ...]

    def __init__(self, channel: str, source: str, value: str, ids: tuple[str, ...]) -> None:
        _init(self, channel=channel, source=source, value=value, ids=tuple(ids))

    def to_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "source": self.source,
            "value": self.value,
            "ids": list(self.ids),
        }


class Request(Frozen):
    """What a container's spec asks for, and through which channels. Built by :mod:`request`."""

    __slots__ = (
        "annotations",
        "channels",
        "driver_capabilities",
        "kubernetes",
        "privileged",
        "problems",
    )
    channels: tuple[ChannelRequest, ...]
    driver_capabilities: str | None
    privileged: bool
    kubernetes: KubeIdentity | None
    annotations: tuple[tuple[str, str], ...]  # gpuhook.io/* annotations, for later steps
    problems: tuple[str, ...]  # malformed parts of the request, one line each

    def __init__(
        self,
        channels: tuple[ChannelRequest, ...] = (),
        driver_capabilities: str | None = None,
        privileged: bool = False,
        kubernetes: KubeIdentity | None = None,
        annotations: tuple[tuple[str, str], ...] = (),
        problems: tuple[str, ...] = (),
    ) -> None:
        _init(
            self,
            channels=tuple(channels),
            driver_capabilities=driver_capabilities,
            privileged=privileged,
            kubernetes=kubernetes,
            annotations=tuple(annotations),
            problems=tuple(problems),
        )

    def annotation(self, key: str) -> str | None:
        for k, v in self.annotations:
            if k == key:
                return v
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "channels": [c.to_dict() for c in self.channels],
            "driver_capabilities": self.driver_capabilities,
            "privileged": self.privileged,
            "kubernetes": self.kubernetes.to_dict() if self.kubernetes else None,
            "annotations": dict(self.annotations),
            "problems": list(self.problems),
        }


# --- what gpuhook decides -------------------------------------------------------------------------

KIND_GPU = "gpu"
KIND_MIG = "mig"


class DeviceRef(Frozen):
    """A device resolved against the inventory: a whole GPU or one MIG device."""

    __slots__ = ("gpu_index", "kind", "mig_index", "uuid")
    kind: str
    uuid: str
    gpu_index: int
    mig_index: int | None

    def __init__(self, kind: str, uuid: str, gpu_index: int, mig_index: int | None = None) -> None:
        _init(self, kind=kind, uuid=uuid, gpu_index=gpu_index, mig_index=mig_index)

    @property
    def display_id(self) -> str:
        return (
            str(self.gpu_index) if self.mig_index is None else f"{self.gpu_index}:{self.mig_index}"
        )

    def sort_key(self) -> tuple[int, int]:
        return (self.gpu_index, -1 if self.mig_index is None else self.mig_index)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.display_id, "uuid": self.uuid}


VERDICT_GRANTED = "granted"
VERDICT_REFUSED = "refused"
VERDICT_IGNORED = "ignored"
VERDICT_SUPERSEDED = "superseded"


class Reason(Frozen):
    """One line of the decision's explanation: which channel, which value, what and why."""

    __slots__ = ("channel", "value", "verdict", "why")
    channel: str
    value: str
    verdict: str
    why: str

    def __init__(self, channel: str, value: str, verdict: str, why: str) -> None:
        _init(self, channel=channel, value=value, verdict=verdict, why=why)

    def to_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "value": self.value,
            "verdict": self.verdict,
            "why": self.why,
        }


class Decision(Frozen):
    """Which devices a container gets, and why.

    ``gpu_container`` is False when the spec carried no request at all (the container is left
    alone). ``driver_only`` is the ``none`` request: driver files, no devices. ``refused`` is True
    when a request existed but nothing of it was trusted; the shim then sets
    ``NVIDIA_VISIBLE_DEVICES=void`` so that no other NVIDIA component acts on it.
    """

    __slots__ = (
        "capabilities",
        "channel",
        "devices",
        "driver_only",
        "gpu_container",
        "reasons",
        "refused",
    )
    gpu_container: bool
    devices: tuple[DeviceRef, ...]
    driver_only: bool
    capabilities: tuple[str, ...]
    channel: str | None
    reasons: tuple[Reason, ...]
    refused: bool

    def __init__(
        self,
        gpu_container: bool,
        devices: tuple[DeviceRef, ...] = (),
        driver_only: bool = False,
        capabilities: tuple[str, ...] = (),
        channel: str | None = None,
        reasons: tuple[Reason, ...] = (),
        refused: bool = False,
    ) -> None:
        _init(
            self,
            gpu_container=gpu_container,
            devices=tuple(devices),
            driver_only=driver_only,
            capabilities=tuple(capabilities),
            channel=channel,
            reasons=tuple(reasons),
            refused=refused,
        )

    @property
    def injects(self) -> bool:
        """True when the container gets driver files (devices or ``none``)."""
        return bool(self.devices) or self.driver_only

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_container": self.gpu_container,
            "devices": [d.to_dict() for d in self.devices],
            "driver_only": self.driver_only,
            "capabilities": list(self.capabilities),
            "channel": self.channel,
            "refused": self.refused,
            "reasons": [r.to_dict() for r in self.reasons],
        }


# --- what gets injected: CDI containerEdits shape ----------------------------------------------


class Mount(Frozen):
    __slots__ = ("container_path", "host_path", "options", "type")
    host_path: str
    container_path: str
    type: str
    options: tuple[str, ...]

    def __init__(
        self,
        host_path: str,
        container_path: str,
        type: str = "bind",
        options: tuple[str, ...] = (),
    ) -> None:
        _init(
            self,
            host_path=host_path,
            container_path=container_path,
            type=type,
            options=tuple(options),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "hostPath": self.host_path,
            "containerPath": self.container_path,
            "type": self.type,
            "options": list(self.options),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Mount:
        return cls(
            _get(d, "hostPath", str),
            _get(d, "containerPath", str),
            _opt(d, "type", str, "bind"),
            _strs(d, "options"),
        )


class Hook(Frozen):
    __slots__ = ("args", "env", "hook_name", "path", "timeout")
    hook_name: str
    path: str
    args: tuple[str, ...]
    env: tuple[str, ...]
    timeout: int | None

    def __init__(
        self,
        hook_name: str,
        path: str,
        args: tuple[str, ...] = (),
        env: tuple[str, ...] = (),
        timeout: int | None = None,
    ) -> None:
        _init(
            self, hook_name=hook_name, path=path, args=tuple(args), env=tuple(env), timeout=timeout
        )

    def to_oci(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "args": list(self.args), "env": list(self.env)}
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"hookName": self.hook_name, **self.to_oci()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Hook:
        return cls(
            _get(d, "hookName", str),
            _get(d, "path", str),
            _strs(d, "args"),
            _strs(d, "env"),
            _opt(d, "timeout", int),
        )


class ContainerEdits(Frozen):
    """The edits to make to a spec, in the shape of CDI's ``containerEdits``.

    gpuhook's two additions: ``remove_hooks``, basenames of prestart hook executables to drop
    (docker's ``nvidia-container-runtime-hook`` for ``--gpus``, whose work gpuhook has done), and
    ``replace_mounts``, destinations whose existing spec mounts give way to gpuhook's mount there
    (the container's own ``/dev/shm`` when the MPS shm is mounted instead).
    """

    __slots__ = ("device_nodes", "env", "hooks", "mounts", "remove_hooks", "replace_mounts")
    env: tuple[str, ...]
    device_nodes: tuple[DeviceNode, ...]
    mounts: tuple[Mount, ...]
    hooks: tuple[Hook, ...]
    remove_hooks: tuple[str, ...]
    replace_mounts: tuple[str, ...]

    def __init__(
        self,
        env: tuple[str, ...] = (),
        device_nodes: tuple[DeviceNode, ...] = (),
        mounts: tuple[Mount, ...] = (),
        hooks: tuple[Hook, ...] = (),
        remove_hooks: tuple[str, ...] = (),
        replace_mounts: tuple[str, ...] = (),
    ) -> None:
        _init(
            self,
            env=tuple(env),
            device_nodes=tuple(device_nodes),
            mounts=tuple(mounts),
            hooks=tuple(hooks),
            remove_hooks=tuple(remove_hooks),
            replace_mounts=tuple(replace_mounts),
        )

    def is_empty(self) -> bool:
        return not (
            self.env
            or self.device_nodes
            or self.mounts
            or self.hooks
            or self.remove_hooks
            or self.replace_mounts
        )

    def to_dict(self) -> dict[str, Any]:
        """The CDI ``containerEdits`` JSON form (plus ``removeHooks``/``replaceMounts`` when
        non-empty)."""
        out: dict[str, Any] = {
            "env": list(self.env),
            "deviceNodes": [
                {
                    "path": n.path,
                    "hostPath": n.host_path,
                    "type": n.type,
                    "major": n.major,
                    "minor": n.minor,
                    "fileMode": n.mode,
                    "permissions": "rwm",
                }
                for n in self.device_nodes
            ],
            "mounts": [m.to_dict() for m in self.mounts],
            "hooks": [h.to_dict() for h in self.hooks],
        }
        if self.remove_hooks:
            out["removeHooks"] = list(self.remove_hooks)
        if self.replace_mounts:
            out["replaceMounts"] = list(self.replace_mounts)
        return out

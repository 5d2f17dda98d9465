"""Device ids -> devices of this node (pure).

Accepted forms, as NVIDIA's runtime accepts them: a GPU index (``1``), a GPU UUID
(``GPU-...``), a MIG UUID (``MIG-...``, or the older ``MIG-GPU-<uuid>/<gi>/<ci>``), a MIG
device as ``<gpu index>:<mig index>``, ``all``, and any of these as a fully qualified CDI name
``nvidia.com/gpu=<id>``. Kubelet replica ids of shared GPUs (``GPU-...::3``) name their GPU.
UUIDs compare case-insensitively.
"""

from __future__ import annotations

from gpuhook.model.decision import KIND_GPU, KIND_MIG, DeviceRef

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuhook.model.inventory import Inventory

CDI_PREFIXES = ("nvidia.com/gpu=", "nvidia.com/mig=")


class UnknownDevice(Exception):
    """An id that names no device of this node; ``str()`` says why in one line."""


def gpu_ref(gpu_index: int, uuid: str) -> DeviceRef:
    return DeviceRef(KIND_GPU, uuid, gpu_index)


def strip_cdi(device_id: str) -> str | None:
    """The device name of a fully-qualified CDI name, None for another vendor/class, and the id
    itself when it is not a CDI name."""
    if "=" not in device_id:
        return device_id
    for prefix in CDI_PREFIXES:
        if device_id.startswith(prefix):
            return device_id[len(prefix) :]
    return None


def is_uuid(device_id: str) -> bool:
    """Whether an id has the form of a GPU or MIG UUID (``GPU-...``, ``MIG-...``): the device
    ids NVIDIA's device plugin gives the kubelet (deviceIDStrategy uuid, its default)."""
    return device_id[:4].lower() in ("gpu-", "mig-")


def is_device_id(device_id: str) -> bool:
    """Whether an id has the form of a device plugin's device id: a GPU or MIG UUID
    (deviceIDStrategy ``uuid``), a GPU index or a MIG device's ``<gpu index>:<mig index>``
    (deviceIDStrategy ``index``; NVIDIA's plugin numbers a GPU's MIG devices as NVML does)."""
    if is_uuid(device_id) or _is_index(device_id):
        return True
    gpu, colon, mig = device_id.partition(":")
    return bool(colon) and _is_index(gpu) and _is_index(mig)


def resolve_one(device_id: str, inventory: Inventory) -> tuple[DeviceRef, ...]:
    """Resolve one id; ``all`` gives every GPU. Raises :class:`UnknownDevice`."""
    name = strip_cdi(device_id)
    if name is None:
        raise UnknownDevice(f"{device_id!r} is not an NVIDIA GPU (expected nvidia.com/gpu=<id>)")
    name = name.partition("::")[0]  # kubelet replica suffix of shared GPUs
    if name.lower() == "all":
        return tuple(gpu_ref(g.index, g.uuid) for g in inventory.gpus)
    if _is_index(name):
        index = int(name)
        for gpu in inventory.gpus:
            if gpu.index == index:
                return (gpu_ref(gpu.index, gpu.uuid),)
        raise UnknownDevice(f"unknown GPU index {name} (this node has {_describe(inventory)})")
    lowered = name.lower()
    if lowered.startswith("gpu-"):
        for gpu in inventory.gpus:
            if gpu.uuid.lower() == lowered:
                return (gpu_ref(gpu.index, gpu.uuid),)
        raise UnknownDevice(f"unknown GPU UUID {name} (this node has {_describe(inventory)})")
    if lowered.startswith("mig-gpu-") and lowered.count("/") == 2:
        parent, gi, ci = lowered[4:].split("/")
        for gpu in inventory.gpus:
            if gpu.uuid.lower() == parent:
                for mig in gpu.mig_devices:
                    if str(mig.gpu_instance_id) == gi and str(mig.compute_instance_id) == ci:
                        return (DeviceRef(KIND_MIG, mig.uuid, gpu.index, mig.index),)
        raise UnknownDevice(f"unknown MIG device {name}")
    if lowered.startswith("mig-"):
        for gpu in inventory.gpus:
            found = gpu.mig_by_uuid(lowered)  # builds only the MIG device it finds
            if found is not None:
                return (DeviceRef(KIND_MIG, found.uuid, gpu.index, found.index),)
        raise UnknownDevice(f"unknown MIG UUID {name}")
    gpu_part, colon, mig_part = name.partition(":")
    if colon and _is_index(gpu_part) and _is_index(mig_part):
        for gpu in inventory.gpus:
            if gpu.index == int(gpu_part):
                if not gpu.mig_enabled:
                    raise UnknownDevice(
                        f"GPU {gpu_part} is not in MIG mode, so {name} names no MIG device"
                    )
                for mig in gpu.mig_devices:
                    if mig.index == int(mig_part):
                        return (DeviceRef(KIND_MIG, mig.uuid, gpu.index, mig.index),)
                raise UnknownDevice(f"GPU {gpu_part} has no MIG device {mig_part}")
        raise UnknownDevice(
            f"unknown GPU index {gpu_part} in {name} (this node has {_describe(inventory)})"
        )
    raise UnknownDevice(f"unknown device id {_clip(device_id)!r}")


def resolve(ids: tuple[str, ...], inventory: Inventory) -> tuple[tuple[DeviceRef, ...], list[str]]:
    """Resolve ids; returns (devices sorted and deduplicated, one message per unknown id)."""
    found: dict[str, DeviceRef] = {}
    errors: list[str] = []
    for device_id in ids:
        try:
            for ref in resolve_one(device_id, inventory):
                found.setdefault(ref.uuid, ref)
        except UnknownDevice as exc:
            errors.append(str(exc))
    return tuple(sorted(found.values(), key=lambda r: r.sort_key())), errors


def _is_index(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` also accepts ``'²'`` and other scripts' digits), and
    short enough for ``int()`` (which refuses more than 4300 digits)."""
    return 0 < len(text) <= 9 and text.isascii() and text.isdigit()


def _describe(inventory: Inventory) -> str:
    if not inventory.gpus:
        return "no GPUs"
    indices = sorted(g.index for g in inventory.gpus)
    if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 1:
        return f"GPUs {indices[0]}-{indices[-1]}"
    return "GPU " + ", ".join(str(i) for i in indices)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."

"""The kubelet's device-manager checkpoint (I/O, at the edge).

``<kubelet_dir>/device-plugins/kubelet_internal_checkpoint`` (``policy.kubernetes.kubelet_dir``,
default ``/var/lib/kubelet``, or ``policy.kubernetes.checkpoint``) records, per pod UID and
container name, the device ids each device plugin allocated. Two layouts exist: DeviceIDs as a
list (before Kubernetes 1.20) and as a map from NUMA node to list (since). The file is written by
the kubelet (root) only; its checksum is the kubelet's own spew-based hash, which gpuhook does
not recompute. Every resource of the container is read (the record shows them all); which of
them are GPUs is the policy's to say (``policy.kubernetes.gpu_resources``).
"""

from __future__ import annotations

from gpuhook import _fastjson
from gpuhook.errors import CheckpointError
from gpuhook.model.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NVIDIA_RESOURCE_PREFIX = "nvidia.com/"
MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024


class Allocation(Frozen):
    """Device ids allocated to one container, per device-plugin resource."""

    pod_uid: str
    container_name: str
    resources: tuple[tuple[str, tuple[str, ...]], ...]
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod_uid": self.pod_uid,
            "container_name": self.container_name,
            "resources": {r: list(ids) for r, ids in self.resources},
            "source": self.source,
        }


def read_allocation(path: str, pod_uid: str, container_name: str) -> Allocation:
    """What the checkpoint at ``path`` allocated to one container. Raises CheckpointError."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CHECKPOINT_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointError(f"kubelet checkpoint {path} not found") from None
    except OSError as exc:
        raise CheckpointError(f"kubelet checkpoint {path} unreadable: {exc.strerror}") from None
    if len(raw) > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"kubelet checkpoint {path} is larger than 64 MiB")
    return allocation_from_bytes(raw, path, pod_uid, container_name)


def allocation_from_bytes(raw: bytes, path: str, pod_uid: str, container_name: str) -> Allocation:
    try:
        doc = _fastjson.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"kubelet checkpoint {path} is not valid JSON ({exc})") from None
    entries = _entries(doc, path)
    resources: dict[str, list[str]] = {}
    for entry in entries:
        if entry.get("PodUID") != pod_uid or entry.get("ContainerName") != container_name:
            continue
        resource = entry.get("ResourceName")
        if not isinstance(resource, str):
            continue
        ids = resources.setdefault(resource, [])
        for device in _device_ids(entry.get("DeviceIDs"), path):
            if device not in ids:
                ids.append(device)
    return Allocation(
        pod_uid,
        container_name,
        tuple((r, tuple(ids)) for r, ids in sorted(resources.items())),
        path,
    )


def _entries(doc: Any, path: str) -> list[dict[str, Any]]:
    data = doc.get("Data") if isinstance(doc, dict) else None
    if not isinstance(data, dict):
        raise CheckpointError(f"kubelet checkpoint {path} is malformed: no Data object")
    entries = data.get("PodDeviceEntries")
    if entries is None:
        return []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise CheckpointError(
            f"kubelet checkpoint {path} is malformed: PodDeviceEntries is not a list of objects"
        )
    return entries


def _device_ids(value: Any, path: str) -> list[str]:
    """DeviceIDs: a list (old layout) or a map NUMA node -> list (new layout)."""
    if value is None:
        return []
    if isinstance(value, list):
        lists = [value]
    elif isinstance(value, dict):
        lists = [value[k] for k in sorted(value)]
    else:
        raise CheckpointError(
            f"kubelet checkpoint {path} is malformed: DeviceIDs is {type(value).__name__}"
        )
    out: list[str] = []
    for ids in lists:
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise CheckpointError(
                f"kubelet checkpoint {path} is malformed: DeviceIDs holds "
                "something other than strings"
            )
        out.extend(ids)
    return out

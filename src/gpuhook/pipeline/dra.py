"""The kubelet's DRA state: what a pod's prepared ResourceClaims allocated (parsing pure, reading
at the edge).

On a node with Dynamic Resource Allocation the kubelet asks a DRA driver's kubelet plugin to
prepare each claim of a pod, hands the claim's CDI names to the engine (CRI ``CDIDevices``), and
records the prepared claims in ``<kubelet_dir>/dra_manager_state``: one JSON object
``{"Data": "<json>", "Checksum": <CRC-32 (IEEE) of Data>}`` whose Data holds the claims under
``ClaimInfoStateList`` (Kubernetes 1.34+; ``Entries`` in other 1.3x versions): per claim
``ClaimUID``, ``ClaimName``, ``Namespace``, ``PodUIDs`` (a map, or a list) and ``DriverState``,
per driver its ``Devices`` (``PoolName``, ``DeviceName``, ``ShareID`` (null unless shared),
``RequestNames``, ``CDIDeviceIDs``). The file is the kubelet's (root); it is per claim and pod,
not per container.

NVIDIA's DRA driver (``gpu.nvidia.com``) names a whole GPU ``gpu-<minor>`` and a MIG device
``gpu-<parent minor>-mig-<profile without dots>-<GI profile id>-<placement start>``: each maps to
the inventory by the GPU's minor (and the MIG device's profile). This is one more allocation
source of :mod:`gpuhook.pipeline.engine` (:func:`allocated`), read only when the engine injected a
GPU into an unprivileged Kubernetes container.
"""

from __future__ import annotations

from gpuhook import _fastjson
from gpuhook.errors import CheckpointError
from gpuhook.model.frozen import Frozen
from gpuhook.pipeline.engine import Allocated

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.model.inventory import Gpu, Inventory, MigDevice

STATE_IN_KUBELET_DIR = "dra_manager_state"
NVIDIA_DRIVER = "gpu.nvidia.com"
MAX_STATE_BYTES = 64 * 1024 * 1024
LIST_KEYS = ("ClaimInfoStateList", "Entries")


class ClaimDevice(Frozen):
    """One device a driver prepared for a claim."""

    driver: str
    pool: str
    name: str
    share_id: str | None
    requests: tuple[str, ...]
    cdi_ids: tuple[str, ...]


class Claim(Frozen):
    """One prepared ResourceClaim: who it was prepared for and its devices."""

    uid: str
    name: str
    namespace: str
    pod_uids: tuple[str, ...]
    devices: tuple[ClaimDevice, ...]

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


class DraState(Frozen):
    """The prepared claims of the checkpoint at ``path``."""

    path: str
    claims: tuple[Claim, ...]

    def of_pod(self, pod_uid: str) -> tuple[Claim, ...]:
        return tuple(c for c in self.claims if pod_uid in c.pod_uids)


def read_state(path: str) -> DraState:
    """The checkpoint at ``path``; a missing file is a node without DRA (no claims). Raises
    :class:`CheckpointError` (one line) for an unreadable, torn or malformed one."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return DraState(path, ())
    except OSError as exc:
        raise CheckpointError(
            f"the kubelet's DRA state {path} unreadable: {exc.strerror}"
        ) from None
    if len(raw) > MAX_STATE_BYTES:
        raise CheckpointError(f"the kubelet's DRA state {path} is larger than 64 MiB")
    return state_from_bytes(raw, path)


def state_from_bytes(raw: bytes, path: str) -> DraState:
    """Parse the checkpoint: the outer object, Data's checksum, then the claims."""
    bad = f"the kubelet's DRA state {path}"
    try:
        outer = _fastjson.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"{bad} is not valid JSON ({exc})") from None
    data = outer.get("Data") if isinstance(outer, dict) else None
    checksum = outer.get("Checksum") if isinstance(outer, dict) else None
    if not isinstance(data, str) or type(checksum) is not int:
        raise CheckpointError(f"{bad} is malformed: no Data string and Checksum number")
    from zlib import crc32

    if crc32(data.encode("utf-8", "surrogatepass")) != checksum:
        raise CheckpointError(f"{bad} fails its checksum (a torn or edited file)")
    try:
        doc = _fastjson.loads(data)
    except ValueError as exc:
        raise CheckpointError(f"{bad}: its Data is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{bad} is malformed: Data is not an object")
    entries = next((doc[k] for k in LIST_KEYS if k in doc), None)
    if entries is None:
        return DraState(path, ())
    if not isinstance(entries, list):
        raise CheckpointError(f"{bad} is malformed: its claim list is not a list")
    return DraState(path, tuple(_claim(e, bad) for e in entries))


def _claim(entry: Any, bad: str) -> Claim:
    if not isinstance(entry, dict) or not isinstance(entry.get("ClaimUID"), str):
        raise CheckpointError(f"{bad} is malformed: a claim without a ClaimUID")
    pods = entry.get("PodUIDs")
    listed = pods if isinstance(pods, dict | list) else ()
    pod_uids = tuple(p for p in listed if isinstance(p, str))
    devices: list[ClaimDevice] = []
    drivers = entry.get("DriverState")
    for driver, state in sorted(drivers.items()) if isinstance(drivers, dict) else ():
        found = state.get("Devices") if isinstance(state, dict) else None
        for device in found if isinstance(found, list) else ():
            if isinstance(device, dict) and isinstance(device.get("DeviceName"), str):
                devices.append(_device(driver, device))
    return Claim(
        entry["ClaimUID"],
        _str(entry.get("ClaimName")),
        _str(entry.get("Namespace")),
        pod_uids,
        tuple(devices),
    )


def _device(driver: str, device: dict[str, Any]) -> ClaimDevice:
    share = device.get("ShareID")
    return ClaimDevice(
        driver,
        _str(device.get("PoolName")),
        device["DeviceName"],
        share if isinstance(share, str) and share else None,
        _strs(device.get("RequestNames")),
        _strs(device.get("CDIDeviceIDs")),
    )


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


# --- NVIDIA's device names -> the inventory ------------------------------------------------------


def nvidia_device(name: str, inventory: Inventory) -> tuple[str, ...]:
    """The inventory ids (GPU or MIG UUIDs) of a device NVIDIA's DRA driver named ``name``, ``()``
    when this node has no such device. A MIG device is found by its parent's minor and its
    profile; where that GPU has several MIG devices of the profile, all of them are given (the
    NVML placement that tells them apart is not in the inventory: a known limit, docs/dra.md)."""
    head, _, rest = name.partition("-mig-")
    if not head.startswith("gpu-") or not _digits(head[4:]):
        return ()
    gpu = _by_minor(inventory, int(head[4:]))
    if gpu is None:
        return ()
    if not rest:
        return () if gpu.mig_enabled else (gpu.uuid,)
    profile = rest.split("-", 1)[0].lower()
    migs = gpu.mig_devices if gpu.mig_enabled else ()
    return tuple(m.uuid for m in migs if _profile(m) == profile)


def _by_minor(inventory: Inventory, minor: int) -> Gpu | None:
    for gpu in inventory.gpus:
        if (gpu.node.minor if gpu.node is not None else gpu.minor) == minor:
            return gpu
    return None


def _profile(mig: MigDevice) -> str:
    """``3g40gb`` from a MIG device named ``NVIDIA A100-SXM4-80GB MIG 3g.40gb`` (or ``3g.40gb``)."""
    return mig.name.rsplit(" ", 1)[-1].replace(".", "").lower()


def _digits(text: str) -> bool:
    return 0 < len(text) <= 9 and text.isascii() and text.isdigit()


def allocated(state: DraState, pod_uid: str, inventory: Inventory) -> Allocated:
    """The pod's prepared claims as an allocation source of :mod:`gpuhook.pipeline.engine`: the
    inventory UUIDs of their NVIDIA devices, and a source text naming each claim and device."""
    ids: list[str] = []
    named: list[str] = []
    for claim in state.of_pod(pod_uid):
        for device in claim.devices:
            if device.driver != NVIDIA_DRIVER:
                continue
            found = nvidia_device(device.name, inventory)
            ids += found
            unknown = "" if found else ", unknown to this node's inventory"
            named.append(f"{claim.display} ({device.name} of {device.driver}{unknown})")
    if not named:
        return Allocated(
            f"the kubelet's DRA state {state.path} (no claim of this pod{_others(state)})"
        )
    what = "claim" if len(named) == 1 else "claims"
    return Allocated(f"DRA {what} {', '.join(named)}", tuple(dict.fromkeys(ids)))


def _others(state: DraState) -> str:
    """The claims of NVIDIA's driver prepared for other pods, for a refusal: a claim prepared
    for another pod is a common misconfiguration (a claim reused, a pod recreated)."""
    held = [
        f"{c.display} ({','.join(d.name for d in c.devices if d.driver == NVIDIA_DRIVER)}) for "
        f"pod {','.join(c.pod_uids) or 'none'}"
        for c in state.claims
        if any(d.driver == NVIDIA_DRIVER for d in c.devices)
    ]
    if not held:
        return ""
    more = f" and {len(held) - 3} more" if len(held) > 3 else ""
    return "; prepared for other pods: " + "; ".join(held[:3]) + more

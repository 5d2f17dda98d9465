"""GPUs the engine injected (pure): device nodes that were in the spec before gpuhook-runtime ran.

An engine that resolves CDI itself (containerd 2.x, CRI-O, podman; the device plugin's
``cdi-cri`` strategy, DRA, gpuhook's own CDI spec) or is told ``--device`` writes the device
nodes into ``linux.devices`` itself. They are found by device number, whatever path they were
given: NVIDIA's GPU nodes are character devices of major 195, minors 0-253 (254 and 255 are
nvidia-modeset and nvidiactl), matched to the inventory's GPUs by minor; a MIG-mode GPU's node
with all the nvidia-caps nodes of one of its MIG devices is that MIG device.

The rule (SECURITY.md, "GPUs the engine injects"), for each injected device the decision did
not grant already:

- a privileged container keeps it (the engine gives it every device);
- a non-Kubernetes container keeps it: docker's or podman's ``--device`` or CDI is the engine
  user's choice, as trusted as the env channel (recorded, never refused);
- an unprivileged Kubernetes container keeps it when an allocation to its pod UID and container
  name covers it; else its create fails (``policy.kubernetes.engine_devices: verify``) or the
  device is recorded as kept by policy (``allow``).

Allocations come from sources, each an :class:`Allocated`: the kubelet's device checkpoint today
(:func:`from_checkpoint`); DRA's claim state is one more source, added by the caller
(:func:`gpuhook.pipeline.flow.run`'s ``allocation_sources``) without changing the rule.
"""

from __future__ import annotations

from gpuhook.errors import RequestError
from gpuhook.model.decision import (
    CHANNEL_ENGINE,
    KIND_GPU,
    KIND_MIG,
    VERDICT_GRANTED,
    VERDICT_IGNORED,
    Decision,
    DeviceRef,
    Reason,
)
from gpuhook.model.frozen import Frozen
from gpuhook.pipeline.identity import CONTAINER
from gpuhook.pipeline.policy import who as _who

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuhook.config.types import PolicyConfig
    from gpuhook.model.decision import KubeIdentity, Request
    from gpuhook.model.inventory import Gpu, Inventory
    from gpuhook.pipeline.kubelet import Allocation

    # Another source of what a pod's container was allocated (DRA's claims): its answer.
    AllocationSource = Callable[[KubeIdentity], "Allocated"]

NVIDIA_MAJOR = 195
FIRST_CONTROL_MINOR = 254  # nvidia-modeset (254) and nvidiactl (255) are no GPU


class Allocated(Frozen):
    """What one allocation source says a container was allocated: ``source`` names it (shown in
    reasons), ``ids`` are device ids in any form :mod:`gpuhook.pipeline.devices` resolves (UUIDs,
    indices, ``<gpu>:<mig>``, replicas ``<id>::<n>``); ``error`` says why it could not be read."""

    source: str
    ids: tuple[str, ...] = ()
    error: str = ""


class Injected(Frozen):
    """One GPU device the engine injected: the node's path in the container, its minor, and the
    device it is (None: no GPU of this node's inventory has that minor)."""

    path: str
    minor: int
    ref: DeviceRef | None


def spec_devices(spec: dict[str, Any]) -> tuple[tuple[str, int, int], ...]:
    """The spec's character devices (path, major, minor) when one of them is an NVIDIA GPU
    node, else ``()`` (the common case: nothing more is looked at)."""
    linux = spec.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    if not isinstance(devices, list):
        return ()
    found = tuple(
        (d["path"], d["major"], d["minor"])
        for d in devices
        if isinstance(d, dict)
        and d.get("type") in ("c", "u")
        and type(d.get("path")) is str
        and type(d.get("major")) is int
        and type(d.get("minor")) is int
    )
    return found if any(is_gpu_node(major, minor) for _, major, minor in found) else ()


def engine_only(decision: Decision) -> bool:
    """Whether the container's GPUs are all the engine's (no request channel granted any): gpuhook
    then injects nothing (the engine applied its CDI spec's edits, or its user chose bare
    ``--device`` nodes); it records them and names them in ``NVIDIA_VISIBLE_DEVICES``."""
    return decision.channel == CHANNEL_ENGINE


def is_gpu_node(major: int, minor: int) -> bool:
    return major == NVIDIA_MAJOR and 0 <= minor < FIRST_CONTROL_MINOR


def from_checkpoint(allocation: Allocation | None, error: str, policy: PolicyConfig) -> Allocated:
    """The kubelet checkpoint as an allocation source: its GPU resources' ids
    (``policy.kubernetes.gpu_resources``)."""
    if error:
        return Allocated("the kubelet checkpoint", error=error)
    resources = allocation.resources if allocation is not None else ()
    ids = [i for r, rids in resources if policy.is_gpu_resource(r) for i in rids]
    where = allocation.source if allocation is not None else policy.checkpoint
    return Allocated(f"the kubelet checkpoint {where}", tuple(dict.fromkeys(ids)))


def needs_allocation(request: Request) -> bool:
    """Whether verifying the engine's devices needs the container's allocations: an
    unprivileged Kubernetes container (of a trusted identity) whose spec holds a GPU node."""
    kube = request.kubernetes
    return (
        bool(request.engine_devices)
        and kube is not None
        and not request.privileged
        and kube.container_type == CONTAINER
        and not kube.problem
    )


def injected(request: Request, inventory: Inventory) -> tuple[Injected, ...]:
    """The GPU devices of the spec's device nodes, by device number."""
    numbers = {(major, minor) for _, major, minor in request.engine_devices}
    by_number = {_number(g): g for g in inventory.gpus}
    out: list[Injected] = []
    for path, major, minor in request.engine_devices:
        if not is_gpu_node(major, minor):
            continue
        gpu = by_number.get((major, minor))
        if gpu is None:
            out.append(Injected(path, minor, None))
            continue
        migs = [
            DeviceRef(KIND_MIG, m.uuid, gpu.index, m.index)
            for m in (gpu.mig_devices if gpu.mig_enabled else ())
            if m.caps and all((c.major, c.minor) in numbers for c in m.caps)
        ]
        refs = migs or [DeviceRef(KIND_GPU, gpu.uuid, gpu.index)]
        out += [Injected(path, minor, ref) for ref in refs]
    return tuple(out)


def _number(gpu: Gpu) -> tuple[int, int]:
    return (gpu.node.major, gpu.node.minor) if gpu.node is not None else (NVIDIA_MAJOR, gpu.minor)


def reconcile(
    decision: Decision,
    request: Request,
    policy: PolicyConfig,
    inventory: Callable[[], Inventory],
    allocations: tuple[Allocated, ...],
    capabilities: Callable[[], tuple[str, ...]],
) -> Decision:
    """``decision`` with the engine's GPUs: each with a reason line (channel ``engine-cdi``),
    those the decision did not grant added to its devices when the rule keeps them. Raises
    :class:`RequestError` (one line) for a device no allocation covers, under ``verify``.
    ``capabilities``: the container's driver capabilities, asked when the decision had none."""
    if not request.engine_devices:
        return decision
    inv = inventory()
    lines: list[Reason] = []
    kept: list[DeviceRef] = []
    for item in injected(request, inv):
        what = f"GPU {item.ref.display_id} ({item.ref.uuid})" if item.ref else f"minor {item.minor}"
        if item.ref is not None and _covers(decision.devices, item.ref):
            why = f"{what}, injected by the engine, is what {decision.channel} granted"
            lines.append(Reason(CHANNEL_ENGINE, item.path, VERDICT_GRANTED, why))
            continue
        why = _keep(item, what, request, policy, allocations, inv)
        if item.ref is None:
            lines.append(Reason(CHANNEL_ENGINE, item.path, VERDICT_IGNORED, why))
        else:
            lines.append(Reason(CHANNEL_ENGINE, item.path, VERDICT_GRANTED, why))
            kept.append(item.ref)
    if not kept:
        return decision.replace(reasons=(*decision.reasons, *lines))
    devices = {d.uuid: d for d in decision.devices}
    for ref in kept:
        devices.setdefault(ref.uuid, ref)
    others = tuple(r for r in decision.reasons if r.channel != "-")  # not "no GPU request"
    return Decision(
        True,
        devices=tuple(sorted(devices.values(), key=lambda r: r.sort_key())),
        capabilities=decision.capabilities or capabilities(),
        channel=decision.channel if decision.devices else CHANNEL_ENGINE,
        reasons=(*lines, *others),
    )


def _covers(refs: tuple[DeviceRef, ...], ref: DeviceRef) -> bool:
    """Whether ``ref`` is one of ``refs``, or a MIG device of a whole GPU among them."""
    return any(
        r.uuid == ref.uuid or (r.kind == KIND_GPU and r.gpu_index == ref.gpu_index) for r in refs
    )


def _keep(
    item: Injected,
    what: str,
    request: Request,
    policy: PolicyConfig,
    allocations: tuple[Allocated, ...],
    inventory: Inventory,
) -> str:
    """Why the engine's device is kept; raises :class:`RequestError` when it must not be."""
    injected_by = f"{what}, injected by the engine"
    if request.privileged:
        return f"{injected_by}: a privileged container (the engine gives it every device)"
    kube = request.kubernetes
    if kube is None:
        if item.ref is None:
            return f"{injected_by}: no GPU of this node's inventory (gpuhook inventory refresh)"
        return (
            f"{injected_by}: a non-Kubernetes container (the engine's user chose it: "
            "--device or a CDI device)"
        )
    who = _who(kube)
    if needs_allocation(request):
        covered, looked = _covered(item.ref, allocations, inventory)
    else:  # a sandbox, or an identity that cannot be trusted: nothing is allocated to it
        covered, looked = "", [f"its identity: {kube.problem or 'a pod sandbox'}"]
    if covered:
        return f"{injected_by}: allocated to {who} in {covered}"
    if policy.engine_devices == "allow":
        why = f"not allocated to {who}; kept (policy.kubernetes.engine_devices: allow)"
        return f"{injected_by}: {why}"
    unknown = "" if item.ref else ", no GPU of this node's inventory (gpuhook inventory refresh)"
    raise RequestError(
        f"the engine injected {item.path} ({what}{unknown}) into {who}, but no allocation covers "
        f"it ({'; '.join(looked)}): a misconfigured or forged CDI spec "
        "(policy.kubernetes.engine_devices: verify)"
    )


def _covered(
    ref: DeviceRef | None, allocations: tuple[Allocated, ...], inventory: Inventory
) -> tuple[str, list[str]]:
    """The source whose allocation covers ``ref`` ("" none), and what each source said."""
    from gpuhook.pipeline import devices

    looked: list[str] = []
    for source in allocations:
        if source.error:
            looked.append(source.error)
            continue
        refs, _ = devices.resolve(source.ids, inventory)
        if ref is not None and _covers(refs, ref):
            return source.source, looked
        shown = ",".join(r.display_id for r in refs) or "nothing"
        looked.append(f"{source.source} allocates {shown}")
    return "", looked or ["no allocation source"]

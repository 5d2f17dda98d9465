"""Request x config x allocation -> :class:`Decision` (pure). Who may ask for a GPU.

Channels in priority order (docs/architecture.md, trust model): CDI annotations, volume-mount
markers, docker's ``--gpus`` (its prestart hook), then ``NVIDIA_VISIBLE_DEVICES`` in the env. The
first channel that carries a request is the one decided; the others are recorded as superseded
(a malformed one too: only the deciding channel can fail a create).

Each channel has one trust function that says what it may grant and why (a :class:`Trust`):

- CDI annotations: set by a device plugin through the CRI. Under ``verify``, an unprivileged
  Kubernetes container gets at most its checkpoint allocation where the checkpoint is readable.
- volume-mount markers: set by a device plugin through the kubelet, but a pod author with
  hostPath access can make one: under ``verify`` an unprivileged Kubernetes container gets at
  most its allocation (an unreadable checkpoint refuses).
- docker's prestart hook: trusted for non-Kubernetes containers (only the engine adds it); in a
  Kubernetes container it is NVIDIA's hooks.d file, an env request (the parser labels it env).
- env: privileged containers; non-Kubernetes containers under ``policy.standalone.env_requests:
  trust``; Kubernetes containers under ``policy.kubernetes.env_requests: trust``, or ``verify``
  and the kubelet's checkpoint allocates the devices to that pod UID and container name.

A pod sandbox, and a Kubernetes container whose identity is missing, unknown or contradictory
(:mod:`gpuhook.pipeline.identity`), never gets GPUs. Then :func:`decide` resolves the chosen
channel's ids within what its trust allows. Every decision carries its reasons.
"""

from __future__ import annotations

from gpuhook.errors import RequestError
from gpuhook.model.decision import (
    CHANNEL_CDI,
    CHANNEL_DOCKER,
    CHANNEL_ENV,
    CHANNEL_MOUNT,
    VERDICT_GRANTED,
    VERDICT_IGNORED,
    VERDICT_REFUSED,
    VERDICT_SUPERSEDED,
    Decision,
    Reason,
)
from gpuhook.model.frozen import Frozen
from gpuhook.pipeline.identity import CONTAINER, SANDBOX

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpuhook.config.types import PolicyConfig
    from gpuhook.model.decision import ChannelRequest, DeviceRef, KubeIdentity, Request
    from gpuhook.model.inventory import Inventory
    from gpuhook.pipeline.kubelet import Allocation

PRIORITY = (CHANNEL_CDI, CHANNEL_MOUNT, CHANNEL_DOCKER, CHANNEL_ENV)
CHECKPOINT_CHANNEL = "kubelet-checkpoint"
NO_REQUEST = "no GPU request in the spec"


class Trust(Frozen):
    """What one channel may grant, and why: the answer of its trust function.

    ``allowed``: the device ids the grant must stay within (the checkpoint's allocation), None
    for no limit; an unlimited trust fails the create on an unknown or malformed id, a limited
    one grants what is allocated and says what it left out. ``allocated``: the GPU resources of
    the checkpoint behind ``allowed`` (resource, ids), each id of which must be a device of this
    node. ``note``: a reason line to add.
    """

    trusted: bool
    why: str
    allowed: tuple[str, ...] | None = None
    note: str = ""
    allocated: tuple[tuple[str, tuple[str, ...]], ...] = ()


class Checkpoint(Frozen):
    """What the kubelet checkpoint says of the container: its allocation, or why it is unknown."""

    allocation: Allocation | None
    error: str = ""


def needs_allocation(request: Request, policy: PolicyConfig) -> bool:
    """Whether deciding needs the kubelet checkpoint (so the caller reads it only then)."""
    chosen = _chosen(request)
    return (
        chosen is not None
        and bool(chosen.ids)
        and _verifies(request, policy)
        and _identity_refusal(request.kubernetes) is None
    )


def _verifies(request: Request, policy: PolicyConfig) -> bool:
    """An unprivileged Kubernetes container under ``policy.kubernetes.env_requests: verify``."""
    return (
        request.kubernetes is not None
        and not request.privileged
        and policy.kubernetes_env_requests == "verify"
    )


def _chosen(request: Request) -> ChannelRequest | None:
    for channel in PRIORITY:
        for req in request.channels:
            if req.channel == channel:
                return req
    return None


# --- one trust function per channel ------------------------------------------------------------


def trust_cdi(request: Request, policy: PolicyConfig, checkpoint: Checkpoint) -> Trust:
    why = "CDI annotations are set by a device plugin through the CRI"
    if not _verifies(request, policy):
        return Trust(True, why)
    if checkpoint.error:
        return Trust(True, why, note=f"not verified: {checkpoint.error}")
    return _verified(request.kubernetes, checkpoint, "CDI annotations", policy)


def trust_markers(request: Request, policy: PolicyConfig, checkpoint: Checkpoint) -> Trust:
    if not _verifies(request, policy):
        return Trust(True, "volume-mount markers are set by a device plugin through the kubelet")
    return _verified(request.kubernetes, checkpoint, "volume-mount markers", policy)


def trust_docker(_request: Request, _policy: PolicyConfig, _checkpoint: Checkpoint) -> Trust:
    """Only non-Kubernetes containers have this channel: in a pod the same hook is NVIDIA's
    hooks.d file, which :func:`gpuhook.pipeline.request.parse` reads as an env request."""
    return Trust(True, "docker --gpus: the engine added its prestart hook")


def trust_env(request: Request, policy: PolicyConfig, checkpoint: Checkpoint) -> Trust:
    kube = request.kubernetes
    if request.privileged:
        return Trust(
            True, "privileged container (every capability, the device cgroup open to all devices)"
        )
    if kube is None:
        if policy.standalone_env_requests != "trust":
            return Trust(
                False,
                "env requests of non-Kubernetes containers are ignored "
                "(policy.standalone.env_requests: ignore)",
            )
        return Trust(True, "non-Kubernetes container and policy.standalone.env_requests is trust")
    mode = policy.kubernetes_env_requests
    if mode == "ignore":
        return Trust(
            False,
            "env requests of Kubernetes containers are ignored "
            "(policy.kubernetes.env_requests: ignore)",
        )
    if mode == "trust":
        return Trust(True, "Kubernetes container and policy.kubernetes.env_requests is trust")
    return _verified(kube, checkpoint, "", policy)


TRUST: dict[str, Callable[[Request, PolicyConfig, Checkpoint], Trust]] = {
    CHANNEL_CDI: trust_cdi,
    CHANNEL_MOUNT: trust_markers,
    CHANNEL_DOCKER: trust_docker,
    CHANNEL_ENV: trust_env,
}


def _verified(
    kube: KubeIdentity | None, checkpoint: Checkpoint, what: str, policy: PolicyConfig
) -> Trust:
    """Trust limited to the checkpoint's allocation of GPU resources to this container (refused
    without one). The container's other resources (RDMA devices, say) are never GPUs."""
    container = who(kube)
    prefix = f"{what} of an unprivileged Kubernetes container: " if what else ""
    if checkpoint.error:
        return Trust(
            False, f"{prefix}cannot verify against the kubelet checkpoint: {checkpoint.error}"
        )
    resources = checkpoint.allocation.resources if checkpoint.allocation is not None else ()
    gpu = tuple((r, ids) for r, ids in resources if policy.is_gpu_resource(r) and ids)
    others = ", ".join(r for r, _ in resources if not policy.is_gpu_resource(r))
    note = f"not GPU resources (policy.kubernetes.gpu_resources), not counted: {others}"
    ids = tuple(dict.fromkeys(i for _, resource_ids in gpu for i in resource_ids))
    if not ids:
        why = f"{prefix}no GPU resource is allocated to {container} in the kubelet checkpoint"
        return Trust(False, why + (f" ({note})" if others else ""))
    why = f"verified against the kubelet checkpoint: allocated to {container}"
    return Trust(True, why, ids, note if others else "", gpu)


def who(kube: KubeIdentity | None) -> str:
    """The container as reasons name it: its pod, pod UID and container name."""
    if kube is None:
        return "this container"
    pod = f"pod {kube.namespace}/{kube.pod_name} " if kube.pod_name else "pod "
    return f"{pod}(uid {kube.pod_uid}) container {kube.container_name!r}"


def _identity_refusal(kube: KubeIdentity | None) -> Trust | None:
    """A sandbox, or a Kubernetes identity that cannot be trusted: no GPU, whatever the channel."""
    if kube is None or (kube.container_type == CONTAINER and not kube.problem):
        return None
    if kube.container_type == SANDBOX:
        return Trust(False, "a pod sandbox never gets GPUs")
    return Trust(False, f"treated as a pod sandbox (no GPU): {kube.problem}")


def parse_capabilities(raw: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """NVIDIA_DRIVER_CAPABILITIES -> sorted capability names. Raises RequestError on unknowns."""
    from gpuhook.inventory.catalog import CAPABILITIES

    if raw is None or not raw.strip():
        return tuple(sorted(default))
    names = [t.strip().lower() for t in raw.split(",") if t.strip()]
    if "all" in names:
        return tuple(sorted(CAPABILITIES))
    unknown = [n for n in names if n not in CAPABILITIES]
    if unknown:
        raise RequestError(
            f"unknown driver capability {unknown[0]!r} in NVIDIA_DRIVER_CAPABILITIES "
            f"(known: {', '.join(CAPABILITIES)}, all)"
        )
    return tuple(sorted(set(names)))


def decide(
    request: Request,
    policy: PolicyConfig,
    default_capabilities: tuple[str, ...],
    inventory: Callable[[], Inventory],
    allocation: Allocation | None = None,
    allocation_error: str = "",
) -> Decision:
    """Pick the channel by priority, ask its trust function, resolve. ``inventory`` is called
    only when devices must be resolved (a refusal needs no inventory, which keeps the
    default-"all" leak case cheap). Raises :class:`RequestError` when a request trusted without
    limit cannot be satisfied."""
    chosen = _chosen(request)
    if chosen is None:
        return no_request(ignored=request.ignored)
    others = tuple(_superseded(req, chosen) for req in request.channels if req is not chosen)
    others += request.ignored
    checkpoint = Checkpoint(allocation, allocation_error)
    trust = _identity_refusal(request.kubernetes) or _trust(chosen, request, policy, checkpoint)
    if not trust.trusted:
        return _refused(chosen, trust.why, others)
    if chosen.problem:
        if trust.allowed is None:
            raise RequestError(f"malformed GPU request: {chosen.problem}")
        return _refused(chosen, f"malformed GPU request: {chosen.problem}", others)
    capabilities = parse_capabilities(request.driver_capabilities, default_capabilities)
    if not chosen.ids:
        reason = Reason(
            chosen.channel, chosen.value, VERDICT_IGNORED, "the request names no device"
        )
        return Decision(True, channel=chosen.channel, reasons=(reason, *others), refused=True)
    if chosen.ids == ("none",):
        why = f"driver files only, no devices: {trust.why}"
        reason = Reason(chosen.channel, chosen.value, VERDICT_GRANTED, why)
        return Decision(
            True,
            driver_only=True,
            capabilities=capabilities,
            channel=chosen.channel,
            reasons=(reason, *others),
        )
    return _grant(chosen, trust, inventory(), capabilities, others, who(request.kubernetes))


def no_request(why: str = "", ignored: tuple[Reason, ...] = ()) -> Decision:
    """The decision for a spec that asks for no GPU: the container is left alone. ``why``
    replaces the reason's :data:`NO_REQUEST` (the shim says it did not parse the spec);
    ``ignored``: what looked like a request but is none."""
    reason = Reason("-", "", VERDICT_IGNORED, why or NO_REQUEST)
    return Decision(gpu_container=False, reasons=(reason, *ignored))


def _trust(
    chosen: ChannelRequest, request: Request, policy: PolicyConfig, checkpoint: Checkpoint
) -> Trust:
    """The chosen channel's trust. A verified container whose request names no device (empty or
    malformed) has nothing to check against the checkpoint, which was not read for it
    (:func:`needs_allocation`): limited to nothing, so it is refused for what it is."""
    if not chosen.ids and _verifies(request, policy):
        return Trust(True, "nothing to verify against the kubelet checkpoint", allowed=())
    return TRUST[chosen.channel](request, policy, checkpoint)


def _superseded(req: ChannelRequest, chosen: ChannelRequest) -> Reason:
    why = f"{chosen.channel} ({chosen.source}) takes precedence"
    if req.problem:
        why += f"; this request is malformed and was not used: {req.problem}"
    return Reason(req.channel, req.value, VERDICT_SUPERSEDED, why)


def _refused(chosen: ChannelRequest, why: str, others: tuple[Reason, ...]) -> Decision:
    reason = Reason(chosen.channel, chosen.value, VERDICT_REFUSED, why)
    return Decision(True, channel=chosen.channel, reasons=(reason, *others), refused=True)


def _grant(
    chosen: ChannelRequest,
    trust: Trust,
    inv: Inventory,
    capabilities: tuple[str, ...],
    others: tuple[Reason, ...],
    who: str,
) -> Decision:
    """Resolve the chosen request's ids within what its trust allows. Raises
    :class:`RequestError` when a device the kubelet allocated (or a device plugin's CDI
    annotation names) is not a device of this node: such a container never starts without it."""
    from gpuhook.pipeline import devices  # only a grant resolves devices (a refusal stays cheap)

    note: tuple[Reason, ...] = ()
    if trust.note:
        note = (Reason(CHECKPOINT_CHANNEL, "", VERDICT_IGNORED, trust.note),)
    refs, errors = devices.resolve(chosen.ids, inv)
    left_out: tuple[Reason, ...] = ()
    if errors and (trust.allowed is None or chosen.channel == CHANNEL_CDI):
        raise RequestError(f"{chosen.source}: {errors[0]}")
    if trust.allowed is None:
        granted = refs
    else:
        _check_allocated(trust.allocated, inv, who)
        granted, left_out = _within(chosen, refs, errors, trust.allowed, inv)
    if not granted:
        why = "none of the requested devices is allocated to this container"
        return _refused(chosen, why, (*others, *note, *left_out))
    shown = ",".join(r.display_id for r in granted)
    reason = Reason(chosen.channel, chosen.value, VERDICT_GRANTED, f"devices {shown}: {trust.why}")
    return Decision(
        True,
        devices=granted,
        capabilities=capabilities,
        channel=chosen.channel,
        reasons=(reason, *others, *note, *left_out),
    )


def _check_allocated(
    allocated: tuple[tuple[str, tuple[str, ...]], ...], inv: Inventory, who: str
) -> None:
    """Every device id the kubelet allocated to the container is one of this node's GPU or MIG
    devices, by UUID or by index (the device plugin's deviceIDStrategy ``uuid`` or ``index``:
    ``1``, ``<gpu>:<mig>``), or a time-slicing replica of one (``<id>::<n>``); else the create
    fails."""
    from gpuhook.pipeline import devices

    for resource, ids in allocated:
        for device_id in ids:
            name = device_id.partition("::")[0]
            if not devices.is_device_id(name):
                raise RequestError(
                    f"the kubelet allocated {device_id!r} ({resource}) to {who}, which is not a "
                    "GPU or MIG id: gpuhook takes the device plugin's UUID or index device ids "
                    "(deviceIDStrategy uuid or index)"
                )
            try:
                devices.resolve_one(name, inv)
            except devices.UnknownDevice:
                raise RequestError(
                    f"the kubelet allocated {device_id} ({resource}) to {who}, but this node's "
                    "inventory has no such device (stale, or a GPU was added or replaced): run "
                    "gpuhook inventory refresh; the kubelet retries the container"
                ) from None


def _within(
    chosen: ChannelRequest,
    refs: tuple[DeviceRef, ...],
    errors: list[str],
    allowed_ids: tuple[str, ...],
    inv: Inventory,
) -> tuple[tuple[DeviceRef, ...], tuple[Reason, ...]]:
    """The requested devices that the allocation holds (``all``: the whole allocation), and a
    reason line for requested devices left out. The allocated ids are this node's
    (:func:`_check_allocated`)."""
    from gpuhook.pipeline import devices

    allowed, _ = devices.resolve(allowed_ids, inv)
    lines = []
    if any((devices.strip_cdi(i) or "").lower() == "all" for i in chosen.ids):
        return allowed, ()
    allowed_uuids = {r.uuid for r in allowed}
    extra = [r.display_id for r in refs if r.uuid not in allowed_uuids]
    if extra or errors:
        why = "not allocated to this container: " + ", ".join([*extra, *errors])
        lines.append(Reason(chosen.channel, chosen.value, VERDICT_REFUSED, why))
    return tuple(r for r in refs if r.uuid in allowed_uuids), tuple(lines)

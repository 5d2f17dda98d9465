"""Request x config x allocation -> :class:`Decision` (pure). Who may ask for a GPU.

Channels in priority order (DESIGN.md, trust model): CDI annotations and volume-mount markers
(set by a device plugin through the CRI; pod users cannot set them), docker's ``--gpus`` (the
engine adds a prestart hook only it can add), then ``NVIDIA_VISIBLE_DEVICES`` in the process env.
The first channel that carries a request is the one decided; the others are recorded as
superseded. The env channel is trusted when the container is privileged, when it is not a
Kubernetes container and ``policy.standalone.env_requests`` is ``trust``, or when it is a
Kubernetes container and ``policy.kubernetes.env_requests`` is ``trust``, or ``verify`` and the
kubelet's checkpoint shows the devices allocated to that pod and container. A pod sandbox never
gets GPUs. Every decision carries its reasons.
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
    DeviceRef,
    Reason,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpuhook.config import PolicyConfig
    from gpuhook.model.decision import ChannelRequest, Request
    from gpuhook.model.inventory import Inventory
    from gpuhook.pipeline.kubelet import Allocation

PRIORITY = (CHANNEL_CDI, CHANNEL_MOUNT, CHANNEL_DOCKER, CHANNEL_ENV)


def needs_allocation(request: Request, policy: PolicyConfig) -> bool:
    """Whether deciding needs the kubelet checkpoint (so the caller reads it only then)."""
    chosen = _chosen(request)
    return (
        chosen is not None
        and chosen.channel == CHANNEL_ENV
        and request.kubernetes is not None
        and request.kubernetes.container_type != "sandbox"
        and not request.privileged
        and policy.kubernetes_env_requests == "verify"
        and bool(chosen.ids)
    )


def _chosen(request: Request) -> ChannelRequest | None:
    for channel in PRIORITY:
        for req in request.channels:
            if req.channel == channel:
                return req
    return None


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
    """Decide. ``inventory`` is called only when devices must be resolved (a refusal needs no
    inventory, which keeps the default-"all" leak case cheap). Raises :class:`RequestError`
    when a trusted request cannot be satisfied."""
    chosen = _chosen(request)
    if chosen is None:
        return Decision(
            gpu_container=False,
            reasons=(Reason("-", "", VERDICT_IGNORED, "no GPU request in the spec"),),
        )
    reasons = [
        Reason(
            req.channel,
            req.value,
            VERDICT_SUPERSEDED,
            f"{chosen.channel} ({chosen.source}) takes precedence",
        )
        for req in request.channels
        if req is not chosen
    ]
    kube = request.kubernetes

    def refuse(why: str) -> Decision:
        reasons.insert(0, Reason(chosen.channel, chosen.value, VERDICT_REFUSED, why))
        return Decision(
            gpu_container=True, channel=chosen.channel, reasons=tuple(reasons), refused=True
        )

    if kube is not None and kube.container_type == "sandbox":
        return refuse("a pod sandbox never gets GPUs")

    trusted_why = ""
    allowed: tuple[DeviceRef, ...] | None = None  # None: no allocation limit
    if chosen.channel == CHANNEL_CDI:
        trusted_why = "CDI annotations are set by a device plugin through the CRI"
    elif chosen.channel == CHANNEL_MOUNT:
        trusted_why = "volume-mount markers are set by a device plugin through the kubelet"
    elif chosen.channel == CHANNEL_DOCKER:
        trusted_why = "docker --gpus: the engine added its prestart hook"
    elif request.privileged:
        trusted_why = "privileged container (CAP_SYS_ADMIN in the bounding set)"
    elif kube is None:
        if policy.standalone_env_requests != "trust":
            return refuse(
                "env requests of non-Kubernetes containers are ignored "
                "(policy.standalone.env_requests: ignore)"
            )
        trusted_why = "non-Kubernetes container and policy.standalone.env_requests is trust"
    else:
        mode = policy.kubernetes_env_requests
        who = (
            f"pod {kube.namespace}/{kube.pod_name} (uid {kube.pod_uid}) container "
            f"{kube.container_name!r}"
        )
        if mode == "ignore":
            return refuse(
                "env requests of Kubernetes containers are ignored "
                "(policy.kubernetes.env_requests: ignore)"
            )
        if mode == "trust":
            trusted_why = "Kubernetes container and policy.kubernetes.env_requests is trust"
        else:
            if allocation_error:
                return refuse(f"cannot verify against the kubelet checkpoint: {allocation_error}")
            ids = allocation.device_ids if allocation is not None else ()
            if not ids:
                return refuse(
                    f"no nvidia.com/* devices are allocated to {who} in the kubelet checkpoint"
                )
            from gpuhook.pipeline import devices

            refs, errors = devices.resolve(ids, inventory())
            if errors:
                reasons.append(
                    Reason(
                        "kubelet-checkpoint",
                        ",".join(ids),
                        VERDICT_IGNORED,
                        "allocated ids unknown on this node: " + "; ".join(errors),
                    )
                )
            if not refs:
                return refuse(f"the devices allocated to {who} are not on this node")
            allowed = refs
            trusted_why = f"verified against the kubelet checkpoint: allocated to {who}"

    if request.problems:
        if allowed is None:
            raise RequestError(f"malformed GPU request: {request.problems[0]}")
        return refuse(f"malformed GPU request: {request.problems[0]}")

    capabilities = parse_capabilities(request.driver_capabilities, default_capabilities)
    ids = chosen.ids
    if not ids:
        reasons.insert(
            0, Reason(chosen.channel, chosen.value, VERDICT_IGNORED, "the request names no device")
        )
        return Decision(
            gpu_container=True, channel=chosen.channel, reasons=tuple(reasons), refused=True
        )
    if ids == ("none",):
        reasons.insert(
            0,
            Reason(
                chosen.channel,
                chosen.value,
                VERDICT_GRANTED,
                f"driver files only, no devices: {trusted_why}",
            ),
        )
        return Decision(
            gpu_container=True,
            driver_only=True,
            capabilities=capabilities,
            channel=chosen.channel,
            reasons=tuple(reasons),
        )

    from gpuhook.pipeline import (
        devices,  # only a grant resolves devices (a refusal stays cheap)
    )

    inv = inventory()
    if chosen.channel == CHANNEL_CDI:
        foreign = [i for i in ids if devices.strip_cdi(i) is None]
        for name in foreign:
            reasons.append(
                Reason(
                    chosen.channel,
                    name,
                    VERDICT_IGNORED,
                    "not an NVIDIA device (left to its own CDI handler)",
                )
            )
        ids = tuple(i for i in ids if devices.strip_cdi(i) is not None)
        if not ids:
            return Decision(gpu_container=False, reasons=tuple(reasons))
    refs, errors = devices.resolve(ids, inv)
    if allowed is None:
        if errors:
            raise RequestError(f"{chosen.source}: {errors[0]}")
        granted = refs
    else:
        allowed_uuids = {r.uuid for r in allowed}
        if ids == ("all",):
            granted = allowed
        else:
            granted = tuple(r for r in refs if r.uuid in allowed_uuids)
            extra = [r.display_id for r in refs if r.uuid not in allowed_uuids]
            if extra or errors:
                reasons.append(
                    Reason(
                        chosen.channel,
                        chosen.value,
                        VERDICT_REFUSED,
                        "not allocated to this container: " + ", ".join([*extra, *errors]),
                    )
                )
        if not granted:
            return refuse("none of the requested devices is allocated to this container")
    shown = ",".join(r.display_id for r in granted)
    reasons.insert(
        0, Reason(chosen.channel, chosen.value, VERDICT_GRANTED, f"devices {shown}: {trusted_why}")
    )
    return Decision(
        gpu_container=True,
        devices=granted,
        capabilities=capabilities,
        channel=chosen.channel,
        reasons=tuple(reasons),
    )

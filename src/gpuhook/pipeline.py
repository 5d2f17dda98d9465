"""The one function the runtime shim and ``gpuhook inspect spec`` both call.

spec (raw dict) -> request -> policy -> discover -> edits -> new spec. Pure apart from the two
sources it is given (the inventory and the kubelet checkpoint), which are read only when the
decision needs them: a container with no request reads neither, a refused Kubernetes request
reads only the checkpoint.
"""

from __future__ import annotations

from gpuhook import discover, edits, policy, request
from gpuhook.errors import CheckpointError, MpsError, RequestError
from gpuhook.model import Frozen, _init

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from gpuhook.config import Config
    from gpuhook.kubelet import Allocation
    from gpuhook.model import ContainerEdits, Decision, Inventory, Request
    from gpuhook.sharing import MpsPlan

    InventorySource = Callable[[Config], Inventory]
    CheckpointSource = Callable[[str, str, str], Allocation]
    MpsProbe = Callable[[str], int | None]  # pipe dir -> control daemon pid, None when down
    MpsUsageSource = Callable[[], Mapping[str, tuple[int, int]]]  # uuid -> (bytes, containers)


class Outcome(Frozen):
    __slots__ = (
        "allocation",
        "allocation_error",
        "changed",
        "decision",
        "edits",
        "inventory",
        "mps",
        "request",
        "spec",
    )
    request: Request
    decision: Decision
    edits: ContainerEdits
    spec: dict[str, Any]
    changed: bool
    allocation: Allocation | None
    allocation_error: str
    inventory: Inventory | None
    mps: MpsPlan | None

    def __init__(
        self,
        request: Request,
        decision: Decision,
        edits: ContainerEdits,
        spec: dict[str, Any],
        changed: bool,
        allocation: Allocation | None,
        allocation_error: str,
        inventory: Inventory | None,
        mps: MpsPlan | None = None,
    ) -> None:
        _init(
            self,
            request=request,
            decision=decision,
            edits=edits,
            spec=spec,
            changed=changed,
            allocation=allocation,
            allocation_error=allocation_error,
            inventory=inventory,
            mps=mps,
        )


def rootfs_of(bundle: str, spec: dict[str, Any]) -> str:
    """The container's absolute rootfs (root.path against the bundle), "" when the spec has none
    (runc rejects such a spec itself)."""
    from gpuhook import ocispec
    from gpuhook.errors import SpecError

    try:
        return ocispec.rootfs(bundle, spec)
    except SpecError:
        return ""


def _default_inventory(config: Config) -> Inventory:
    from gpuhook.inventory import store

    return store.load_current(config)


def _default_checkpoint(path: str, pod_uid: str, container: str) -> Allocation:
    from gpuhook import kubelet

    return kubelet.read_allocation(path, pod_uid, container)


def _default_mps_probe(pipe_dir: str) -> int | None:
    from gpuhook import mps

    return mps.control_pid(pipe_dir)


def run(
    spec: dict[str, Any],
    config: Config,
    *,
    inventory_source: InventorySource | None = None,
    checkpoint_source: CheckpointSource | None = None,
    mps_probe: MpsProbe | None = None,
    mps_usage_source: MpsUsageSource | None = None,
    rootfs: str = "",
) -> Outcome:
    """Decide and compute the new spec. Raises GpuhookError subclasses with one-line messages.

    For a grant of MPS-shared GPUs, ``mps_probe`` tells whether the group's control daemon runs
    (default: its pid file) and ``mps_usage_source`` gives the pinned memory limits of the live
    containers (default: the decision records), read only under ``mps.oversubscription: reject``.
    ``rootfs``: the container's absolute rootfs when known (see :func:`rootfs_of`).
    """
    req = request.parse(spec)
    load_inventory = inventory_source or _default_inventory
    cache: list[Inventory] = []

    def inventory() -> Inventory:
        if not cache:
            cache.append(load_inventory(config))
        return cache[0]

    allocation: Allocation | None = None
    allocation_error = ""
    if policy.needs_allocation(req, config.policy):
        kube = req.kubernetes
        if kube is None:  # needs_allocation() is only true for Kubernetes containers
            raise RequestError("internal: allocation needed without a Kubernetes identity")
        reader = checkpoint_source or _default_checkpoint
        try:
            allocation = reader(config.policy.checkpoint, kube.pod_uid, kube.container_name)
        except CheckpointError as exc:
            allocation_error = str(exc)

    decision = policy.decide(
        req, config.policy, config.default_capabilities, inventory, allocation, allocation_error
    )
    mps_plan: MpsPlan | None = None
    if config.mps.enabled and decision.devices:
        mps_plan = _mps(decision, inventory(), config, req, mps_probe, mps_usage_source)
    docker_hook = any(c.channel == "docker-gpus" for c in req.channels)
    try:
        container_edits = discover.edits_for(
            decision,
            inventory() if decision.injects else None,
            config,
            docker_hook,
            mps_plan,
            rootfs,
        )
    except discover.MissingDevice as exc:
        raise RequestError(str(exc)) from None
    new_spec = edits.apply(spec, container_edits) if not container_edits.is_empty() else spec
    return Outcome(
        req,
        decision,
        container_edits,
        new_spec,
        new_spec != spec,
        allocation,
        allocation_error,
        cache[0] if cache else None,
        mps_plan,
    )


def _mps(
    decision: Decision,
    inventory: Inventory,
    config: Config,
    req: Request,
    probe: MpsProbe | None,
    usage_source: MpsUsageSource | None,
) -> MpsPlan | None:
    """The MPS plan of a grant (None when it holds no MPS-shared GPU), checked against the
    daemon's state and, under ``reject``, the limits of the live containers."""
    from gpuhook import sharing

    plan = sharing.plan(decision, inventory, config.mps, config.source, req)
    if plan is None:
        return None
    if (probe or _default_mps_probe)(plan.pipe_dir) is None:
        gpus = ",".join(str(d.gpu_index) for d in plan.devices)
        what = "GPUs" if len(plan.devices) > 1 else "GPU"
        raise MpsError(
            f"the MPS control daemon of {what} {gpus} (group {plan.group}) is not running; "
            f"start it: gpuhook mps start {plan.group}"
        )
    if config.mps.oversubscription == "reject" and any(d.counted for d in plan.devices):
        if usage_source is None:
            from gpuhook import records

            sharing.check_memory(plan, records.mps_usage(config, ""), config.mps.oversubscription)
        else:
            sharing.check_memory(plan, usage_source(), config.mps.oversubscription)
    return plan

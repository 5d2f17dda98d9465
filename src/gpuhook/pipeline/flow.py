"""The one function the runtime shim and ``gpuhook inspect spec`` both call.

spec (raw dict) -> request -> policy -> discover -> edits -> new spec. Pure apart from the two
sources it is given (the inventory and the kubelet checkpoint), which are read only when the
decision needs them: a container with no request reads neither, a refused Kubernetes request
reads only the checkpoint.
"""

from __future__ import annotations

from gpuhook.errors import CheckpointError, MpsError, RequestError
from gpuhook.model.frozen import Frozen
from gpuhook.pipeline import apply, engine, identity, inject, policy, request

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.decision import Decision, Request
    from gpuhook.model.edits import ContainerEdits
    from gpuhook.model.inventory import Inventory
    from gpuhook.pipeline.compat import CompatChoice, CompatLibrary
    from gpuhook.pipeline.engine import AllocationSource
    from gpuhook.pipeline.identity import Client
    from gpuhook.pipeline.kubelet import Allocation
    from gpuhook.pipeline.sharing import MpsPlan

    InventorySource = Callable[[Config], Inventory]
    CompatSource = Callable[[str], CompatLibrary | None]  # rootfs -> its forward compat libcuda
    CheckpointSource = Callable[[str, str, str], Allocation]
    MpsProbe = Callable[[str], int | None]  # pipe dir -> control daemon pid, None when down
    MpsAdmit = Callable[[MpsPlan], None]  # raises a one-line GpuhookError when it cannot be


class Outcome(Frozen):
    request: Request
    decision: Decision
    edits: ContainerEdits
    spec: dict[str, Any]
    changed: bool
    allocation: Allocation | None
    allocation_error: str
    inventory: Inventory | None
    mps: MpsPlan | None = None


def run(
    spec: dict[str, Any],
    config: Config,
    *,
    inventory_source: InventorySource,
    checkpoint_source: CheckpointSource,
    mps_probe: MpsProbe,
    mps_admit: MpsAdmit,
    rootfs: str = "",
    parsed: Request | None = None,
    compat_source: CompatSource | None = None,
    allocation_sources: tuple[AllocationSource, ...] = (),
) -> Outcome:
    """Decide and compute the new spec. Raises GpuhookError subclasses with one-line messages.

    The sources are the only I/O, each called only when the decision needs it (the runtime's
    defaults are in :mod:`gpuhook.runtime.decide`): the inventory, the kubelet checkpoint, and for
    a grant of MPS-shared GPUs whether the group's control daemon runs (``mps_probe``) and
    whether the container fits beside the live ones (``mps_admit``,
    :mod:`gpuhook.mps.admission`). ``rootfs``: the container's absolute rootfs when known.
    ``parsed``: the caller's ``request.parse(spec, config.policy.kubelet_dir)``, when it has it.
    ``compat_source``: the CUDA forward compatibility libcuda the image at ``rootfs`` ships, asked
    only for a compute grant of GPUs with ``inject.cuda_compat`` on. ``allocation_sources``:
    allocations besides the checkpoint (DRA's), to verify GPUs the engine injected."""
    req = parsed or request.parse(spec, config.policy.kubelet_dir, config.policy.cdi_kinds)
    inventory = _Memo(inventory_source, config)
    allocation, allocation_error = _allocation(req, config, checkpoint_source)
    found = (allocation, allocation_error)
    decision = _decide(req, config, inventory, found, allocation_sources)
    # the image first: MPS admission holds the node-wide lock until the record is written
    compat = _compat(decision, inventory, config, rootfs, compat_source)
    mps_plan: MpsPlan | None = None
    if config.mps.enabled and decision.devices and _sharable(decision, req):
        client = identity.client_of(spec)
        mps_plan = _mps(decision, inventory(), config, req, client, mps_probe, mps_admit)
    try:
        container_edits = inject.edits_for(
            decision,
            inventory() if decision.injects else None,
            config,
            request.nvidia_hooks(spec),  # removed whatever the decision (hooks.d puts them
            mps_plan,  # into every container; run, it would act on the image's env)
            rootfs,
            spec,
            compat,
        )
    except inject.MissingDevice as exc:
        raise RequestError(str(exc)) from None
    new_spec = apply.apply(spec, container_edits) if not container_edits.is_empty() else spec
    return Outcome(
        req,
        decision,
        container_edits,
        new_spec,
        new_spec != spec,
        allocation,
        allocation_error,
        inventory.loaded,
        mps_plan,
    )


def _sharable(decision: Decision, req: Request) -> bool:
    """Whether MPS may apply: to GPUs the engine alone gave only where an allocation was
    verified (a Kubernetes pod's device plugin or DRA claim: a shared claim gets its MPS
    share), never to a privileged container's or a standalone --device."""
    return not engine.engine_only(decision) or engine.needs_allocation(req)


def _compat(
    decision: Decision,
    inventory: _Memo,
    config: Config,
    rootfs: str,
    source: CompatSource | None,
) -> CompatChoice | None:
    """The forward compatibility decision for the image, None when there is none to take (no
    compute grant of GPUs, turned off, no rootfs, or the image ships no compat libcuda)."""
    wanted = decision.injects and decision.devices and "compute" in decision.capabilities
    wanted = wanted and not engine.engine_only(decision)
    if source is None or not (wanted and rootfs and config.cuda_compat):
        return None
    lib = source(rootfs)
    if lib is None:
        return None
    from gpuhook.pipeline import compat

    inv = inventory()
    brand = {g.index: g.brand for g in inv.gpus}
    return compat.choose(
        lib, inv.driver_version, [brand.get(d.gpu_index, 0) for d in decision.devices]
    )


class _Memo:
    """The inventory source, called at most once (and only when the decision needs it)."""

    def __init__(self, source: InventorySource, config: Config) -> None:
        self._source = source
        self._config = config
        self.loaded: Inventory | None = None

    def __call__(self) -> Inventory:
        if self.loaded is None:
            self.loaded = self._source(self._config)
        return self.loaded


def _decide(
    req: Request,
    config: Config,
    inventory: _Memo,
    checkpoint: tuple[Allocation | None, str],
    sources: tuple[AllocationSource, ...],
) -> Decision:
    """The policy's decision, then the GPUs the engine injected (:mod:`gpuhook.pipeline.engine`)."""
    decided = policy.decide(req, config.policy, config.default_capabilities, inventory, *checkpoint)
    return _engine(decided, req, config, inventory, checkpoint, sources)


def _engine(
    decision: Decision,
    req: Request,
    config: Config,
    inventory: _Memo,
    checkpoint: tuple[Allocation | None, str],
    sources: tuple[AllocationSource, ...],
) -> Decision:
    """The decision with the GPUs the engine injected, verified against every allocation
    source: the kubelet checkpoint first, then ``sources``."""
    if not req.engine_devices:
        return decision
    allocated: tuple[engine.Allocated, ...] = ()
    if engine.needs_allocation(req) and req.kubernetes is not None:
        kube = req.kubernetes
        first = engine.from_checkpoint(*checkpoint, config.policy)
        allocated = (first, *(source(kube) for source in sources))

    def capabilities() -> tuple[str, ...]:
        try:
            return policy.parse_capabilities(req.driver_capabilities, config.default_capabilities)
        except RequestError:  # the engine's devices are kept whatever the image's env says
            return config.default_capabilities

    return engine.reconcile(decision, req, config.policy, inventory, allocated, capabilities)


def _allocation(
    req: Request, config: Config, checkpoint_source: CheckpointSource
) -> tuple[Allocation | None, str]:
    """The checkpoint's allocation to the container when the policy needs it (a request to
    verify, or GPUs the engine injected), or why it could not be read."""
    kube = req.kubernetes
    wanted = policy.needs_allocation(req, config.policy) or engine.needs_allocation(req)
    if kube is None or not wanted:
        return None, ""
    try:
        return checkpoint_source(config.policy.checkpoint, kube.pod_uid, kube.container_name), ""
    except CheckpointError as exc:
        return None, str(exc)


def _mps(
    decision: Decision,
    inventory: Inventory,
    config: Config,
    req: Request,
    client: Client,
    probe: MpsProbe,
    admit: MpsAdmit,
) -> MpsPlan | None:
    """The MPS plan of a grant (None when it holds no MPS-shared GPU), checked against the
    daemon's state and admitted beside the live containers."""
    from gpuhook.pipeline import sharing

    plan = sharing.plan(decision, inventory, config.mps, config.source, req, client)
    if plan is None:
        return None
    if probe(plan.pipe_dir) is None:
        gpus = ",".join(str(d.gpu_index) for d in plan.devices)
        what = "GPUs" if len(plan.devices) > 1 else "GPU"
        raise MpsError(
            f"the MPS control daemon of {what} {gpus} (group {plan.group}) is not running; "
            f"start it: gpuhook mps start {plan.group}"
        )
    admit(plan)
    return plan

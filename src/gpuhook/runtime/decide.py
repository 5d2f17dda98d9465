"""The I/O side of a decision: the real sources handed to the pure pipeline.

The one way into the core for every front end (docs/architecture.md, "Layers and front ends"):
:func:`run` is the only caller of :func:`gpuhook.pipeline.flow.run`. The OCI runtime's shim,
``gpuhook inspect spec`` and the NRI plugin call it; their own input and output are converted at
their translation points, not here.

:func:`gpuhook.pipeline.flow.run` is pure apart from the sources it is given. Here are the ones a
real create (and ``gpuhook inspect spec``) uses: the inventory file (refreshed lazily when
missing or stale), the kubelet's device checkpoint, the MPS control daemon's pid file, MPS
admission (:mod:`gpuhook.mps.admission`) and the image's CUDA forward compatibility libraries
(read inside its rootfs without following its links out of it). Each is imported only when the
decision asks for it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.decision import KubeIdentity, Request
    from gpuhook.model.inventory import Inventory
    from gpuhook.pipeline.compat import CompatLibrary
    from gpuhook.pipeline.engine import Allocated, AllocationSource
    from gpuhook.pipeline.flow import (
        CheckpointSource,
        CompatSource,
        InventorySource,
        MpsAdmit,
        MpsProbe,
        Outcome,
    )
    from gpuhook.pipeline.kubelet import Allocation
    from gpuhook.pipeline.sharing import MpsPlan


def rootfs_of(bundle: str, spec: dict[str, Any]) -> str:
    """The container's absolute rootfs (root.path against the bundle), "" when the spec has none
    (runc rejects such a spec itself)."""
    from gpuhook.errors import SpecError
    from gpuhook.runtime import ocispec

    try:
        return ocispec.rootfs(bundle, spec)
    except SpecError:
        return ""


def inventory(config: Config) -> Inventory:
    from gpuhook.inventory import store

    return _present(store.load_current(config, finish=_prepared))


def _present(inventory: Inventory) -> Inventory:
    """``inventory`` less its prepared driver folders when their generation is gone (a state
    folder wiped under it): every set then gets per-file mounts. One stat."""
    import os

    if inventory.prepared and not os.path.isdir(os.path.dirname(inventory.prepared[0][1])):
        return inventory.replace(prepared=())
    return inventory


def _prepared(config: Config, inventory: Inventory) -> Inventory:
    """A refreshed inventory with its driver's prepared folders (imported only then)."""
    from gpuhook.runtime import prepared

    return prepared.finish(config, inventory)


def checkpoint(path: str, pod_uid: str, container: str) -> Allocation:
    from gpuhook.pipeline import kubelet

    return kubelet.read_allocation(path, pod_uid, container)


def dra_claims(config: Config, inventory: Callable[[], Inventory]) -> AllocationSource:
    """The kubelet's DRA state (``<kubelet_dir>/dra_manager_state``) as an allocation source:
    what the pod's prepared claims hold (:mod:`gpuhook.pipeline.dra`), read only when asked."""

    def source(kube: KubeIdentity) -> Allocated:
        import os

        from gpuhook.errors import CheckpointError
        from gpuhook.pipeline import dra
        from gpuhook.pipeline.engine import Allocated

        path = os.path.join(config.policy.kubelet_dir, dra.STATE_IN_KUBELET_DIR)
        try:
            state = dra.read_state(path)
        except CheckpointError as exc:
            return Allocated(f"the kubelet's DRA state {path}", error=str(exc))
        return dra.allocated(state, kube.pod_uid, inventory())

    return source


class _Once:
    """An inventory source called at most once, shared by the pipeline and the DRA source."""

    def __init__(self, source: InventorySource) -> None:
        self._source = source
        self._loaded: Inventory | None = None

    def __call__(self, config: Config) -> Inventory:
        if self._loaded is None:
            self._loaded = self._source(config)
        return self._loaded


def compat_library(rootfs: str) -> CompatLibrary | None:
    """The image's forward compatibility libcuda. Whatever goes wrong reading it makes it
    unusable (a reason for ``inspect``), never a failed create: the host's libcuda still works."""
    from gpuhook.runtime import imagefs

    try:
        return imagefs.compat_library(rootfs)
    except Exception as exc:  # a malformed image must not fail a GPU container
        from gpuhook.pipeline.compat import COMPAT_DIR, CompatLibrary

        return CompatLibrary(COMPAT_DIR, problem=f"{COMPAT_DIR} could not be read ({exc!r})")


def mps_probe(pipe_dir: str) -> int | None:
    from gpuhook.mps import daemons

    return daemons.control_pid(pipe_dir)


def read_only_admission(config: Config, exclude_bundle: str = "") -> MpsAdmit:
    """MPS admission read-only, as ``gpuhook inspect spec`` runs it (no lock), leaving out the
    bundle of a dry run over a live container (the shim admits under the accounting lock:
    ``shim._ledger``)."""

    def admit(plan: MpsPlan) -> None:
        from gpuhook.mps import admission

        admission.Ledger(config, exclude_bundle=exclude_bundle, locked=False)(plan)

    return admit


def run(
    spec: dict[str, Any],
    config: Config,
    *,
    bundle: str = "",
    rootfs: str | None = None,
    inventory_source: InventorySource = inventory,
    checkpoint_source: CheckpointSource = checkpoint,
    mps_probe: MpsProbe = mps_probe,
    mps_admit: MpsAdmit | None = None,
    parsed: Request | None = None,
    compat_source: CompatSource = compat_library,
    allocation_sources: tuple[AllocationSource, ...] | None = None,
) -> Outcome:
    """:func:`gpuhook.pipeline.flow.run` with the node's real sources (any one can be replaced,
    as tests do) and the rootfs taken from ``bundle`` unless given ("" without either).
    ``allocation_sources``: allocations besides the kubelet checkpoint, to verify the GPUs the
    engine injected (default: the pod's DRA claims, :func:`dra_claims`)."""
    from gpuhook.pipeline import flow

    once = _Once(inventory_source)
    if allocation_sources is None:
        allocation_sources = (dra_claims(config, lambda: once(config)),)

    return flow.run(
        spec,
        config,
        inventory_source=once,
        checkpoint_source=checkpoint_source,
        mps_probe=mps_probe,
        mps_admit=mps_admit or read_only_admission(config),
        rootfs=rootfs if rootfs is not None else rootfs_of(bundle, spec) if bundle else "",
        parsed=parsed,
        compat_source=compat_source,
        allocation_sources=allocation_sources,
    )

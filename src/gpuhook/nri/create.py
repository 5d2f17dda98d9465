"""A CreateContainer, decided by the shim's core; Synchronize's records.

:func:`adjust` is the plugin's counterpart of the shim's create: NRI's container as the raw
spec (:func:`gpuhook.nri.translate.spec_of`), parsed by :func:`gpuhook.pipeline.request.parse`,
decided by :func:`gpuhook.runtime.decide.run` (the real sources: inventory, kubelet checkpoint,
MPS) with MPS admission under the accounting lock until the record is written, and the new spec
answered as an NRI adjustment. A container with no GPU request gets an empty adjustment and no
record, whatever goes wrong in gpuhook (as the shim passes it to the runtime). A GPU request
that cannot be honoured raises one line: the engine fails the create with it.
"""

from __future__ import annotations

import time

from gpuhook.errors import GpuhookError
from gpuhook.nri import state, translate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.decision import Request
    from gpuhook.nri import nri_api_pb2 as api

    LoadConfig = Callable[[], Config]

CREATED = 1  # NRI's ContainerState
RUNNING = 3


def adjust(
    load_config: LoadConfig,
    runtime: str,
    pod: api.PodSandbox,
    ctr: api.Container,
    log: Callable[..., None],
) -> api.ContainerAdjustment:
    """The adjustment for one container. Raises GpuhookError or translate.Unadjustable."""
    from gpuhook.nri import nri_api_pb2 as api

    spec = translate.spec_of(pod, ctr, runtime)
    req, config, failure = _parse(load_config, spec)
    if not req.channels:
        return api.ContainerAdjustment()
    if failure is not None or config is None:
        raise failure or GpuhookError("no configuration")
    return _decide(config, ctr.id, spec, req, log)


def _parse(
    load_config: LoadConfig, spec: dict[str, Any]
) -> tuple[Request, Config | None, GpuhookError | None]:
    from gpuhook.config.types import KUBELET_DIR_DEFAULT
    from gpuhook.pipeline import request

    config: Config | None = None
    failure: GpuhookError | None = None
    try:
        config = load_config()
    except GpuhookError as exc:
        failure = exc
    kubelet_dir = config.policy.kubelet_dir if config else KUBELET_DIR_DEFAULT
    return request.parse(spec, kubelet_dir), config, failure


def _decide(
    config: Config, container_id: str, spec: dict[str, Any], req: Request, log: Callable[..., None]
) -> api.ContainerAdjustment:
    from gpuhook.runtime import decide

    started = time.monotonic()
    ledger = _ledger(config, container_id)
    try:
        admit = ledger or decide.read_only_admission(config)
        outcome = decide.run(spec, config, rootfs="", mps_admit=admit, parsed=req)
        answer = translate.adjustment(spec, outcome.spec)
        unwritten = state.write(config, container_id, outcome)
    finally:
        if ledger is not None:
            ledger.release()
    decision = outcome.decision
    log(
        "decision",
        container_id=container_id,
        channel=decision.channel,
        devices=[d.display_id for d in decision.devices],
        refused=decision.refused,
        kubernetes=req.kubernetes.to_dict() if req.kubernetes else None,
        record_error=unwritten or None,
        ms=round((time.monotonic() - started) * 1000, 1),
    )
    return answer


def _ledger(config: Config, container_id: str) -> Any:
    if not config.mps.enabled:
        return None
    from gpuhook.mps import admission

    return admission.Ledger(config, container_id)


def synchronize(
    load_config: LoadConfig,
    runtime: str,
    containers: list[tuple[api.PodSandbox, api.Container]],
    log: Callable[..., None],
) -> None:
    """The engine's containers at (re)connection: records written for the GPU containers that
    have none (decided read-only on the spec the engine holds, gpuhook's adjustment included),
    records removed for containers the engine no longer has. Never raises for one container."""
    try:
        config = load_config()
    except GpuhookError as exc:
        log("nri synchronize skipped", error=str(exc))
        return
    from gpuhook.runtime import decide

    live = {c.id for _, c in containers}
    for gone in state.known(config):
        if gone not in live:
            state.forget(config, gone)
    rebuilt = 0
    for pod, ctr in containers:
        running = ctr.state in (CREATED, RUNNING)
        if state.has_record(config, ctr.id):
            state.set_live(config, ctr.id, running)
            continue
        spec = translate.spec_of(pod, ctr, runtime)
        req, _, _ = _parse(lambda: config, spec)
        if not req.channels:
            continue
        try:
            outcome = decide.run(spec, config, rootfs="", parsed=req)
        except GpuhookError as exc:
            log("nri synchronize: no decision", container_id=ctr.id, error=str(exc))
            continue
        rebuilt += not state.write(config, ctr.id, outcome, live=running)
    log("nri synchronized", containers=len(containers), records_rebuilt=rebuilt)

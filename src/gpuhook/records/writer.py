"""Per-container decision records.

Each create whose spec carries a GPU marker writes ``<bundle>/gpuhook-decision.json``
(atomically; a container without any marker gets none: the dispatcher passes it to the
runtime without Python) and links it as
``<state_dir>/containers/<id>.json``. The engine removes the bundle when it deletes the
container, which removes the record with it without gpuhook running on ``delete``; the dangling
link is ignored by ``gpuhook inspect container`` and removed by ``gpuhook gc``. Writing a record
never blocks a container: failures are returned for the caller to log.
"""

from __future__ import annotations

import os
import time

from gpuhook import __version__, _fastjson
from gpuhook.fsutil import atomic_symlink, atomic_write, remove_stale_temps
from gpuhook.model.record import RECORD_VERSION
from gpuhook.records.ids import link_path, valid_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.decision import Request
    from gpuhook.pipeline.flow import Outcome

RECORD_NAME = "gpuhook-decision.json"


def build(
    container_id: str,
    bundle: str,
    decided: Outcome | Request,
    *,
    runtime: str = "",
    root: str = "",
    config: str = "",
    creator: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The record (its JSON Schema: ``schemas/record.schema.json``; as its readers see it:
    :class:`gpuhook.model.record.Record`).

    ``decided``: the outcome of a decided create, or the parsed request of a spec that carries
    a GPU marker but no GPU request (nothing was decided). ``runtime`` and ``root`` are the
    low-level runtime and its ``--root`` (its state folder, "" for its default); ``config`` the
    gpuhook config file that decided; ``creator`` the process that runs the runtime's create
    (pid and start time), which MPS admission counts as a live container until it exits.
    """
    from gpuhook.model.decision import Request

    record: dict[str, Any] = {
        "record_version": RECORD_VERSION,
        "container_id": container_id,
        "bundle": bundle,
        "gpuhook_version": __version__,
        "timestamp": time.time(),
        "config": config,
        "runtime": {"path": runtime, "root": root},
    }
    if creator is not None:
        record["runtime"]["creator"] = creator
    record.update(_undecided(decided) if isinstance(decided, Request) else decided_view(decided))
    return record


def _undecided(request: Request) -> dict[str, Any]:
    from gpuhook.model.edits import ContainerEdits
    from gpuhook.pipeline.policy import no_request

    return {
        "kubernetes": request.kubernetes.to_dict() if request.kubernetes else None,
        "request": request.to_dict(),
        "allocation": None,
        "allocation_error": "",
        "decision": no_request(ignored=request.ignored).to_dict(),  # each ignored part, with why
        "edits": ContainerEdits().to_dict(),
        "mps": None,  # MPS limits: none without a GPU
        "spec_changed": False,
    }


def decided_view(outcome: Outcome) -> dict[str, Any]:
    """What was decided and injected, as the record (and ``gpuhook inspect spec``) shows it."""
    req = outcome.request
    return {
        "kubernetes": req.kubernetes.to_dict() if req.kubernetes else None,
        "request": req.to_dict(),
        "allocation": outcome.allocation.to_dict() if outcome.allocation else None,
        "allocation_error": outcome.allocation_error,
        "decision": outcome.decision.to_dict(),
        "edits": outcome.edits.to_dict(),
        "spec_changed": outcome.changed,
        # MPS limits of a shared GPU (CUDA_MPS_* and the pipe directory), with their sources
        "mps": outcome.mps.to_dict() if outcome.mps is not None else None,
    }


def write(config: Config, container_id: str, bundle: str, record: dict[str, Any]) -> str:
    """Write the record and its link. Returns "" on success, else a one-line failure."""
    if not valid_id(container_id):
        return f"container id {container_id!r} is not a valid runc id; no record written"
    path = os.path.join(bundle, RECORD_NAME)
    remove_stale_temps(path)  # left by a create that was killed while writing its record
    try:
        atomic_write(path, _fastjson.dumps(record).encode(), 0o644, fsync=False)
    except (OSError, ValueError) as exc:
        return f"cannot write decision record {path}: {getattr(exc, 'strerror', None) or exc}"
    link = link_path(config.records_dir, container_id)
    try:
        try:
            os.symlink(path, link)
        except FileNotFoundError:
            os.makedirs(config.records_dir, mode=0o755, exist_ok=True)
            os.symlink(path, link)
    except FileExistsError:
        try:
            if os.readlink(link) != path:
                remove_stale_temps(link)
                atomic_symlink(path, link)
        except OSError as exc:
            return f"cannot link decision record {link}: {exc.strerror}"
    except OSError as exc:
        return f"cannot link decision record {link}: {exc.strerror}"
    return ""

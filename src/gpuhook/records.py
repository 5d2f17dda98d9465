"""Per-container decision records.

Each create writes ``<bundle>/gpuhook-decision.json`` (atomically) and links it as
``<state_dir>/containers/<id>.json``. The engine removes the bundle when it deletes the
container, which removes the record with it without gpuhook running on ``delete``; the dangling
link is ignored by ``gpuhook inspect container`` and removed by ``gpuhook gc``. Writing a record
never blocks a container: failures are returned for the caller to log.
"""

from __future__ import annotations

import os
import time

from gpuhook import __version__, _fastjson
from gpuhook.fsutil import atomic_write, remove_stale_temps, temp_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config import Config
    from gpuhook.pipeline import Outcome

RECORD_NAME = "gpuhook-decision.json"
RECORD_VERSION = 1
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+-.")


def valid_id(container_id: str) -> bool:
    """runc's rule for container ids (``^[\\w+-.]+$``), minus the names ``.`` and ``..``."""
    return (
        bool(container_id)
        and container_id not in (".", "..")
        and len(container_id) <= 1024
        and all(c in _ID_CHARS for c in container_id)
    )


def build(
    container_id: str, bundle: str, outcome: Outcome | None, note: str = ""
) -> dict[str, Any]:
    """The record. ``outcome`` None: the spec carried no GPU request (the byte pre-check)."""
    record: dict[str, Any] = {
        "record_version": RECORD_VERSION,
        "container_id": container_id,
        "bundle": bundle,
        "gpuhook_version": __version__,
        "timestamp": time.time(),
    }
    if outcome is None:
        record["kubernetes"] = None
        record["request"] = {"channels": []}
        record["decision"] = {
            "gpu_container": False,
            "devices": [],
            "refused": False,
            "reasons": [
                {
                    "channel": "-",
                    "value": "",
                    "verdict": "ignored",
                    "why": note or "no GPU request in the spec",
                }
            ],
        }
        record["edits"] = None
        record["spec_changed"] = False
        return record
    req = outcome.request
    record["kubernetes"] = req.kubernetes.to_dict() if req.kubernetes else None
    record["request"] = req.to_dict()
    record["allocation"] = outcome.allocation.to_dict() if outcome.allocation else None
    record["allocation_error"] = outcome.allocation_error
    record["decision"] = outcome.decision.to_dict()
    record["edits"] = outcome.edits.to_dict()
    record["spec_changed"] = outcome.changed
    return record


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
    link = os.path.join(config.records_dir, container_id + ".json")
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
                tmp = temp_name(link)
                os.symlink(path, tmp)
                try:
                    os.replace(tmp, link)
                except OSError:
                    os.unlink(tmp)
                    raise
        except OSError as exc:
            return f"cannot link decision record {link}: {exc.strerror}"
    except OSError as exc:
        return f"cannot link decision record {link}: {exc.strerror}"
    return ""

"""The NRI plugin's decision records: the shim's records, kept where the plugin can write them.

Under NRI the engine asks for adjustments before it makes the container's bundle, so a record
cannot live in the bundle as the shim's does. Each GPU-marked container's record is
``<state_dir>/nri/<container id>/gpuhook-decision.json``, linked from
``<state_dir>/containers/<id>.json`` as every record is (``gpuhook inspect`` reads them the same
way). RemoveContainer removes it; Synchronize, at each (re)connection, writes those missing for
the engine's containers and removes those of containers the engine no longer has.

MPS admission counts a container while its record names a live creator
(:func:`gpuhook.mps.admission.liveness`); the plugin knows no runtime state folder, so an MPS
client's record names the plugin itself as its creator from CreateContainer to StopContainer
(:func:`set_live`), and a restarted plugin names itself again in the records of the running
containers when it synchronizes.
"""

from __future__ import annotations

import os
import shutil

from gpuhook.records import writer
from gpuhook.records.ids import NRI_RECORDS, link_path, valid_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.decision import Request
    from gpuhook.pipeline.flow import Outcome

FOLDER = NRI_RECORDS
STATUS = "nri-plugin.json"  # <state_dir>/nri-plugin.json: the running plugin (gpuhook doctor)


def folder(config: Config, container_id: str) -> str:
    """The folder that holds the container's record ("" for an id that is not a valid one)."""
    if not valid_id(container_id):
        return ""
    return os.path.join(config.state_dir, FOLDER, container_id)


def has_record(config: Config, container_id: str) -> bool:
    where = folder(config, container_id)
    return bool(where) and os.path.exists(os.path.join(where, writer.RECORD_NAME))


def write(config: Config, container_id: str, decided: Outcome | Request, live: bool = True) -> str:
    """Write the container's record (an MPS client's naming the plugin as its creator while
    ``live``); "" on success, else the one-line failure."""
    where = folder(config, container_id)
    if not where:
        return f"container id {container_id!r} is not a valid id; no record written"
    try:
        os.makedirs(where, mode=0o755, exist_ok=True)
        creator = _me() if live and getattr(decided, "mps", None) is not None else None
        record = writer.build(container_id, where, decided, config=config.source, creator=creator)
    except Exception as exc:  # a record must never block a container
        return f"record failed: {exc!r}"
    return writer.write(config, container_id, where, record)


def forget(config: Config, container_id: str) -> None:
    """Remove the container's record and its link (when they are the plugin's)."""
    where = folder(config, container_id)
    if not where:
        return
    link = link_path(config.records_dir, container_id)
    try:
        if os.readlink(link) == os.path.join(where, writer.RECORD_NAME):
            os.unlink(link)
    except OSError:
        pass
    shutil.rmtree(where, ignore_errors=True)


def known(config: Config) -> list[str]:
    """The container ids the plugin holds records for."""
    try:
        return sorted(os.listdir(os.path.join(config.state_dir, FOLDER)))
    except OSError:
        return []


def _me() -> dict[str, int] | None:
    from gpuhook.mps import admission

    return admission.creator(os.getpid())


def set_live(config: Config, container_id: str, live: bool) -> None:
    """Name the plugin as the creator of an MPS client's record (``live``), or no creator (it
    stopped: MPS admission no longer counts it). Records of no MPS client are left alone."""
    from gpuhook import _fastjson
    from gpuhook.fsutil import atomic_write

    path = os.path.join(folder(config, container_id) or "/nonexistent", writer.RECORD_NAME)
    try:
        with open(path, "rb") as fh:
            record = _fastjson.loads(fh.read())
        if not isinstance(record, dict) or not record.get("mps"):
            return
        runtime = record.setdefault("runtime", {})
        creator = _me() if live else None
        if runtime.get("creator") == creator:
            return
        if creator is None:
            runtime.pop("creator", None)
        else:
            runtime["creator"] = creator
        atomic_write(path, _fastjson.dumps(record).encode(), 0o644, fsync=False)
    except (OSError, ValueError):
        pass


def announce(config: Config, socket: str, plugin: str) -> None:
    """Say that this process is the node's registered NRI plugin (``gpuhook doctor`` reads it);
    best effort."""
    from gpuhook import _fastjson
    from gpuhook.fsutil import atomic_write

    status = {"pid": os.getpid(), "start": _start(), "socket": socket, "plugin": plugin}
    try:
        os.makedirs(config.state_dir, mode=0o755, exist_ok=True)
        atomic_write(
            os.path.join(config.state_dir, STATUS), _fastjson.dumps(status).encode(), 0o644
        )
    except (OSError, ValueError):
        pass


def retire(config: Config) -> None:
    """Remove this process's status (when it is this process's)."""
    path = os.path.join(config.state_dir, STATUS)
    if (running(config) or {}).get("pid") == os.getpid():
        try:
            os.unlink(path)
        except OSError:
            pass


def running(config: Config) -> dict[str, Any] | None:
    """The status of the NRI plugin that runs now (None when none announced itself or it
    exited)."""
    from gpuhook import _fastjson
    from gpuhook.mps import admission

    try:
        with open(os.path.join(config.state_dir, STATUS), "rb") as fh:
            status = _fastjson.loads(fh.read())
    except (OSError, ValueError):
        return None
    if not isinstance(status, dict) or not isinstance(status.get("pid"), int):
        return None
    alive = admission.start_time(status["pid"]) == status.get("start")
    return status if alive else None


def _start() -> int | None:
    from gpuhook.mps import admission

    return admission.start_time(os.getpid())

"""The NRI plugin's decision records: the shim's records, kept where the plugin can write them.

Under NRI the engine asks for adjustments before it makes the container's bundle, so a record
cannot live in the bundle as the shim's does. Each GPU-marked container's record is
``<state_dir>/nri/<container id>/gpuhook-decision.json``, linked from
``<state_dir>/containers/<id>.json`` as every record is (``gpuhook inspect`` reads them the same
way). RemoveContainer removes it; Synchronize, at each (re)connection, writes those missing for
the engine's containers and removes those of containers the engine no longer has.
"""

from __future__ import annotations

import os
import shutil

from gpuhook.records import writer
from gpuhook.records.ids import link_path, valid_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuhook.config.types import Config
    from gpuhook.model.decision import Request
    from gpuhook.pipeline.flow import Outcome

FOLDER = "nri"


def folder(config: Config, container_id: str) -> str:
    """The folder that holds the container's record ("" for an id that is not a valid one)."""
    if not valid_id(container_id):
        return ""
    return os.path.join(config.state_dir, FOLDER, container_id)


def has_record(config: Config, container_id: str) -> bool:
    where = folder(config, container_id)
    return bool(where) and os.path.exists(os.path.join(where, writer.RECORD_NAME))


def write(config: Config, container_id: str, decided: Outcome | Request) -> str:
    """Write the container's record; "" on success, else the one-line failure."""
    where = folder(config, container_id)
    if not where:
        return f"container id {container_id!r} is not a valid id; no record written"
    try:
        os.makedirs(where, mode=0o755, exist_ok=True)
        record = writer.build(container_id, where, decided, config=config.source)
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

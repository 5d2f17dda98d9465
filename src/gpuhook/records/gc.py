"""``gpuhook gc``: remove the links of deleted containers from ``<state_dir>/containers/``.

The engine deletes the bundle with the container, so a dangling link is a deleted container. A
link that still resolves may belong to a container that the runtime no longer knows (``runc
run`` returns after removing its container, an engine that keeps bundles): ``gc`` asks the
configured runtime, with the ``--root`` the record names (``<runtime> --root <root> state <id>``),
and removes the link only when the runtime says the container does not exist and its state folder
agrees. The exec-env markers of containers the runtime no longer has go the same way.
"""

from __future__ import annotations

import os
import time

from gpuhook.errors import GpuhookError
from gpuhook.fsutil import temp_base
from gpuhook.model.frozen import Frozen
from gpuhook.records.ids import NRI_RECORDS, SUFFIX, link_id
from gpuhook.records.lookup import (
    DEFAULT_ROOTS,
    DELETED,
    UNREADABLE,
    created_at,
    entry_of,
    query_state,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuhook.config.types import Config

    StateProbe = Callable[[str, str, str], tuple[bool | None, str]]

GC_GRACE_S = 60.0


class GcItem:
    """What gc did (or would do) with one link, and why."""

    def __init__(self, container_id: str, link: str, removed: bool, reason: str) -> None:
        self.container_id = container_id
        self.link = link
        self.removed = removed
        self.reason = reason

    def to_dict(self) -> dict[str, Any]:
        return {
            "container_id": self.container_id,
            "link": self.link,
            "action": "remove" if self.removed else "keep",
            "reason": self.reason,
        }


class GcReport:
    def __init__(self, folder: str, dry_run: bool, items: list[GcItem], live: int) -> None:
        self.folder = folder
        self.dry_run = dry_run
        self.items = items
        self.live = live

    @property
    def removed(self) -> list[GcItem]:
        return [i for i in self.items if i.removed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "records_dir": self.folder,
            "dry_run": self.dry_run,
            "removed": [i.to_dict() for i in self.items if i.removed],
            "kept": [i.to_dict() for i in self.items if not i.removed],
            "live": self.live,
        }


def runtime_state(runtime: str, root: str, container_id: str) -> tuple[bool | None, str]:
    """Whether the runtime still has the container: True, False, or None when it cannot tell.

    False needs two witnesses: ``<runtime> [--root ROOT] state ID`` fails, and the runtime's
    state folder has no entry for the id (runc and crun keep ``<root>/<id>/``).
    """
    name = os.path.basename(runtime)
    if not runtime or not (os.path.isfile(runtime) and os.access(runtime, os.X_OK)):
        return None, f"cannot tell: runtime {runtime or '(none recorded)'} not found"
    try:
        code, _ = query_state(runtime, root, container_id)
    except OSError as exc:
        return None, f"cannot tell: {exc}"
    state_root = root or DEFAULT_ROOTS.get(name, "")
    where = f"{name} state (root {state_root or 'default'})"
    if code == 0:
        return True, f"alive in {where}"
    if not state_root:
        return None, f"cannot tell: {name} state failed and its state folder is unknown"
    if os.path.lexists(os.path.join(state_root, container_id)):
        return None, f"cannot tell: {name} state failed but {state_root}/{container_id} exists"
    return False, f"not in {where}: the container was deleted; its bundle remains"


def gc(
    config: Config,
    *,
    dry_run: bool = False,
    grace_s: float = GC_GRACE_S,
    now: float | None = None,
    probe: StateProbe = runtime_state,
) -> GcReport:
    """Remove (or with ``dry_run`` list) the links of deleted containers.

    Removed: dangling links (the engine deleted the bundle), links to records of containers the
    runtime no longer has, and temporary links an interrupted write left. Kept: live
    containers, records younger than ``grace_s`` (a create may still be under way), and
    anything gc cannot judge (said why). Only links are removed; records live in the bundles.
    """
    folder = config.records_dir
    now = time.time() if now is None else now
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return GcReport(folder, dry_run, [], 0)
    plugin_records = os.path.join(config.state_dir, NRI_RECORDS) + "/"
    run = _Pass(config.runtime, now, grace_s, dry_run, probe, plugin_records)
    items: list[GcItem] = []
    live = 0
    for name in names:
        item = _judge(folder, name, run)
        if item is LIVE_ITEM:
            live += 1
        elif item is not None:
            items.append(item)
    items += _gc_exec_env(config, run)
    return GcReport(folder, dry_run, items, live)


class _Pass(Frozen):
    """The settings of one gc run."""

    runtime: str
    now: float
    grace_s: float
    dry_run: bool
    probe: StateProbe
    plugin_records: str = ""  # <state_dir>/nri/: the NRI plugin's own records


LIVE_ITEM = GcItem("", "", False, "alive")  # what _judge returns for a live container


def _judge(folder: str, name: str, run: _Pass) -> GcItem | None:
    """What gc does with one entry of the records folder; None: not gc's (another file)."""
    link = os.path.join(folder, name)
    if temp_base(name).endswith(SUFFIX):
        if _age(link, run.now) < run.grace_s:
            return None
        return _remove(link, name, "leftover of an interrupted record write", run.dry_run)
    if not link_id(name):
        return None
    entry = entry_of(folder, name)
    if entry.state == DELETED:
        bundle = os.path.dirname(entry.target)
        why = f"bundle {bundle} is gone: the engine deleted the container"
        return _remove(link, entry.container_id, why, run.dry_run, expect=entry.target)
    if entry.state == UNREADABLE or entry.record is None:
        return GcItem(entry.container_id, link, False, f"kept: {entry.problem}")
    if run.plugin_records and entry.target.startswith(run.plugin_records):
        why = "kept: the NRI plugin's record (it removes it when the engine removes the container)"
        return GcItem(entry.container_id, link, False, why)
    age = run.now - created_at(entry)
    if age < run.grace_s:
        why = f"kept: created {int(age)}s ago, too recent to judge (--grace {run.grace_s:g})"
        return GcItem(entry.container_id, link, False, why)
    # The configured runtime, never a path read from a file inside the bundle; the record only
    # says which of its state folders (--root) the container was created in.
    alive, detail = run.probe(run.runtime, entry.record.runtime.root, entry.container_id)
    if alive:
        return LIVE_ITEM
    if alive is None:
        return GcItem(entry.container_id, link, False, f"kept: {detail}")
    return _remove(link, entry.container_id, detail, run.dry_run, expect=entry.target)


def _gc_exec_env(config: Config, run: _Pass) -> list[GcItem]:
    """The exec-env markers of containers the configured runtime no longer has (a delete that
    did not pass through gpuhook-runtime, ``runc run`` without -d)."""
    from gpuhook.records import execenv

    folder = os.path.join(config.state_dir, execenv.DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    items = []
    for name in names:
        path = os.path.join(folder, name)
        if _age(path, run.now) < run.grace_s:
            continue
        try:
            marker = execenv.load(config.state_dir, name) or {}
        except GpuhookError:
            marker = {}
        root = marker.get("root", "")
        alive, detail = run.probe(run.runtime, root if isinstance(root, str) else "", name)
        if alive is False:
            items.append(_remove(path, name, f"exec-env marker: {detail}", run.dry_run))
    return items


def _age(path: str, now: float) -> float:
    try:
        return now - os.lstat(path).st_mtime
    except OSError:
        return 0.0


def _remove(link: str, name: str, reason: str, dry_run: bool, expect: str = "") -> GcItem:
    if dry_run:
        return GcItem(name, link, True, reason)
    try:
        if expect and os.readlink(link) != expect:
            return GcItem(name, link, False, "kept: re-created while gc ran")
        os.unlink(link)
    except FileNotFoundError:
        pass  # removed by someone else meanwhile: the outcome gc wanted
    except OSError as exc:
        return GcItem(name, link, False, f"kept: cannot remove {link}: {exc.strerror}")
    return GcItem(name, link, True, reason)

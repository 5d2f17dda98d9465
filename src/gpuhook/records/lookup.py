"""Decision records on the reading side: find one by container id or unique prefix, list them,
and collect the links of deleted containers (``gpuhook gc``).

The shim writes each record into the container's bundle and links it as
``<state_dir>/containers/<id>.json`` (:mod:`gpuhook.records.writer`).
The engine deletes the bundle with
the container, so a dangling link is a deleted container. A link that still resolves may belong
to a container that the runtime no longer knows (``runc run`` returns after removing its
container, an engine that keeps bundles): ``gc`` asks the configured runtime, with the
``--root`` the record names (``<runtime> --root <root> state <id>``), and removes the link only
when the runtime says the container does not exist and its state folder agrees.

A container whose spec carries no GPU marker has no record (the dispatcher passes it to the
runtime without Python): :func:`unrecorded` finds it through the runtime's state instead.
"""

from __future__ import annotations

import os
import time

from gpuhook import _fastjson
from gpuhook.errors import AmbiguousIdError, GpuhookError, RecordNotFoundError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuhook.config import Config

    StateProbe = Callable[[str, str, str], tuple[bool | None, str]]

SUFFIX = ".json"
LIVE = "live"
DELETED = "deleted"
UNREADABLE = "unreadable"
GC_GRACE_S = 60.0
# Where a runtime keeps its containers' state when it is run without --root (as root).
DEFAULT_ROOTS = {"runc": "/run/runc", "crun": "/run/crun"}
# The --root folders the engines gpuhook registers with give their runtime (docker; containerd's
# namespaces are the folders under /run/containerd/runc).
ENGINE_ROOTS = ("/run/docker/runtime-runc/moby",)
CONTAINERD_ROOTS = "/run/containerd/runc"
MAX_RECORD_BYTES = 16 * 1024 * 1024


class Entry:
    """One link in the records folder and what it leads to."""

    def __init__(
        self,
        container_id: str,
        link: str,
        target: str,
        state: str,
        record: dict[str, Any] | None,
        problem: str = "",
    ) -> None:
        self.container_id = container_id
        self.link = link
        self.target = target
        self.state = state
        self.record = record
        self.problem = problem


def schema() -> dict[str, Any]:
    """The JSON Schema of a record, as shipped in the package."""
    from importlib import resources

    text = resources.files("gpuhook").joinpath("schemas/record.schema.json").read_bytes()
    loaded = _fastjson.loads(text)
    if not isinstance(loaded, dict):
        raise ValueError("the packaged record schema is not a JSON object")
    return loaded


def read_record(path: str) -> dict[str, Any]:
    """A record file as a dict. OSError when it cannot be read, ValueError when it is not one."""
    with open(path, "rb") as fh:
        raw = fh.read(MAX_RECORD_BYTES + 1)
    if len(raw) > MAX_RECORD_BYTES:
        raise ValueError("larger than 16 MiB")
    record = _fastjson.loads(raw)
    if not isinstance(record, dict) or not isinstance(record.get("decision"), dict):
        raise ValueError("not a gpuhook decision record")
    return record


def _entry(folder: str, name: str) -> Entry:
    container_id = name[: -len(SUFFIX)]
    link = os.path.join(folder, name)
    try:
        target = os.readlink(link)
    except OSError:
        target = link  # a plain file (not written by gpuhook-runtime, but readable all the same)
    try:
        record = read_record(link)
    except FileNotFoundError:
        return Entry(container_id, link, target, DELETED, None, "the bundle is gone")
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        return Entry(container_id, link, target, UNREADABLE, None, f"unreadable record: {why}")
    return Entry(container_id, link, target, LIVE, record)


def scan(folder: str) -> list[Entry]:
    """Every record link in ``folder``, oldest first (live records by their timestamp)."""
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    entries = [_entry(folder, n) for n in names if n.endswith(SUFFIX) and len(n) > len(SUFFIX)]
    return sorted(entries, key=lambda e: (_timestamp(e), e.container_id))


def _timestamp(entry: Entry) -> float:
    if entry.record is not None and isinstance(entry.record.get("timestamp"), (int, float)):
        return float(entry.record["timestamp"])
    try:
        return os.lstat(entry.link).st_mtime
    except OSError:
        return 0.0


def no_record_hint(config: Config) -> str:
    return (
        "gpuhook-runtime writes a record whenever it creates a container, so this container "
        "was created by another runtime or before gpuhook became the engine's runtime "
        "(register it with: gpuhook runtime configure --runtime docker|containerd "
        f"--set-as-default, then recreate the container), or its record could not be written "
        f"(see {config.log_file or 'the log'})"
    )


def find(config: Config, wanted: str) -> Entry:
    """The live record of a container id, or of the one container whose id starts with
    ``wanted``. RecordNotFoundError / AmbiguousIdError with one line otherwise."""
    folder = config.records_dir
    if not wanted or "/" in wanted or wanted in (".", ".."):
        raise RecordNotFoundError(f"{wanted!r} is not a container id")
    exact = os.path.join(folder, wanted + SUFFIX)
    if os.path.lexists(exact):
        entry = _entry(folder, wanted + SUFFIX)
        _check_usable(entry)
        return entry
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        raise RecordNotFoundError(
            f"no decision record for container {wanted!r}: {folder} does not exist, so "
            f"gpuhook-runtime has not created any container with this config "
            f"({config.source}); {no_record_hint(config)}"
        ) from None
    except OSError as exc:
        raise RecordNotFoundError(f"cannot list {folder}: {exc.strerror}") from None
    matches = [_entry(folder, n) for n in names if n.endswith(SUFFIX) and n.startswith(wanted)]
    live = [e for e in matches if e.state != DELETED]
    if len(live) == 1:
        _check_usable(live[0])
        return live[0]
    if len(live) > 1:
        shown = ", ".join(e.container_id for e in live[:8])
        more = f" and {len(live) - 8} more" if len(live) > 8 else ""
        raise AmbiguousIdError(
            f"container id prefix {wanted!r} matches {len(live)} records: {shown}{more}; "
            "give more characters"
        )
    if matches:
        _check_usable(matches[0])
    raise RecordNotFoundError(
        f"no decision record for container {wanted!r} in {folder}: {no_record_hint(config)}"
    )


def candidate_roots(extra: tuple[str, ...] = ()) -> list[str]:
    """The runtime state folders to ask about a container without a record: ``extra`` (the
    CLI's --root), docker's, containerd's namespaces, then the runtime's default ("")."""
    try:
        spaces = sorted(os.listdir(CONTAINERD_ROOTS))
    except OSError:
        spaces = []
    roots = [*extra, *ENGINE_ROOTS, *(os.path.join(CONTAINERD_ROOTS, n) for n in spaces), ""]
    return list(dict.fromkeys(roots))


def unrecorded(runtime: str, roots: list[str], container_id: str) -> dict[str, Any] | None:
    """A live container without a record whose spec carries no GPU marker: what to say about
    it (None when no runtime root has the container, or its spec may request a GPU)."""
    import subprocess

    from gpuhook import markers

    if not runtime:
        return None
    for root in roots:
        argv = [runtime, *(["--root", root] if root else []), "state", container_id]
        try:
            proc = subprocess.run(
                argv, capture_output=True, timeout=10, check=False, stdin=subprocess.DEVNULL
            )
            state = _fastjson.loads(proc.stdout) if proc.returncode == 0 else None
            bundle = state.get("bundle") if isinstance(state, dict) else None
            if not isinstance(bundle, str) or not bundle:
                continue
            with open(os.path.join(bundle, "config.json"), "rb") as fh:
                raw = fh.read(MAX_RECORD_BYTES * 4)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            continue
        if markers.may_request_gpu(raw):
            return None
        return _unrecorded_view(container_id, bundle, runtime, root)
    return None


def _unrecorded_view(container_id: str, bundle: str, runtime: str, root: str) -> dict[str, Any]:
    return {
        "container_id": container_id,
        "bundle": bundle,
        "runtime": {"path": runtime, "root": root},
        "gpu_container": False,
        "record": None,
        "why": (
            f"container {container_id} asked for no GPU: its config.json ({bundle}) carries no "
            "GPU marker, so gpuhook-runtime passed it to the runtime without a decision and "
            "without a record"
        ),
    }


def _check_usable(entry: Entry) -> None:
    if entry.state == DELETED:
        raise RecordNotFoundError(
            f"container {entry.container_id} was deleted: its bundle "
            f"{os.path.dirname(entry.target)} is gone, and its decision record with it "
            "(gpuhook gc removes the stale link)"
        )
    if entry.state == UNREADABLE:
        raise RecordNotFoundError(
            f"decision record of container {entry.container_id} ({entry.target}): {entry.problem}"
        )


# --- gc ---------------------------------------------------------------------------------------


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
    import subprocess

    name = os.path.basename(runtime)
    if not runtime or not (os.path.isfile(runtime) and os.access(runtime, os.X_OK)):
        return None, f"cannot tell: runtime {runtime or '(none recorded)'} not found"
    argv = [runtime, *(["--root", root] if root else []), "state", container_id]
    try:
        proc = subprocess.run(
            argv, capture_output=True, timeout=10, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot tell: {' '.join(argv)}: {exc}"
    state_root = root or DEFAULT_ROOTS.get(name, "")
    where = f"{name} state (root {state_root or 'default'})"
    if proc.returncode == 0:
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
    items: list[GcItem] = []
    live = 0
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return GcReport(folder, dry_run, items, 0)
    for name in names:
        link = os.path.join(folder, name)
        if name.endswith(".tmp") and SUFFIX + "." in name:
            if _age(link, now) >= grace_s:
                items.append(
                    _remove(link, name, "leftover of an interrupted record write", dry_run)
                )
            continue
        if not name.endswith(SUFFIX) or len(name) == len(SUFFIX):
            continue
        entry = _entry(folder, name)
        if entry.state == DELETED:
            items.append(
                _remove(
                    link,
                    entry.container_id,
                    f"bundle {os.path.dirname(entry.target)} is gone: the engine deleted "
                    "the container",
                    dry_run,
                    expect=entry.target,
                )
            )
            continue
        if entry.state == UNREADABLE or entry.record is None:
            items.append(GcItem(entry.container_id, link, False, f"kept: {entry.problem}"))
            continue
        age = now - _timestamp(entry)
        if age < grace_s:
            items.append(
                GcItem(
                    entry.container_id,
                    link,
                    False,
                    f"kept: created {int(age)}s ago, too recent to judge (--grace {grace_s:g})",
                )
            )
            continue
        # The configured runtime (never a path read from a file inside the bundle); the record
        # only says which of its state folders (--root) the container was created in.
        recorded = entry.record.get("runtime")
        root = recorded.get("root", "") if isinstance(recorded, dict) else ""
        alive, detail = probe(config.runtime, str(root or ""), entry.container_id)
        if alive:
            live += 1
        elif alive is None:
            items.append(GcItem(entry.container_id, link, False, f"kept: {detail}"))
        else:
            items.append(_remove(link, entry.container_id, detail, dry_run, expect=entry.target))
    items += _gc_exec_env(config, dry_run, grace_s, now, probe)
    return GcReport(folder, dry_run, items, live)


def _gc_exec_env(
    config: Config, dry_run: bool, grace_s: float, now: float, probe: StateProbe
) -> list[GcItem]:
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
        if _age(path, now) < grace_s:
            continue
        try:
            marker = execenv.load(config.state_dir, name) or {}
        except GpuhookError:
            marker = {}
        root = marker.get("root", "")
        alive, detail = probe(config.runtime, root if isinstance(root, str) else "", name)
        if alive is False:
            items.append(_remove(path, name, f"exec-env marker: {detail}", dry_run))
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

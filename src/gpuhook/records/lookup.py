"""Decision records on the reading side: find one by container id or unique prefix, list them,
and find a pod's (by NAMESPACE/NAME or pod UID). The links of deleted containers are collected
by :mod:`gpuhook.records.gc`.

The shim writes each record into the container's bundle and links it as
``<state_dir>/containers/<id>.json`` (:mod:`gpuhook.records.writer`); the engine deletes the
bundle with the container, so a dangling link is a deleted container.

A container whose spec carries no GPU marker has no record (the dispatcher passes it to the
runtime without Python): :func:`unrecorded` finds it through the runtime's state instead.
"""

from __future__ import annotations

import os

from gpuhook import _fastjson
from gpuhook.errors import AmbiguousIdError, RecordNotFoundError
from gpuhook.model.frozen import Frozen
from gpuhook.model.record import Record
from gpuhook.records.ids import SUFFIX, link_id, link_path, valid_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.decision import KubeIdentity

LIVE = "live"
DELETED = "deleted"
UNREADABLE = "unreadable"
# The --root folders the engines gpuhook registers with give their runtime (docker; containerd's
# namespaces are the folders under /run/containerd/runc).
ENGINE_ROOTS = ("/run/docker/runtime-runc/moby",)
CONTAINERD_ROOTS = "/run/containerd/runc"
# Where a runtime keeps its containers' state when it is run without --root (as root).
DEFAULT_ROOTS = {"runc": "/run/runc", "crun": "/run/crun"}
STATE_TIMEOUT_S = 10.0
MAX_RECORD_BYTES = 16 * 1024 * 1024


class Entry(Frozen):
    """One link in the records folder and what it leads to: the record when it is live."""

    container_id: str
    link: str
    target: str
    state: str
    record: Record | None
    problem: str = ""


def schema() -> dict[str, Any]:
    """The JSON Schema of a record, as shipped in the package."""
    from importlib import resources

    text = resources.files("gpuhook").joinpath("schemas/record.schema.json").read_bytes()
    loaded = _fastjson.loads(text)
    if not isinstance(loaded, dict):
        raise ValueError("the packaged record schema is not a JSON object")
    return loaded


def read_record(path: str) -> Record:
    """A record file, read and checked once. OSError when it cannot be read, ValueError (one
    line) when it is not a record of this version."""
    with open(path, "rb") as fh:
        raw = fh.read(MAX_RECORD_BYTES + 1)
    if len(raw) > MAX_RECORD_BYTES:
        raise ValueError("larger than 16 MiB")
    data = _fastjson.loads(raw)
    if not isinstance(data, dict) or not isinstance(data.get("decision"), dict):
        raise ValueError("not a gpuhook decision record")
    try:
        return Record.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"not a gpuhook decision record: {exc}") from None


def entry_of(folder: str, name: str) -> Entry:
    """The record link ``name`` of ``folder``: live, deleted (dangling) or unreadable."""
    container_id = link_id(name)
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
    entries = [entry_of(folder, n) for n in names if link_id(n)]
    return sorted(entries, key=lambda e: (created_at(e), e.container_id))


def created_at(entry: Entry) -> float:
    """When the record was written: its timestamp, else the link's mtime."""
    if entry.record is not None:
        return entry.record.timestamp
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
    if not valid_id(wanted):  # a prefix of a valid id is one
        raise RecordNotFoundError(f"{wanted!r} is not a container id")
    if os.path.lexists(link_path(folder, wanted)):
        entry = entry_of(folder, wanted + SUFFIX)
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
    matches = [entry_of(folder, n) for n in names if link_id(n).startswith(wanted)]
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


def query_state(runtime: str, root: str, container_id: str) -> tuple[int, bytes]:
    """Run ``<runtime> [--root ROOT] state ID``: its exit status and stdout (stderr dropped).
    OSError when it cannot run or does not answer within 10 s (then the message names the
    command). No subprocess module: MPS admission calls it on the create path."""
    import select
    import signal
    import time

    argv = [runtime, *(["--root", root] if root else []), "state", container_id]
    out_r, out_w = os.pipe()
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0),
    ]
    try:
        try:
            pid = os.posix_spawn(runtime, argv, os.environ, file_actions=actions)
        finally:
            os.close(out_w)
        chunks = []
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out_r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise TimeoutError(f"no answer within {STATE_TIMEOUT_S:.0f}s")
            data = os.read(out_r, 65536)
            if not data:
                break
            chunks.append(data)
    except OSError as exc:
        raise OSError(f"{' '.join(argv)}: {exc.strerror or exc}") from None
    finally:
        os.close(out_r)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), b"".join(chunks)


def unrecorded(runtime: str, roots: list[str], container_id: str) -> dict[str, Any] | None:
    """A live container without a record whose spec carries no GPU marker: what to say about
    it (None when no runtime root has the container, or its spec may request a GPU)."""
    from gpuhook import markers

    if not runtime:
        return None
    for root in roots:
        try:
            code, out = query_state(runtime, root, container_id)
            state = _fastjson.loads(out) if code == 0 else None
            bundle = state.get("bundle") if isinstance(state, dict) else None
            if not isinstance(bundle, str) or not bundle:
                continue
            with open(os.path.join(bundle, "config.json"), "rb") as fh:
                raw = fh.read(MAX_RECORD_BYTES * 4)
        except (OSError, ValueError):
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


# --- pods -------------------------------------------------------------------------------------


def find_pod(config: Config, wanted: str) -> list[Record]:
    """The live records of one pod's containers, oldest first. ``wanted`` is NAMESPACE/NAME or
    a pod UID. RecordNotFoundError with one line when there is none."""
    namespace, slash, name = wanted.partition("/")
    if not wanted or (slash and (not namespace or not name or "/" in name)):
        raise RecordNotFoundError(f"{wanted!r} is not NAMESPACE/NAME or a pod UID")
    found = [
        e.record
        for e in scan(config.records_dir)
        if e.record is not None and _of_pod(e.record.kubernetes, namespace, slash, name)
    ]
    if not found:
        raise RecordNotFoundError(
            f"no decision record of a container of pod {wanted} in {config.records_dir}: only "
            "containers whose spec mentions a GPU are tied to their pod; a container known "
            "only by the kubelet's mounts (cri-dockerd) has no pod name, give the pod UID"
        )
    return found


def _of_pod(kube: KubeIdentity | None, namespace: str, slash: str, name: str) -> bool:
    if kube is None:
        return False
    if slash:
        return kube.namespace == namespace and kube.pod_name == name
    return kube.pod_uid == namespace

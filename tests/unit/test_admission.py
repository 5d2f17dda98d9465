"""MPS admission (gpuhook.mps.admission): what a record reserves, which containers count (the
creator process, the runtime's state), the rule over them (memory, one uid per group), and a
non-root client's way to its server. The runtime is a script that answers ``state``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuhook.config.types import Config
from gpuhook.errors import MpsError, RequestError
from gpuhook.model.record import Record
from gpuhook.mps import admission
from gpuhook.mps.admission import Reservation
from gpuhook.pipeline import request, sharing
from gpuhook.pipeline.identity import Client
from gpuhook.records import writer
from tests import factories as f
from tests.unit.test_sharing import GIB, INV, UUIDS, grant

# answers `state <id>` as a runtime would: ids named running-*/created-* run, stopped-* exited,
# broken-* fail oddly, anything else does not exist
RUNTIME = """#!/bin/sh
for id; do :; done
case "$id" in
  running-*) echo '{"id": "'$id'", "status": "running"}' ;;
  created-*) echo '{"id": "'$id'", "status": "created"}' ;;
  stopped-*) echo '{"id": "'$id'", "status": "stopped"}' ;;
  broken-*) echo "cannot open state: permission denied" >&2; exit 2 ;;
  *) echo 'level=error msg="container does not exist"' >&2; exit 1 ;;
esac
"""


def plan(uid: int | None = 0, annotations: dict[str, str] | None = None, **mps: Any) -> Any:
    config = f.config(**{f"mps__{k}": v for k, v in {"gpus": [0], **mps}.items()})
    req = request.parse(f.spec(annotations=annotations))
    p = sharing.plan(grant(0), INV, config.mps, "cfg.yaml", req, Client(uid, (uid or 0,)))
    assert p is not None
    return p


def holder(uid: int | None = 0, gib: int = 40, group: str = "gpu0") -> Reservation:
    return Reservation(f"c{gib}", group, uid, ((UUIDS[0], gib * GIB),), "running")


# --- the rule -------------------------------------------------------------------------------------


def test_the_share_is_reserved_whatever_the_annotation() -> None:
    p = plan(annotations={sharing.ANN_PINNED: "1M"}, replicas=2)
    assert (p.devices[0].pinned, p.devices[0].reserved) == (1 << 20, 40 * GIB)
    admission.check(p, [holder()], "reject")  # 40G + 40G: exactly full
    with pytest.raises(RequestError) as info:
        admission.check(p, [holder(), holder(gib=1)], "reject")
    assert str(info.value) == (
        "MPS pinned memory reservations on GPU 0 would add up to 81G of its 80G (40G for this "
        "container (the group's share: its processes may raise their 1M limit up to it), 41G "
        "for 2 live container(s)); mps.oversubscription is reject"
    )
    admission.check(p, [holder(), holder(gib=79)], "allow")
    unlimited = plan()  # no share: nothing enforced, nothing reserved
    admission.check(unlimited, [holder(gib=80)], "reject")


def test_one_uid_per_group() -> None:
    p = plan(uid=1000, replicas=4)
    admission.check(p, [holder(uid=1000), holder(uid=None), holder(uid=0, group="gpu1")], "allow")
    with pytest.raises(RequestError) as info:
        admission.check(p, [holder(uid=0), holder(uid=0, gib=1)], "allow")
    assert str(info.value) == (
        "MPS group gpu0 serves uid 0 (2 live container(s)) and its control daemon runs one MPS "
        "server at a time, as its clients' uid: the CUDA processes of this container (uid 1000) "
        "would wait until those exit; run the containers of a group as one uid, or give this "
        "one other GPUs"
    )
    admission.check(plan(uid=None, replicas=4), [holder(uid=0)], "allow")  # unknown: no check


# --- what a record reserves, and whether it still counts ---------------------------------------


@pytest.fixture
def runtime(tmp_path: Path) -> str:
    path = tmp_path / "runtime"
    path.write_text(RUNTIME)
    path.chmod(0o755)
    return str(path)


def limit(uuid: str, pinned: int, **more: Any) -> dict[str, Any]:
    """One pinned memory limit of a record's MPS plan."""
    fields = {"index": 0, "gpu": 0, "uuid": uuid, "bytes": pinned, "limit": "1M", "source": "x"}
    return {**fields, **more}


def record_data(
    cid: str, root: str, creator: dict[str, int] | None = None, **mps: Any
) -> dict[str, Any]:
    """A record as the writer makes it; its runtime path is never run (the configured is)."""
    req = request.parse(f.spec())
    data = writer.build(cid, f"/b/{cid}", req, runtime="/planted/runc", root=root, creator=creator)
    data["mps"] = {
        "group": "gpu0",
        "pipe_dir": "/run/gpuhook/mps/gpu0/pipe",
        "container_pipe_dir": sharing.PIPE_IN_CONTAINER,
        "active_thread_percentage": {"value": 100, "source": "default"},
        "client_uid": 0,
        "pinned_memory_limits": [],
        **mps,
    }
    return data


def record(cid: str, root: str, creator: dict[str, int] | None = None, **mps: Any) -> Record:
    return Record.from_dict(record_data(cid, root, creator, **mps))


@pytest.mark.parametrize(
    ("cid", "state"),
    [
        ("running-a", "running"),
        ("created-a", "created"),
        ("stopped-a", ""),  # exited, its bundle kept: not counted
        ("gone-a", ""),  # state fails and the state folder has no entry: gone
        ("broken-a", "unknown: runtime state broken-a exited 2"),  # fails, entry there: counts
    ],
)
def test_liveness_is_the_runtimes_state(runtime: str, tmp_path: Path, cid: str, state: str) -> None:
    root = tmp_path / "state-root"
    (root / "broken-a").mkdir(parents=True)
    assert admission.liveness(record(cid, str(root)), cid, runtime) == state


def test_a_container_counts_while_its_creator_lives(runtime: str, tmp_path: Path) -> None:
    root = str(tmp_path)
    me = admission.creator(os.getpid())
    assert me is not None and me["pid"] == os.getpid()
    assert admission.liveness(record("gone-a", root, me), "gone-a", runtime) == admission.CREATING
    other = {"pid": os.getpid(), "start": me["start"] + 1}  # the pid, reused by another process
    assert admission.liveness(record("gone-a", root, other), "gone-a", runtime) == ""
    assert admission.liveness(record("x", root), "x", "").startswith("unknown")


def test_reservation_of_a_record_and_of_an_older_one() -> None:
    limits = [limit("GPU-1", 1 << 20, reserved=40 * GIB), limit("GPU-2", 80 * GIB, reserved=0)]
    r = admission.reservation_of(record("a", "/r", pinned_memory_limits=limits), "a")
    assert r is not None and r.reserved == (("GPU-1", 40 * GIB),) and r.uid == 0
    old = record_data("b", "/r", group="g", pinned_memory_limits=[limit("GPU-1", 7, counted=True)])
    del old["mps"]["client_uid"]  # written before gpuhook recorded it
    r = admission.reservation_of(Record.from_dict(old), "b")
    assert r is not None and r.reserved == (("GPU-1", 7),) and r.uid is None
    old["mps"] = None
    assert admission.reservation_of(Record.from_dict(old), "c") is None


def test_live_reads_the_records_of_the_plans_group(tmp_path: Path, runtime: str) -> None:
    config = f.config(state_dir=str(tmp_path / "state"), mps__gpus=[0], mps__replicas=2)
    config = Config("(test)", config.data, runtime)
    p = plan(replicas=2)

    def write(cid: str, group: str = "gpu0", uuid: str = UUIDS[0]) -> None:
        bundle = tmp_path / cid
        bundle.mkdir()
        limits = [limit(uuid, 1, reserved=40 * GIB)]
        root = str(tmp_path / "runc-root")
        rec = record_data(cid, root, group=group, pinned_memory_limits=limits)
        (bundle / writer.RECORD_NAME).write_text(json.dumps(rec))
        os.makedirs(config.records_dir, exist_ok=True)
        os.symlink(bundle / writer.RECORD_NAME, Path(config.records_dir) / f"{cid}.json")

    for cid in ("running-a", "created-b", "stopped-c", "gone-d", "running-self", "running-dry"):
        write(cid)
    write("running-other", group="gpu1", uuid=UUIDS[1])
    write("running-moved", group="old", uuid=UUIDS[0])  # another group once: same GPU
    (tmp_path / "created-b" / writer.RECORD_NAME).unlink()  # the engine deleted its bundle
    seen = admission.live(
        config, p, exclude_id="running-self", exclude_bundle=str(tmp_path / "running-dry")
    )
    assert sorted(r.container_id for r in seen) == ["running-a", "running-moved"]
    with pytest.raises(RequestError, match="160G of its 80G"):
        admission.Ledger(config, "running-self", locked=False)(p)


def test_the_ledger_locks_until_released(tmp_path: Path) -> None:
    import fcntl

    config = f.config(state_dir=str(tmp_path / "state"), mps__gpus=[0], mps__replicas=2)
    ledger = admission.Ledger(config, "me")
    ledger(plan(replicas=2))
    path = tmp_path / "state" / admission.LOCK_NAME
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):  # another create waits here
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        ledger.release()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    # nothing to compare (no uid, no reservation): no lock, no records read
    quiet = admission.Ledger(config, "q")
    quiet(plan(uid=None))
    assert quiet.lock is None and quiet.seen is None


# --- a non-root client's server -------------------------------------------------------------------


def test_a_non_root_client_needs_every_folder_searchable(tmp_path: Path) -> None:
    base = tmp_path / "open"
    (base / "mps" / "gpu0" / "pipe").mkdir(parents=True)
    for folder in (
        tmp_path,
        base,
        base / "mps",
        base / "mps" / "gpu0",
        base / "mps" / "gpu0" / "pipe",
    ):
        folder.chmod(0o755)
    blocked = next((p for p in reversed(tmp_path.parents) if not p.stat().st_mode & 1), None)
    config = f.config(mps__gpus=[0], mps__root=str(base / "mps"))
    req = request.parse(f.spec())
    p = sharing.plan(grant(0), INV, config.mps, "c", req, Client(1000, (1000,)))
    assert p is not None
    if blocked is None:  # the temp folder's ancestors are open: block one of ours
        (base / "mps").chmod(0o750)
        blocked = base / "mps"
    with pytest.raises(MpsError) as info:
        admission.check_reachable(p)
    assert str(info.value).startswith(
        f"the MPS server for uid 1000 (this container's process; the control daemon starts one "
        f"as each client's uid) cannot reach {base}/mps/gpu0/pipe: {blocked} is not searchable"
    )
    root = sharing.plan(grant(0), INV, config.mps, "c", req, Client(0, (0,)))
    assert root is not None
    admission.check_reachable(root)  # root reaches everything
    assert admission.unsearchable("/") == ""

"""Decision records: every shape validates against the shipped JSON Schema, writing one never
raises, finding one by id or prefix, and gc of the links of deleted containers."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuhook import fsutil
from gpuhook.config.types import Config
from gpuhook.errors import AmbiguousIdError, RecordNotFoundError
from gpuhook.model.decision import Request
from gpuhook.model.record import Record
from gpuhook.pipeline import flow, request
from gpuhook.pipeline.kubelet import Allocation
from gpuhook.records import gc as records_gc
from gpuhook.records import lookup, writer
from gpuhook.runtime import decide as decide_mod
from tests import factories as f

VALIDATOR = jsonschema.Draft7Validator(lookup.schema())


def schema_errors(record: dict[str, Any]) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATOR.iter_errors(record)]


def decide(spec: dict[str, Any], allocated: tuple[str, ...] = ()) -> flow.Outcome:
    def checkpoint(path: str, uid: str, name: str) -> Allocation:
        return Allocation(uid, name, (("nvidia.com/gpu", allocated),) if allocated else (), path)

    return decide_mod.run(
        spec,
        f.config(),
        inventory_source=lambda _c: f.inventory(mig={6: 2}),
        checkpoint_source=checkpoint,
    )


def build(decided: flow.Outcome | Request) -> dict[str, Any]:
    return writer.build(
        "c1", "/b/c1", decided, runtime="/usr/sbin/runc", root="/run/r", config="/c.yaml"
    )


HOOK = {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x"]}]}


@pytest.mark.parametrize(
    ("spec", "allocated", "devices", "refused", "verdict"),
    [
        (f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"]), (), ["1"], False, "granted"),
        (f.spec(env=["NVIDIA_VISIBLE_DEVICES=6:1"]), (), ["6:1"], False, "granted"),
        (f.spec(env=["NVIDIA_VISIBLE_DEVICES=none"]), (), [], False, "granted"),
        (
            f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], hooks=HOOK),
            (),
            [str(i) for i in range(8)],
            False,
            "granted",
        ),
        (f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s()), (), [], True, "refused"),
        (
            f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s()),
            (f.gpu_uuid(2),),
            ["2"],
            False,
            "granted",
        ),
        (
            f.spec(
                env=["NVIDIA_VISIBLE_DEVICES=3"],
                annotations={**f.k8s(), "cdi.k8s.io/x": "nvidia.com/gpu=1"},
            ),
            (f.gpu_uuid(1),),
            ["1"],
            False,
            "granted",
        ),
    ],
)
def test_decided_records_follow_the_schema(
    spec: dict[str, Any],
    allocated: tuple[str, ...],
    devices: list[str],
    refused: bool,
    verdict: str,
) -> None:
    out = decide(spec, allocated)
    record = build(out)
    assert schema_errors(record) == []
    assert [d["id"] for d in record["decision"]["devices"]] == devices
    assert record["decision"]["refused"] is refused
    assert record["decision"]["reasons"][0]["verdict"] == verdict
    assert record["runtime"] == {"path": "/usr/sbin/runc", "root": "/run/r"}
    assert record["mps"] is None
    # what was injected is what the spec got
    env = out.spec["process"]["env"]
    assert all(e in env for e in record["edits"]["env"])
    paths = [d["path"] for d in record["edits"]["deviceNodes"]]
    assert [p for p in paths if p.startswith("/dev/nvidia") and p[11:].isdigit()] == [
        f"/dev/nvidia{d.split(':')[0]}" for d in devices
    ]
    assert json.loads(json.dumps(record)) == record  # plain JSON
    assert_reads_back(record)


def assert_reads_back(record: dict[str, Any]) -> None:
    """The typed model every reader uses holds what the writer wrote (the JSON stays as is)."""
    typed = Record.from_dict(json.loads(json.dumps(record)))
    assert typed.data == record and typed.container_id == record["container_id"]
    assert typed.decision.to_dict() == record["decision"]
    assert typed.view.edits.to_dict() == record["edits"]
    assert typed.view.request is not None
    assert typed.view.request.to_dict() == record["request"]
    kube = typed.kubernetes.to_dict() if typed.kubernetes is not None else None
    assert kube == record["kubernetes"]
    assert (typed.runtime.path, typed.runtime.root) == (
        record["runtime"]["path"],
        record["runtime"]["root"],
    )


def test_the_record_model_reads_an_mps_clients_record() -> None:
    """What admission and inspect read of an MPS client: its group, limits and reservations."""
    config = f.config(mps__gpus=[0], mps__replicas=2)
    out = decide_mod.run(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=0"]),
        config,
        inventory_source=lambda _c: f.inventory(),
        mps_probe=lambda _pipe: 1,
        mps_admit=lambda _plan: None,
    )
    assert out.mps is not None
    record = build(out)
    assert schema_errors(record) == []
    mps = Record.from_dict(record).view.mps
    assert mps is not None and mps.group == out.mps.group
    assert [(x.uuid, x.reservation) for x in mps.limits] == [
        (d.uuid, d.reserved) for d in out.mps.devices
    ]
    assert mps.env == out.mps.env()


def test_the_record_model_refuses_what_is_not_a_record_in_one_line() -> None:
    good = build(decide(f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"])))
    for broken, why in (
        ({**good, "record_version": 2}, "record version 2"),
        ({**good, "timestamp": "now"}, "'timestamp'"),
        ({**good, "runtime": "/usr/sbin/runc"}, "'runtime'"),
        ({**good, "decision": {**good["decision"], "devices": [{"kind": "gpu", "id": "x"}]}}, "id"),
    ):
        with pytest.raises(ValueError, match=why) as info:
            Record.from_dict(broken)
        assert "\n" not in str(info.value)


def test_undecided_records_follow_the_schema() -> None:
    parsed = build(request.parse(f.spec(annotations=f.k8s())))
    assert schema_errors(parsed) == []
    assert parsed["kubernetes"]["pod_name"] == "trainer"
    assert parsed["request"]["channels"] == []
    assert parsed["decision"]["reasons"][0]["why"] == "no GPU request in the spec"
    assert parsed["decision"]["gpu_container"] is False and parsed["mps"] is None
    assert parsed["edits"] == {"env": [], "deviceNodes": [], "mounts": [], "hooks": []}
    assert_reads_back(parsed)
    plain = build(request.parse(f.spec()))
    assert schema_errors(plain) == []
    assert plain["kubernetes"] is None
    # every record is of a parsed spec: a record without its request is not one
    assert schema_errors({**plain, "request": None})


def test_the_schema_rejects_what_is_not_a_record() -> None:
    good = build(decide(f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"])))
    for broken in (
        {k: v for k, v in good.items() if k != "decision"},
        {**good, "decision": {**good["decision"], "reasons": []}},
        {**good, "decision": {**good["decision"], "channel": "telepathy"}},
        {**good, "unexpected": 1},
        {**good, "runtime": "/usr/sbin/runc"},
    ):
        assert schema_errors(broken)


# --- writing ----------------------------------------------------------------------------------


def state_config(state_dir: Path) -> Config:
    return f.config(state_dir=str(state_dir))


def write_record(config: Config, cid: str, bundle: Path, ts: float | None = None) -> dict[str, Any]:
    bundle.mkdir(parents=True, exist_ok=True)
    out = decide(f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"]))
    record = writer.build(cid, str(bundle), out, runtime="/usr/sbin/runc", root="/run/r")
    if ts is not None:
        record["timestamp"] = ts
    assert writer.write(config, cid, str(bundle), record) == ""
    return record


def test_write_links_the_record_and_relinks_a_reused_id(tmp_path: Path) -> None:
    config = state_config(tmp_path / "state")
    write_record(config, "abc", tmp_path / "b1")
    link = tmp_path / "state" / "containers" / "abc.json"
    assert os.readlink(link) == str(tmp_path / "b1" / writer.RECORD_NAME)
    write_record(config, "abc", tmp_path / "b2")
    assert os.readlink(link) == str(tmp_path / "b2" / writer.RECORD_NAME)
    assert sorted(os.listdir(link.parent)) == ["abc.json"]


def test_write_failures_are_one_line_never_exceptions(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = state_config(blocker / "state")  # a file where a folder should be
    bundle = tmp_path / "b"
    bundle.mkdir()
    record = build(request.parse(f.spec()))
    failure = writer.write(config, "c1", str(bundle), record)
    assert failure.startswith(f"cannot link decision record {blocker}/state/containers/c1.json")
    assert "\n" not in failure
    assert (bundle / writer.RECORD_NAME).exists()  # the record itself is there
    gone = writer.write(state_config(tmp_path / "s"), "c1", str(tmp_path / "nope"), record)
    assert gone.startswith(f"cannot write decision record {tmp_path}/nope/")
    assert writer.write(config, "../x", str(bundle), record).startswith("container id '../x'")


# --- finding ------------------------------------------------------------------------------------


@pytest.fixture
def three(tmp_path: Path) -> Config:
    config = state_config(tmp_path / "state")
    now = time.time()
    for i, cid in enumerate(("aaa111", "aaa222", "bbb333")):
        write_record(config, cid, tmp_path / cid, ts=now - 100 + i)
    return config


def test_find_by_id_and_unique_prefix(three: Config) -> None:
    assert lookup.find(three, "aaa111").container_id == "aaa111"
    entry = lookup.find(three, "bb")
    assert entry.container_id == "bbb333" and entry.record is not None
    assert entry.record.container_id == "bbb333"


def test_find_refuses_what_no_container_id_starts_with(three: Config) -> None:
    for wanted in ("", ".", "..", "../aaa111", "aaa*", "a" * 1025):
        with pytest.raises(RecordNotFoundError, match="is not a container id"):
            lookup.find(three, wanted)


def test_ambiguous_prefix_is_one_line_naming_the_candidates(three: Config) -> None:
    with pytest.raises(AmbiguousIdError) as info:
        lookup.find(three, "aaa")
    assert str(info.value) == (
        "container id prefix 'aaa' matches 2 records: aaa111, aaa222; give more characters"
    )
    assert info.value.exit_code == 2


def test_no_record_says_why_and_how_to_get_one(three: Config, tmp_path: Path) -> None:
    with pytest.raises(RecordNotFoundError) as info:
        lookup.find(three, "zzz")
    line = str(info.value)
    assert line.startswith(f"no decision record for container 'zzz' in {three.records_dir}: ")
    assert "created by another runtime or before gpuhook became the engine's runtime" in line
    assert "gpuhook runtime configure --runtime docker|containerd --set-as-default" in line
    empty = state_config(tmp_path / "empty")
    with pytest.raises(RecordNotFoundError, match="does not exist, so gpuhook-runtime has not"):
        lookup.find(empty, "zzz")


def test_a_deleted_container_is_reported_as_deleted(three: Config, tmp_path: Path) -> None:
    (tmp_path / "bbb333" / writer.RECORD_NAME).unlink()
    (tmp_path / "bbb333").rmdir()
    with pytest.raises(RecordNotFoundError) as info:
        lookup.find(three, "bbb")
    assert str(info.value) == (
        f"container bbb333 was deleted: its bundle {tmp_path}/bbb333 is gone, and its decision "
        "record with it (gpuhook gc removes the stale link)"
    )
    entries = lookup.scan(three.records_dir)
    assert [(e.container_id, e.state) for e in entries] == [
        ("aaa111", "live"),
        ("aaa222", "live"),
        ("bbb333", "deleted"),  # ordered by its link's age: the record is gone
    ]


# --- gc -------------------------------------------------------------------------------------------


def test_gc_removes_links_of_deleted_containers_only(tmp_path: Path) -> None:
    config = state_config(tmp_path / "state")
    old = time.time() - 3600
    for cid in ("alive", "gone", "unknown", "dangling"):
        write_record(config, cid, tmp_path / cid, ts=old)
    write_record(config, "fresh", tmp_path / "fresh")
    (tmp_path / "dangling" / writer.RECORD_NAME).unlink()
    folder = Path(config.records_dir)
    leftover = Path(fsutil.temp_name(str(folder / "x.json")))  # a link write killed midway
    os.symlink("/nowhere", leftover)
    os.utime(leftover, (old, old), follow_symlinks=False)
    asked: list[tuple[str, str, str]] = []

    def probe(runtime: str, root: str, cid: str) -> tuple[bool | None, str]:
        asked.append((runtime, root, cid))
        return {"alive": (True, "alive"), "gone": (False, "not in runc state")}.get(
            cid, (None, "cannot tell: runc not found")
        )

    before = sorted(os.listdir(folder))
    dry = records_gc.gc(config, dry_run=True, probe=probe)
    assert sorted(os.listdir(folder)) == before
    report = records_gc.gc(config, probe=probe)
    for r in (dry, report):
        removed = sorted(i.container_id for i in r.removed)
        assert removed == sorted(["dangling", "gone", leftover.name])
        kept = {i.container_id: i.reason for i in r.items if not i.removed}
        assert kept["unknown"] == "kept: cannot tell: runc not found"
        assert kept["fresh"].startswith("kept: created 0s ago, too recent to judge")
        assert r.live == 1
    assert sorted(os.listdir(folder)) == ["alive.json", "fresh.json", "unknown.json"]
    assert ("/usr/sbin/runc", "/run/r", "alive") in asked  # the runtime the record names
    assert "fresh" not in {a[2] for a in asked} and "dangling" not in {a[2] for a in asked}


def test_runtime_state_needs_two_witnesses(tmp_path: Path) -> None:
    fake = tmp_path / "runc"
    fake.write_text('#!/bin/sh\n[ "$3" = state ] && [ "$4" = alive ] && exit 0\nexit 1\n')
    fake.chmod(0o755)
    root = tmp_path / "root"
    (root / "half").mkdir(parents=True)
    assert records_gc.runtime_state(str(fake), str(root), "alive")[0] is True
    state, why = records_gc.runtime_state(str(fake), str(root), "gone")
    assert state is False and why.startswith(f"not in runc state (root {root})")
    assert records_gc.runtime_state(str(fake), str(root), "half")[0] is None
    assert records_gc.runtime_state(str(tmp_path / "nope"), str(root), "x") == (
        None,
        f"cannot tell: runtime {tmp_path}/nope not found",
    )


def test_exec_env_markers_are_never_made_of_an_id_runc_would_refuse(tmp_path: Path) -> None:
    """The marker is named after the container id: a create with id ``../../x`` must not write
    (or an exec read) a file outside ``<state_dir>/exec-env``."""
    from gpuhook.records import execenv

    state = tmp_path / "state"
    failure = execenv.remember(str(state), "../../x", "/r", [], ["NVIDIA_VISIBLE_DEVICES=void"])
    assert failure == "container id '../../x' is not a valid runc id; no exec-env marker"
    assert not list(tmp_path.rglob("x")) and not state.exists()
    (tmp_path / "planted").write_text('{"set": ["LD_PRELOAD=/evil.so"]}')
    assert execenv.load(str(state), "../planted") is None
    execenv.forget(str(state), "../planted")
    assert (tmp_path / "planted").exists()
    assert execenv.remember(str(state), "ok-1", "/r", [], ["A=1"]) == ""
    assert execenv.load(str(state), "ok-1") == {"root": "/r", "set": ["A=1"], "unset": []}

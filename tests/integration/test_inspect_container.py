"""`gpuhook inspect container` and `gpuhook gc` after real runc containers of the leak matrix:
the record says what the container saw (devices, env) and why, its JSON validates against the
shipped schema, and the shim's log has one decision event per create. A record that cannot be
written never blocks a container; the shim never writes to the container's stdout."""

from __future__ import annotations

import json
import os
import subprocess
import uuid as uuidlib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import testbed

from gpuhook.records import lookup as containers_mod
from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.integration.test_leak_matrix import HOOK, k8s_env, uuid
from tests.logcapture import log_lines

pytestmark = [pytest.mark.slow, pytest.mark.root]

VALIDATOR = jsonschema.Draft7Validator(containers_mod.schema())


def marker(node: FakeNode, index: int) -> dict[str, Any]:
    return {
        "destination": f"/var/run/nvidia-container-devices/{uuid(node, index)}",
        "type": "bind",
        "source": "/dev/null",
        "options": ["bind", "ro"],
    }


def scenario_env(node: FakeNode, tmp_path: Path, kind: str) -> dict[str, str]:
    if kind == "plain":
        return node.env
    if kind == "k8s-none":
        return k8s_env(node, tmp_path, [])
    if kind == "k8s-other":
        return k8s_env(node, tmp_path, [("other-pod", "main", [uuid(node, 0)])])
    if kind == "k8s-1":
        return k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 1)])])
    if kind == "k8s-2":
        return k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 2)])])
    if kind == "k8s-2-5":
        return k8s_env(
            node,
            tmp_path,
            [("pod-uid-1", "main", [uuid(node, 2)]), ("pod-uid-2", "main", [uuid(node, 5)])],
        )
    if kind == "sandbox":
        return k8s_env(node, tmp_path, [("pod-uid-1", "", [uuid(node, 2)])])
    policy = kind.removeprefix("standalone-")
    return node.variant(tmp_path, policy={"standalone": {"env_requests": policy}})


# (name, environment kind, bundle shape, GPUs granted or None for a refusal or no GPU,
#  the decided channel, the first reason's verdict, words of its why)
SCENARIOS: list[tuple[str, str, dict[str, Any], list[str] | None, str | None, str, str]] = [
    (
        "env",
        "plain",
        {"env": ["NVIDIA_VISIBLE_DEVICES=1"]},
        ["1"],
        "env",
        "granted",
        "devices 1: non-Kubernetes container and policy.standalone.env_requests is trust",
    ),
    (
        "cdi",
        "k8s-1",
        {"annotations": {**f.k8s(), "cdi.k8s.io/nvidia-device-plugin_x": "nvidia.com/gpu=1"}},
        ["1"],
        "cdi-annotation",
        "granted",
        "devices 1: verified against the kubelet checkpoint: allocated to pod ml/trainer",
    ),
    (
        "mount-marker",
        "k8s-1",
        {"annotations": f.k8s(), "mounts": "marker-1"},
        ["1"],
        "mount-marker",
        "granted",
        "devices 1: verified against the kubelet checkpoint: allocated to pod ml/trainer",
    ),
    (
        "docker-gpus",
        "standalone-ignore",
        {
            "env": ["NVIDIA_VISIBLE_DEVICES=1"],
            "hooks": {"prestart": [{"path": HOOK, "args": ["nvidia-container-runtime-hook"]}]},
        },
        ["1"],
        "docker-gpus",
        "granted",
        "docker --gpus: the engine added its prestart hook",
    ),
    (
        "k8s-all-unallocated",
        "k8s-other",
        {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "annotations": f.k8s()},
        None,
        "env",
        "refused",
        "no GPU resource is allocated to pod ml/trainer (uid pod-uid-1) container "
        "'main' in the kubelet checkpoint",
    ),
    (
        "k8s-all-allocated",
        "k8s-2",
        {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "annotations": f.k8s()},
        ["2"],
        "env",
        "granted",
        "devices 2: verified against the kubelet checkpoint: allocated to pod ml/trainer",
    ),
    (
        "k8s-other-pods-gpu",
        "k8s-2-5",
        {"env": ["NVIDIA_VISIBLE_DEVICES=GPU5"], "annotations": f.k8s()},
        None,
        "env",
        "refused",
        "none of the requested devices is allocated to this container",
    ),
    (
        "init-container",
        "k8s-2",
        {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "annotations": f.k8s(container="init")},
        None,
        "env",
        "refused",
        "no GPU resource is allocated to pod ml/trainer (uid pod-uid-1) container 'init'",
    ),
    (
        "pod-sandbox",
        "sandbox",
        {
            "env": ["NVIDIA_VISIBLE_DEVICES=all"],
            "annotations": f.k8s(ctype="sandbox", container=""),
        },
        None,
        "env",
        "refused",
        "a pod sandbox never gets GPUs",
    ),
    (
        "privileged",
        "k8s-none",
        {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "annotations": f.k8s(), "privileged": True},
        [str(i) for i in range(8)],
        "env",
        "granted",
        "privileged container (every capability, the device cgroup open to all devices)",
    ),
    (
        "standalone-all-trust",
        "standalone-trust",
        {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
        [str(i) for i in range(8)],
        "env",
        "granted",
        "policy.standalone.env_requests is trust",
    ),
    (
        "standalone-all-ignore",
        "standalone-ignore",
        {"env": ["NVIDIA_VISIBLE_DEVICES=all"]},
        None,
        "env",
        "refused",
        "env requests of non-Kubernetes containers are ignored "
        "(policy.standalone.env_requests: ignore)",
    ),
    (
        "none",
        "plain",
        {"env": ["NVIDIA_VISIBLE_DEVICES=none"]},
        [],
        "env",
        "granted",
        "driver files only, no devices",
    ),
    (
        "void",
        "plain",
        {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
        None,
        None,
        "ignored",
        "no GPU request in the spec",
    ),
    (
        "mig",
        "plain",
        {"env": ["NVIDIA_VISIBLE_DEVICES=6:1"]},
        ["6:1"],
        "env",
        "granted",
        "devices 6:1: non-Kubernetes container",
    ),
]


def shape(node: FakeNode, bundle: dict[str, Any]) -> dict[str, Any]:
    out = dict(bundle)
    if out.get("mounts") == "marker-1":
        out["mounts"] = [marker(node, 1)]
    out["env"] = [e.replace("GPU5", uuid(node, 5)) for e in out.get("env", [])]
    return out


def inspect_json(node: FakeNode, env: dict[str, str], ref: str) -> dict[str, Any]:
    out = node.gpuhook("inspect", "container", ref, "--output", "json", env=env)
    assert out.returncode == 0, out.stderr
    record: dict[str, Any] = json.loads(out.stdout)
    return record


@pytest.mark.parametrize(
    ("name", "kind", "bundle", "granted", "channel", "verdict", "why"),
    SCENARIOS,
    ids=[s[0] for s in SCENARIOS],
)
def test_inspect_container_says_what_the_container_saw(
    node: FakeNode,
    containers: Containers,
    tmp_path: Path,
    name: str,
    kind: str,
    bundle: dict[str, Any],
    granted: list[str] | None,
    channel: str | None,
    verdict: str,
    why: str,
) -> None:
    env = scenario_env(node, tmp_path, kind)
    cid = f"{name}-{uuidlib.uuid4().hex}"
    seen = containers.probe(env, container_id=cid, **shape(node, bundle))
    assert seen["returncode"] == 0, seen["stderr"]

    record = inspect_json(node, env, cid[: len(name) + 8])  # a unique prefix will do
    assert [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATOR.iter_errors(record)] == []
    assert (record["container_id"], record["bundle"]) == (cid, str(seen["bundle"]))
    dec = record["decision"]
    # what was decided, and why
    assert dec["channel"] == channel
    assert dec["reasons"][0]["verdict"] == verdict
    assert why in dec["reasons"][0]["why"]
    if granted is None:
        assert dec["devices"] == [] and not dec["driver_only"]
        assert dec["refused"] is (verdict == "refused")
    else:
        assert [d["id"] for d in dec["devices"]] == granted
    # ... matches what the container saw: its device nodes and its NVIDIA_VISIBLE_DEVICES
    injected = sorted(d["path"] for d in record["edits"]["deviceNodes"])
    assert [d for d in seen["dev"] if d != "/dev/nvidia-caps"] == injected
    visible = [e for e in record["edits"]["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    if visible:
        assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == visible[0].partition("=")[2]
    elif not bundle.get("env"):
        assert seen["env"] == {}
    if dec["devices"]:
        assert visible == ["NVIDIA_VISIBLE_DEVICES=" + ",".join(d["uuid"] for d in dec["devices"])]
    if dec["refused"]:
        assert visible == ["NVIDIA_VISIBLE_DEVICES=void"] and seen["dev"] == []

    table = node.gpuhook("inspect", "container", cid, "-o", "table", env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    decision = next(line for line in lines if line.startswith("Decision"))
    if dec["devices"]:
        first = dec["devices"][0]
        assert decision.split(None, 1)[1].startswith(f"granted {first['id']} ({first['uuid']})")
    elif granted == []:
        assert decision.endswith("granted driver files only (none)")
    elif dec["refused"]:
        assert decision.endswith("refused: no GPU")
    else:
        assert decision.endswith("no GPU (no request)")
    reason = lines[lines.index("Reasons") + 2]
    assert reason.startswith(verdict) and why[:40] in reason

    # one decision event in the shim's log, with the container id bound
    events = [
        e
        for e in log_lines(Path(node.truth["log_file"]))
        if e.get("container_id") == cid and e["event"] == "decision"
    ]
    assert len(events) == 1
    assert events[0]["devices"] == [d["id"] for d in dec["devices"]]
    assert events[0]["bundle"] == str(seen["bundle"])


def test_all_prefix_and_deleted(node: FakeNode, containers: Containers) -> None:
    tag = uuidlib.uuid4().hex[:8]
    ids = [f"{tag}-a1", f"{tag}-a2", f"{tag}-b1"]
    bundles = {}
    for cid in ids:
        seen = containers.probe(node.env, container_id=cid, env=["NVIDIA_VISIBLE_DEVICES=3"])
        bundles[cid] = seen["bundle"]
    out = node.gpuhook("inspect", "container", "--all", "--gpu", "-o", "json")
    listed = {r["container_id"]: r for r in json.loads(out.stdout)}
    assert set(ids) <= set(listed)
    assert all(not list(VALIDATOR.iter_errors(r)) for r in listed.values())
    table = node.gpuhook("inspect", "container", "--all", "-o", "table")
    row = next(line for line in table.stdout.splitlines() if line.startswith(f"{tag}-b1"))
    assert row.split()[1].endswith("s") and row.split()[2:7] == ["ago", "-", "env", "granted", "3"]

    ambiguous = node.gpuhook("inspect", "container", f"{tag}-a")
    assert ambiguous.returncode == 2
    assert ambiguous.stderr == (
        f"gpuhook: container id prefix '{tag}-a' matches 2 records: {tag}-a1, {tag}-a2; "
        "give more characters\n"
    )
    # the engine deletes the bundle with the container: the record goes with it
    subprocess.run(["rm", "-rf", str(bundles[f"{tag}-b1"])], check=True)
    deleted = node.gpuhook("inspect", "container", f"{tag}-b")
    assert deleted.returncode == 1
    assert deleted.stderr.startswith(f"gpuhook: container {tag}-b1 was deleted: its bundle ")
    table = node.gpuhook("inspect", "container", "--all", "-o", "table")
    assert f"{tag}-b1" not in table.stdout
    assert "of deleted containers not shown; gpuhook gc removes them" in table.stdout


def test_no_record_explains_how_to_get_one(node: FakeNode) -> None:
    out = node.gpuhook("inspect", "container", "never-created-here")
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1
    assert out.stderr.startswith("gpuhook: no decision record for container 'never-created-here'")
    assert "created by another runtime or before gpuhook became the engine's runtime" in out.stderr
    assert "gpuhook runtime configure" in out.stderr
    usage = node.gpuhook("inspect", "container")
    assert usage.returncode == 2
    assert usage.stderr == (
        "gpuhook: inspect container: give a container id (or a unique prefix), or --all\n"
    )


def test_a_container_without_gpu_marker_has_no_record_and_inspect_says_why(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """Issue 14: no record for a spec without any GPU marker; inspect finds the live container
    through the runtime's state (``<runtime> --root R state ID``) and says it asked for no GPU."""
    bundle = containers.bundle(args=("/bin/sleep", "60"))
    errors = tmp_path / "create.err"
    with errors.open("w") as err:
        created = subprocess.run(
            [testbed.RUNTIME, "--root", str(containers.state), "create", "plain-live",
             "--bundle", str(bundle)],
            env={"PATH": os.environ["PATH"], **node.env},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            check=False, timeout=60,
        )  # fmt: skip
    assert created.returncode == 0, errors.read_text()
    assert not (bundle / "gpuhook-decision.json").exists()
    out = node.gpuhook("inspect", "container", "plain-live", "--root", str(containers.state),
                       "-o", "table")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        f"container plain-live asked for no GPU: its config.json ({bundle}) carries no GPU "
        "marker, so gpuhook-runtime passed it to the runtime without a decision and without a "
        "record\n"
    )
    view = json.loads(node.gpuhook("inspect", "container", "plain-live", "--root",
                                   str(containers.state), "-o", "json").stdout)  # fmt: skip
    assert view["gpu_container"] is False and view["record"] is None
    gone = node.gpuhook("inspect", "container", "not-there", "--root", str(containers.state))
    assert gone.returncode == 1 and "no decision record" in gone.stderr


def test_gc(node: FakeNode, containers: Containers, tmp_path: Path) -> None:
    """gc removes the links of containers that are gone (bundle deleted, or no longer in the
    runtime's state), keeps live ones, and --dry-run removes nothing."""
    inventory = str(node.root / "state" / "inventory.json")
    env = node.variant(tmp_path, state_dir=str(tmp_path / "state"), inventory={"path": inventory})
    exited = containers.probe(env, container_id="exited", env=["NVIDIA_VISIBLE_DEVICES=0"])
    deleted = containers.probe(env, container_id="deleted", env=["NVIDIA_VISIBLE_DEVICES=2"])
    assert exited["returncode"] == 0 and deleted["returncode"] == 0
    subprocess.run(["rm", "-rf", str(deleted["bundle"])], check=True)
    live_bundle = containers.bundle(args=("/bin/sleep", "60"), env=["NVIDIA_VISIBLE_DEVICES=1"])
    errors = tmp_path / "create.err"
    with errors.open("w") as err:  # the container's init keeps its stdio: no pipes
        created = subprocess.run(
            [
                testbed.RUNTIME,
                "--root",
                str(containers.state),
                "create",
                "--bundle",
                str(live_bundle),
                "live",
            ],
            env={"PATH": os.environ["PATH"], **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            check=False,
            timeout=60,
        )
    assert created.returncode == 0, errors.read_text()
    links = tmp_path / "state" / "containers"
    assert sorted(os.listdir(links)) == ["deleted.json", "exited.json", "live.json"]

    recent = node.gpuhook("gc", "-o", "table", env=env)  # everything is younger than --grace
    assert recent.returncode == 0, recent.stderr
    assert "removed 1 link of deleted containers" in recent.stdout  # only the dangling one
    assert sorted(os.listdir(links)) == ["exited.json", "live.json"]

    dry = node.gpuhook("gc", "--grace", "0", "--dry-run", "-o", "table", env=env)
    rows = {line.split()[2]: line for line in dry.stdout.splitlines() if line.startswith("would")}
    assert set(rows) == {"exited", "deleted"}  # a link, and the exec-env markers of both
    assert (
        f"not in runc state (root {containers.state}): the container was deleted" in rows["exited"]
    )
    assert dry.stdout.rstrip().endswith("1 live (" + str(links) + "); dry run: nothing removed")
    assert sorted(os.listdir(links)) == ["exited.json", "live.json"]

    done = node.gpuhook("gc", "--grace", "0", "-o", "json", env=env)
    report = json.loads(done.stdout)
    assert [i["container_id"] for i in report["removed"]] == ["exited", "deleted", "exited"]
    assert report["live"] == 1 and report["kept"] == []
    assert sorted(os.listdir(links)) == ["live.json"]
    assert sorted(os.listdir(tmp_path / "state" / "exec-env")) == ["live"]
    assert inspect_json(node, env, "live")["decision"]["devices"][0]["id"] == "1"
    gone = node.gpuhook("inspect", "container", "exited", env=env)
    assert gone.returncode == 1 and "no decision record for container 'exited'" in gone.stderr


def _mount_ro(folder: Path) -> None:
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)


def test_a_record_that_cannot_be_written_never_blocks_a_container(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    state = tmp_path / "ro-state"
    state.mkdir()
    inventory = str(node.root / "state" / "inventory.json")
    env = node.variant(tmp_path, state_dir=str(state), inventory={"path": inventory})
    _mount_ro(state)
    try:
        gpu = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=1"])
        plain = containers.probe(env)
    finally:
        subprocess.run(["umount", str(state)], check=True)
    assert gpu["returncode"] == 0 and "/dev/nvidia1" in gpu["dev"], gpu["stderr"]
    assert plain["returncode"] == 0, plain["stderr"]
    events = log_lines(Path(node.truth["log_file"]))
    for seen in (gpu,):
        [warning] = [
            e
            for e in events
            if e.get("container_id") == seen["container_id"] and e["event"] == "record not written"
        ]
        assert warning["level"] == "warning"
        assert warning["error"] == (
            f"cannot link decision record {state}/containers/{seen['container_id']}.json: "
            "Read-only file system"
        )

    # a read-only bundle: a container that asked for no GPU (a marker, but no request) starts
    bundle = containers.bundle("plain", args=("/bin/true",), env=["X_NVIDIA_VISIBLE_DEVICES=1"])
    _mount_ro(bundle)
    try:
        out = containers.run(bundle, node.env, container_id="ro-bundle-" + uuidlib.uuid4().hex)
    finally:
        subprocess.run(["umount", str(bundle)], check=True)
    assert out.returncode == 0, out.stderr
    [warning] = [
        e
        for e in log_lines(Path(node.truth["log_file"]))
        if str(e.get("container_id", "")).startswith("ro-bundle-")
        and e["event"] == "record not written"
    ]
    assert warning["error"] == (
        f"cannot write decision record {bundle}/gpuhook-decision.json: Read-only file system"
    )


def test_the_shim_never_writes_to_stdout(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """What a container prints is all that reaches the caller's stdout, with debug logging on
    (GPU and non-GPU), and a failed create prints nothing there."""
    env = {**node.variant(tmp_path, log={"level": "info"}), "GPUHOOK_DEBUG": "1"}
    for extra in ([], ["NVIDIA_VISIBLE_DEVICES=1"], ["NVIDIA_VISIBLE_DEVICES=void"]):
        bundle = containers.bundle(args=("/bin/echo", "from the container"), env=extra)
        out = containers.run(bundle, env)
        assert (out.returncode, out.stdout, out.stderr) == (0, "from the container\n", "")
    bad = containers.bundle(args=("/bin/echo", "never"), env=["NVIDIA_VISIBLE_DEVICES=99"])
    out = containers.run(bad, env)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("gpuhook: env NVIDIA_VISIBLE_DEVICES: unknown GPU index 99")

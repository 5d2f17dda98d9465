"""`gpuhook inspect pod`: every recorded container of one pod, with what it asked for and got,
from real runc containers carrying containerd's CRI annotations (and one known only by the
kubelet's mounts, as under cri-dockerd)."""

from __future__ import annotations

import json
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest

from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.integration.test_k8s_trust import kubelet
from tests.integration.test_leak_matrix import gpus, uuid, write_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.root]


def test_inspect_pod_lists_each_container_with_its_decision(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    tag = uuidlib.uuid4().hex[:8]
    uid, other = f"uid-{tag}", f"uid-{tag}-other"
    root = kubelet(tmp_path, uid=uid)
    write_checkpoint(
        root / "device-plugins" / "kubelet_internal_checkpoint", [(uid, "main", [uuid(node, 2)])]
    )
    env = node.variant(tmp_path, policy={"kubernetes": {"kubelet_dir": str(root)}})
    pod = {"uid": uid, "name": f"trainer-{tag}", "namespace": "ml"}
    shapes: dict[str, dict[str, Any]] = {
        "sandbox": {"annotations": {**f.k8s(ctype="sandbox", container="", **pod),
                                    "cdi.k8s.io/x": "nvidia.com/gpu=0"}},
        "init": {"env": ["NVIDIA_VISIBLE_DEVICES=all"],
                 "annotations": f.k8s(container="init", **pod)},
        "main": {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "annotations": f.k8s(**pod)},
        "other": {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "annotations": f.k8s(uid=other)},
    }  # fmt: skip
    ids = {}
    for name, shape in shapes.items():
        seen = containers.probe(env, container_id=f"{tag}-{name}", **shape)
        assert seen["returncode"] == 0, seen["stderr"]
        ids[name] = seen["container_id"]
    # a container of the same pod known only by the kubelet's mounts (no annotation at all)
    seen = containers.probe(
        env,
        container_id=f"{tag}-mounts",
        env=["NVIDIA_VISIBLE_DEVICES=all"],
        mounts=f.kubelet_mounts(uid=uid, kubelet_dir=str(root)),
    )
    assert seen["dev"] == gpus(2), seen["stderr"]

    out = node.gpuhook("inspect", "pod", f"ml/trainer-{tag}", "-o", "json", env=env)
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    got = {
        r["container_id"]: ([d["id"] for d in r["decision"]["devices"]], r["decision"]["refused"])
        for r in view["containers"]
    }
    assert got == {
        ids["sandbox"]: ([], True),
        ids["init"]: ([], True),
        ids["main"]: (["2"], False),
    }

    by_uid = node.gpuhook("inspect", "pod", uid, "-o", "table", env=env)
    assert by_uid.returncode == 0, by_uid.stderr
    lines = by_uid.stdout.splitlines()
    assert lines[0] == f"Pod ml/trainer-{tag} (uid {uid})"
    assert lines[1] == "" and lines[2].split() == [
        "CONTAINER", "TYPE", "ID", "CREATED", "ASKED", "GOT", "WHY"
    ]  # fmt: skip
    listed = sorted(line.split()[2] for line in lines[3:])
    assert listed == sorted(
        i[:12] for i in (ids["sandbox"], ids["init"], ids["main"], f"{tag}-mounts")
    )
    main = next(line for line in lines if line.startswith("main ") and ids["main"][:12] in line)
    assert "env all" in main and "granted 2" in main and "verified against the kub" in main
    init = next(line for line in lines if line.startswith("init "))
    assert "refused" in init and "no GPU resource is allocated" in init
    sandbox = next(line for line in lines if " sandbox " in line)
    assert (
        "cdi-annotation nvidia.com/gpu=0" in sandbox and "a pod sandbox never gets GPUs" in sandbox
    )
    mounted = next(line for line in lines if f"{tag}-mounts"[:12] in line)
    assert "granted 2" in mounted
    assert ids["other"][:12] not in by_uid.stdout

    yaml_out = node.gpuhook("inspect", "pod", uid, "-o", "yaml", env=env)
    assert yaml_out.returncode == 0 and yaml_out.stdout.startswith(f"pod: {uid}\n")


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("ml/no-such-pod", "gpuhook: no decision record of a container of pod ml/no-such-pod in "),
        ("a/b/c", "gpuhook: 'a/b/c' is not NAMESPACE/NAME or a pod UID"),
        ("/x", "gpuhook: '/x' is not NAMESPACE/NAME or a pod UID"),
    ],
)
def test_inspect_pod_not_found_is_one_line(node: FakeNode, ref: str, message: str) -> None:
    out = node.gpuhook("inspect", "pod", ref)
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(message), out.stderr

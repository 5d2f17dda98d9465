"""NVIDIA's device plugin and GPUs the engine injects (issue 33), against real runc containers
through gpuhook-runtime on the fake node. Each spec is shaped as the stack writes it: the
plugin's cdi-annotations answer (its own CDI kind), its index device ids in the checkpoint, and
device nodes an engine that resolves CDI (containerd 2.x, CRI-O, podman; docker --device) wrote
into linux.devices itself, as Go's encoding/json writes config.json. Each asserts the
/dev/nvidia* nodes the container sees and what the record and `gpuhook inspect` say."""

from __future__ import annotations

import json
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.integration.test_leak_matrix import gpus, k8s_env, uuid

pytestmark = [pytest.mark.slow, pytest.mark.root]

PLUGIN_KIND = "k8s.device-plugin.nvidia.com/gpu"
PLUGIN_KEY = "cdi.k8s.io/nvidia-device-plugin_5d0c4e1e-1f7b-4a54-9d43-6f1f0f3a8b21"


def record(seen: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads((seen["bundle"] / "gpuhook-decision.json").read_text()))


def engine_probe(
    containers: Containers,
    runtime_env: dict[str, str],
    nodes: list[tuple[str, int]],
    **kw: Any,
) -> dict[str, Any]:
    """The standard probe in a container whose spec already holds GPU device nodes ``nodes``
    (path, minor of major 195) with their cgroup rules, as an engine writes them from a CDI
    spec, in Go's compact JSON."""
    bundle = containers.bundle(args=("/bin/sh", "-c", testbed.PROBE), **kw)
    spec = json.loads((bundle / "config.json").read_text())
    linux = spec.setdefault("linux", {})
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    for path, minor in nodes:
        node = {"path": path, "type": "c", "major": 195, "minor": minor, "fileMode": 438}
        linux.setdefault("devices", []).append({**node, "uid": 0, "gid": 0})
        rules.append({"allow": True, "type": "c", "major": 195, "minor": minor, "access": "rwm"})
    (bundle / "config.json").write_text(json.dumps(spec, separators=(",", ":")))
    cid = f"gh-{uuidlib.uuid4().hex[:12]}"
    out = containers.run(bundle, runtime_env, container_id=cid)
    seen = testbed.parse_probe(out.stdout)
    seen.update(returncode=out.returncode, stderr=out.stderr, bundle=bundle, container_id=cid)
    return seen


# --- the plugin's cdi-annotations answer and its index ids ----------------------------------------


def test_the_plugins_cdi_annotation_gives_the_pod_its_gpus(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """Under containerd 1.6 (no CDI) a pod allocated 2 GPUs relies on the annotation: before,
    gpuhook read it as another vendor's device and the pod got none."""
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 2), uuid(node, 3)])])
    value = f"{PLUGIN_KIND}={uuid(node, 2)},{PLUGIN_KIND}={uuid(node, 3)}"
    seen = containers.probe(env, annotations={**f.k8s(), PLUGIN_KEY: value})
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == gpus(2, 3)
    assert record(seen)["decision"]["channel"] == "cdi-annotation"


def test_index_ids_of_the_envvar_strategy(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """deviceIDStrategy index: the checkpoint and the env hold `1`, `4`. Before, the create
    failed: "not a GPU or MIG UUID"."""
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", ["1", "4"])])
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=1,4"], annotations=f.k8s())
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == gpus(1, 4)


def test_a_pod_without_a_request_records_why_the_cdi_names_were_ignored(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """Only another kind's CDI name: no GPU, and the record (and inspect) keeps the reason."""
    env = k8s_env(node, tmp_path, [])
    rdma = "nvidia.com/net-rdma=0000:3b:00.0"
    seen = containers.probe(env, annotations={**f.k8s(), "cdi.k8s.io/rdma": rdma})
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == []
    reasons = record(seen)["decision"]["reasons"]
    assert [(r["channel"], r["value"], r["verdict"]) for r in reasons][1:] == [
        ("cdi-annotation", rdma, "ignored")
    ]
    out = node.gpuhook("inspect", "container", seen["container_id"], env=env)
    assert out.returncode == 0, out.stderr
    assert rdma in out.stdout and "another kind" in out.stdout


# --- GPUs the engine injects ---------------------------------------------------------------------


def test_a_gpu_the_engine_injected_without_an_allocation_is_refused(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """containerd 2.x with a CDI device naming GPU 3 for a pod with nothing allocated: before,
    the container ran and saw nvidia3, and its record said "no GPU request in the spec"."""
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 1)])])
    seen = engine_probe(containers, env, [("/dev/nvidia3", 3)], annotations=f.k8s())
    assert seen["returncode"] != 0
    lines = [x for x in seen["stderr"].splitlines() if x.startswith("gpuhook:")]
    assert len(lines) == 1, seen["stderr"]
    assert "the engine injected /dev/nvidia3 (GPU 3" in lines[0]
    assert "a misconfigured or forged CDI spec" in lines[0]


def test_a_gpu_the_engine_injected_for_its_allocation_is_kept_and_recorded(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """The plugin's cdi-cri strategy: nothing in the spec but the nodes the engine injected."""
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 3)])])
    name = f"trainer-{uuidlib.uuid4().hex[:8]}"
    annotations = f.k8s(name=name)
    seen = engine_probe(containers, env, [("/dev/nvidia3", 3)], annotations=annotations)
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == ["/dev/nvidia3"]  # what the engine injected; gpuhook adds nothing
    decision = record(seen)["decision"]
    assert decision["channel"] == "engine-cdi" and not decision["refused"]
    assert [d["id"] for d in decision["devices"]] == ["3"]
    out = node.gpuhook("inspect", "container", seen["container_id"], env=env)
    assert out.returncode == 0, out.stderr
    assert "engine-cdi" in out.stdout and "allocated to pod" in out.stdout
    out = node.gpuhook("inspect", "pod", f"ml/{name}", "--output", "table", env=env)
    assert out.returncode == 0, out.stderr
    assert "engine-cdi /dev/nvidia3" in out.stdout and "granted 3" in out.stdout, out.stdout


def test_a_standalone_containers_device_with_the_images_all_is_not_refused(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """docker run --device /dev/nvidia0 of a CUDA image (NVIDIA_VISIBLE_DEVICES=all) where env
    requests are ignored: the container keeps the engine's GPU 0 (the user chose it), gets
    nothing more, its env names GPU 0, and the record says GPU 0 came from the engine, not
    "refused"."""
    env = node.variant(tmp_path, policy={"standalone": {"env_requests": "ignore"}})
    seen = engine_probe(containers, env, [("/dev/nvidia0", 0)], env=["NVIDIA_VISIBLE_DEVICES=all"])
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == ["/dev/nvidia0"]
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == uuid(node, 0)  # not the image's all
    decision = record(seen)["decision"]
    assert decision["channel"] == "engine-cdi" and not decision["refused"]

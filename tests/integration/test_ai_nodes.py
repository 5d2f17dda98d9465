"""What real AI nodes produce must not fool the trust model (issue 23): GPU+RDMA pods, non-GPU
CDI annotations, added capabilities, NVIDIA's legacy hooks.d hook, allocations gpuhook does not
know, and specs runc reads differently from Python. Each scenario runs a real runc container
through gpuhook-runtime on the fake node and asserts the /dev/nvidia* nodes it sees (or the one
line a failed create prints); the checkpoints are in the format the kubelet writes, with the
RDMA shared device plugin's real resource name and ids. The podman pod case is in
test_podman.py (a real podman pod)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.integration.test_leak_matrix import HOOK, gpus, uuid

pytestmark = [pytest.mark.slow, pytest.mark.root]

RDMA = "nvidia.com/rdma_shared_device_a"  # NVIDIA Network Operator's RDMA shared device plugin
UNKNOWN_UUID = "GPU-0badcafe-0000-4000-8000-00000000dead"


def checkpoint_env(
    node: FakeNode, tmp_path: Path, entries: list[tuple[str, str, str, list[str]]]
) -> dict[str, str]:
    """A kubelet checkpoint of (pod uid, container, resource, device ids) entries, as the kubelet
    writes it (NUMA-less devices under "-1"), and the node's config reading it."""
    doc = {
        "Data": {
            "PodDeviceEntries": [
                {
                    "PodUID": uid,
                    "ContainerName": name,
                    "ResourceName": resource,
                    "DeviceIDs": {"-1": ids},
                    "AllocResp": "CgA=",
                }
                for uid, name, resource, ids in entries
            ],
            "RegisteredDevices": {},
        },
        "Checksum": 2812749129,
    }
    path = tmp_path / "kubelet_internal_checkpoint"
    path.write_text(json.dumps(doc))
    return node.variant(tmp_path, policy={"kubernetes": {"checkpoint": str(path)}})


def reasons(seen: dict[str, Any]) -> list[str]:
    record = json.loads((seen["bundle"] / "gpuhook-decision.json").read_text())
    return [f"{r['verdict']}: {r['why']}" for r in record["decision"]["reasons"]]


def failed_line(seen: dict[str, Any]) -> str:
    assert seen["returncode"] != 0, seen
    lines = seen["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuhook: "), lines
    return str(lines[0])


# --- 1. non-GPU nvidia.com/* resources are no GPU allocation --------------------------------------


def test_an_rdma_only_pod_with_image_env_all_gets_no_gpu(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """Before: the RDMA slot "0" was read as GPU index 0."""
    env = checkpoint_env(node, tmp_path, [("pod-uid-1", "main", RDMA, ["0"])])
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == [] and seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert reasons(seen)[0] == (
        "refused: no GPU resource is allocated to pod ml/trainer (uid pod-uid-1) container "
        f"'main' in the kubelet checkpoint (not GPU resources (policy.kubernetes.gpu_resources), "
        f"not counted: {RDMA})"
    )


def test_a_gpu_and_rdma_pod_gets_exactly_its_gpu(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """Before: GPU 2 plus RDMA slot "1" gave GPUs 1 and 2, GPU 1 being another pod's."""
    env = checkpoint_env(
        node,
        tmp_path,
        [
            ("pod-uid-1", "main", "nvidia.com/gpu", [uuid(node, 2)]),
            ("pod-uid-1", "main", RDMA, ["1"]),
            ("pod-uid-2", "main", "nvidia.com/gpu", [uuid(node, 1)]),
        ],
    )
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    assert seen["dev"] == gpus(2), seen["stderr"]
    assert f"ignored: not GPU resources (policy.kubernetes.gpu_resources), not counted: {RDMA}" in (
        reasons(seen)
    )


def test_shared_and_mig_resources_are_gpus(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """The device plugin's shared rename (time-slicing replica ids) and a MIG profile."""
    mig = node.truth["gpus"][6]["mig_devices"][1]["uuid"]
    env = checkpoint_env(
        node,
        tmp_path,
        [
            ("pod-uid-1", "main", "nvidia.com/gpu.shared", [f"{uuid(node, 3)}::2"]),
            ("pod-uid-1", "main", "nvidia.com/mig-1g.10gb", [mig]),
        ],
    )
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    assert seen["returncode"] == 0, seen["stderr"]
    assert "/dev/nvidia3" in seen["dev"] and "/dev/nvidia6" in seen["dev"]
    assert "/dev/nvidia0" not in seen["dev"] and "/dev/nvidia7" not in seen["dev"]


# --- 2. a CDI annotation of another kind leaves the request to the other channels -----------------


def test_an_rdma_cdi_annotation_does_not_discard_the_gpu_request(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """Before: the CDI channel won, held no GPU and decided "not a GPU container"."""
    env = checkpoint_env(node, tmp_path, [("pod-uid-1", "main", "nvidia.com/gpu", [uuid(node, 4)])])
    annotations = {**f.k8s(), "cdi.k8s.io/nvidia.com_net-rdma": "nvidia.com/net-rdma=0000:3b:00.0"}
    seen = containers.probe(
        env, env=[f"NVIDIA_VISIBLE_DEVICES={uuid(node, 4)}"], annotations=annotations
    )
    assert seen["dev"] == gpus(4), seen["stderr"]
    assert (
        "ignored: cdi.k8s.io/nvidia.com_net-rdma: a CDI device of another kind, not a GPU (left "
        "to its own CDI handler; GPU kinds: policy.cdi_kinds)"
    ) in reasons(seen)


# --- 3. an added capability is not privilege ------------------------------------------------------


def test_cap_sys_admin_alone_is_verified_like_any_container(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """securityContext.capabilities.add: [SYS_ADMIN]: the engine keeps the device cgroup
    closed. Before: image env `all` got every GPU."""
    env = checkpoint_env(node, tmp_path, [])
    seen = containers.probe(
        env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s(), add_caps=["CAP_SYS_ADMIN"]
    )
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == []
    assert reasons(seen)[0].startswith("refused: no GPU resource is allocated to pod ml/trainer")
    privileged = containers.probe(
        env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s(), privileged=True
    )
    assert privileged["dev"] == gpus(*range(8)), privileged["stderr"]


# --- 4. NVIDIA's legacy hooks.d hook --------------------------------------------------------------


@pytest.fixture
def legacy_hook(tmp_path: Path) -> dict[str, Any]:
    """oci-nvidia-hook.json as NVIDIA documented it for years: `nvidia-container-toolkit
    prestart` in every container (here a program that fails the container if it runs)."""
    path = tmp_path / "bin" / "nvidia-container-toolkit"
    path.parent.mkdir()
    shutil.copy(HOOK, path)
    os.chmod(path, 0o700)
    return {"prestart": [{"path": str(path), "args": ["nvidia-container-toolkit", "prestart"]}]}


@pytest.mark.parametrize(("allocated", "want"), [([], []), ([2], gpus(2))])
def test_legacy_hook_and_cuda_image_in_a_pod_is_a_verified_request_for_all(
    node: FakeNode,
    containers: Containers,
    tmp_path: Path,
    legacy_hook: dict[str, Any],
    allocated: list[int],
    want: list[str],
) -> None:
    """A legacy CUDA image (CUDA_VERSION, no NVIDIA_VISIBLE_DEVICES): NVIDIA's rule makes it
    `all`, verified against the allocation; the hook is removed (it fails the container if it
    runs). Before: the spec skipped the pre-check and the hook ran."""
    env = checkpoint_env(
        node,
        tmp_path,
        [("pod-uid-1", "main", "nvidia.com/gpu", [uuid(node, i) for i in allocated])],
    )
    seen = containers.probe(
        env, env=["CUDA_VERSION=12.4.1"], annotations=f.k8s(), hooks=legacy_hook
    )
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == want
    record = json.loads((seen["bundle"] / "gpuhook-decision.json").read_text())
    assert record["edits"]["removeHooks"] == ["nvidia-container-toolkit"]
    assert record["request"]["channels"][0]["source"].startswith(
        "env CUDA_VERSION without NVIDIA_VISIBLE_DEVICES (NVIDIA's legacy-image rule: all)"
    )


def test_legacy_hook_with_env_outside_kubernetes_is_docker_gpus_and_removed(
    node: FakeNode, containers: Containers, tmp_path: Path, legacy_hook: dict[str, Any]
) -> None:
    """Before: gpuhook set the env but left the hook in."""
    env = node.variant(tmp_path, policy={"standalone": {"env_requests": "ignore"}})
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=1"], hooks=legacy_hook)
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == gpus(1)


# --- 6. an allocated device gpuhook does not know fails the create --------------------------------


def test_an_allocated_uuid_missing_from_the_inventory_fails_the_create(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """Before: `void` and exit 0, the pod ran without its GPU."""
    env = checkpoint_env(node, tmp_path, [("pod-uid-1", "main", "nvidia.com/gpu", [UNKNOWN_UUID])])
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    assert failed_line(seen) == (
        f"gpuhook: the kubelet allocated {UNKNOWN_UUID} (nvidia.com/gpu) to pod ml/trainer "
        "(uid pod-uid-1) container 'main', but this node's inventory has no such device (stale, "
        "or a GPU was added or replaced): run gpuhook inventory refresh; the kubelet retries "
        "the container"
    )


def test_an_index_device_id_of_a_gpu_resource_is_verified_as_a_uuid_is(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """deviceIDStrategy index (issue 33): before, the create failed "not a GPU or MIG UUID"."""
    env = checkpoint_env(node, tmp_path, [("pod-uid-1", "main", "nvidia.com/gpu", ["0"])])
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == gpus(0)


def test_a_device_id_of_no_known_form_fails_the_create(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env = checkpoint_env(node, tmp_path, [("pod-uid-1", "main", "nvidia.com/gpu", ["zero"])])
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    assert "which is not a GPU or MIG id" in failed_line(seen)


def test_a_cdi_annotation_naming_an_unknown_uuid_fails_the_create(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env = checkpoint_env(node, tmp_path, [("pod-uid-1", "main", "nvidia.com/gpu", [uuid(node, 1)])])
    annotations = {**f.k8s(), "cdi.k8s.io/nvidia-device-plugin": f"nvidia.com/gpu={UNKNOWN_UUID}"}
    seen = containers.probe(env, annotations=annotations)
    assert failed_line(seen) == (
        "gpuhook: annotation cdi.k8s.io/nvidia-device-plugin: unknown GPU UUID "
        f"{UNKNOWN_UUID} (this node has GPUs 0-7)"
    )


# --- 7. no parser differential with runc ----------------------------------------------------------


def _rewrite(bundle: Path, edit: Any) -> None:
    path = bundle / "config.json"
    path.write_text(edit(path.read_text()))


@pytest.mark.parametrize(
    ("edit", "line"),
    [
        (
            lambda t: t.replace('"hooks"', '"Hooks"').replace('"prestart"', '"Prestart"'),
            "gpuhook: config.json: key 'Hooks' is the field 'hooks' to runc (Go matches field "
            "names case-insensitively): refused, so that gpuhook and runc read the same spec",
        ),
        (
            lambda t: t.replace('"process": {', '"process": {"env": ["A=1"]}, "process": {', 1),
            "gpuhook: malformed {bundle}/config.json: the key 'process' appears twice in one "
            "object",
        ),
    ],
    ids=["hook-case", "repeated-process"],
)
def test_a_spec_runc_would_read_differently_is_refused(
    node: FakeNode, containers: Containers, legacy_hook: dict[str, Any], edit: Any, line: str
) -> None:
    """runc (Go's encoding/json) runs a "Hooks"/"Prestart" hook and merges a repeated object;
    gpuhook refuses such a spec rather than decide on another reading of it."""
    bundle = containers.bundle(
        args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=1"], hooks=legacy_hook
    )
    _rewrite(bundle, edit)
    before = (bundle / "config.json").read_bytes()
    out = containers.run(bundle, node.env)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [line.format(bundle=bundle)]
    assert (bundle / "config.json").read_bytes() == before

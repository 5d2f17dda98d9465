"""The trust holes that real Kubernetes stacks open (issue 19), against real runc containers
through gpuhook-runtime on the fake node. Each scenario is a spec shaped as that stack writes it;
each asserts the /dev/nvidia* nodes the container sees (SECURITY.md, "Found and fixed")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.integration.test_leak_matrix import HOOK, gpus, k8s_env, uuid, write_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.root]

HOOKS_D = {"prestart": [{"path": HOOK, "args": ["nvidia-container-runtime-hook", "prestart"]}]}


def kubelet(tmp_path: Path, uid: str = "pod-uid-1", container: str = "main") -> Path:
    """A kubelet folder with one pod container's per-pod files (what cri-dockerd bind-mounts)."""
    root = tmp_path / "kubelet"
    pod = root / "pods" / uid
    (pod / "containers" / container).mkdir(parents=True, exist_ok=True)
    (pod / "etc-hosts").write_text("127.0.0.1 localhost\n")
    (pod / "containers" / container / f.TERMINATION_LOG_NAME).write_text("")
    (root / "device-plugins").mkdir(exist_ok=True)
    return root


def dockershim_env(
    node: FakeNode, tmp_path: Path, root: Path, allocations: list[tuple[str, str, list[str]]]
) -> dict[str, str]:
    """The node's config with policy.kubernetes.kubelet_dir set and the checkpoint at its
    default place in it (no `checkpoint` key)."""
    write_checkpoint(root / "device-plugins" / "kubelet_internal_checkpoint", allocations)
    return node.variant(tmp_path, policy={"kubernetes": {"kubelet_dir": str(root)}})


def record(seen: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads((seen["bundle"] / "gpuhook-decision.json").read_text()))


# --- 1. cri-dockerd / dockershim pods: known by the kubelet's mounts ----------------------------


def test_dockershim_pod_with_image_all_and_no_allocation_gets_nothing(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """docker writes no io.kubernetes.* annotation: before, the pod looked standalone and its
    image's NVIDIA_VISIBLE_DEVICES=all got all 8 GPUs."""
    root = kubelet(tmp_path)
    env = dockershim_env(node, tmp_path, root, [("other-pod", "main", [uuid(node, 0)])])
    mounts = f.kubelet_mounts(kubelet_dir=str(root))
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"], mounts=mounts)
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == [] and seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert record(seen)["kubernetes"]["pod_uid"] == "pod-uid-1"


def test_dockershim_pod_without_a_request_is_recorded_as_its_pod(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """A marker but no request (NVIDIA_VISIBLE_DEVICES=void): the record still names the pod the
    kubelet's mounts under the configured kubelet_dir say it is."""
    root = kubelet(tmp_path)
    env = dockershim_env(node, tmp_path, root, [])
    mounts = f.kubelet_mounts(kubelet_dir=str(root))
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=void"], mounts=mounts)
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == []
    assert record(seen)["kubernetes"]["pod_uid"] == "pod-uid-1"


def test_dockershim_pod_gets_its_allocation(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    root = kubelet(tmp_path)
    env = dockershim_env(node, tmp_path, root, [("pod-uid-1", "main", [uuid(node, 2)])])
    mounts = f.kubelet_mounts(kubelet_dir=str(root))
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"], mounts=mounts)
    assert seen["dev"] == gpus(2), seen["stderr"]


def test_annotations_and_mounts_naming_other_pods_refuse(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """The annotations say pod-uid-1 (which has GPU 2), the kubelet's mounts are pod-uid-2's."""
    root = kubelet(tmp_path, uid="pod-uid-2")
    env = dockershim_env(node, tmp_path, root, [("pod-uid-1", "main", [uuid(node, 2)])])
    seen = containers.probe(
        env,
        env=["NVIDIA_VISIBLE_DEVICES=all"],
        annotations=f.k8s(),
        mounts=f.kubelet_mounts(uid="pod-uid-2", kubelet_dir=str(root)),
    )
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == []
    assert (
        "kubelet's mounts are those of pod pod-uid-2"
        in record(seen)["decision"]["reasons"][0]["why"]
    )


# --- 2. NVIDIA's hooks.d prestart hook in a pod is not docker --gpus ----------------------------


@pytest.mark.parametrize(("allocated", "want"), [([], []), ([2], gpus(2))])
def test_hooks_d_hook_in_a_pod_is_an_env_request(
    node: FakeNode,
    containers: Containers,
    tmp_path: Path,
    allocated: list[int],
    want: list[str],
) -> None:
    """Before: all 8 GPUs either way. The hook (which fails the container if it runs) is removed
    whether the request is granted or refused."""
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, i) for i in allocated])])
    seen = containers.probe(
        env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s(), hooks=HOOKS_D
    )
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == want
    assert record(seen)["edits"]["removeHooks"] == ["nvidia-container-runtime-hook"]


# --- 3. all CDI annotations of a container are one request ---------------------------------------


def test_two_cdi_annotations_give_both_devices(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """Before: GPU 1 only (the first annotation)."""
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 1), uuid(node, 3)])])
    annotations = {
        **f.k8s(),
        "cdi.k8s.io/nvidia-device-plugin_a1": f"nvidia.com/gpu={uuid(node, 1)}",
        "cdi.k8s.io/nvidia-device-plugin_b2": f"nvidia.com/gpu={uuid(node, 3)}",
    }
    seen = containers.probe(env, annotations=annotations)
    assert seen["dev"] == gpus(1, 3), seen["stderr"]


# --- 4. only the deciding channel can fail the create --------------------------------------------


def test_malformed_env_under_a_cdi_annotation_is_a_reason_line(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """Before: the create failed with "'none' or 'void' cannot be combined"."""
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 0)])])
    seen = containers.probe(
        env,
        env=["NVIDIA_VISIBLE_DEVICES=none,0"],
        annotations={**f.k8s(), "cdi.k8s.io/nvidia-device-plugin_x": "nvidia.com/gpu=0"},
    )
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == gpus(0)
    superseded = record(seen)["decision"]["reasons"][1]
    assert superseded["verdict"] == "superseded" and "cannot be combined" in superseded["why"]


# --- 5. CRI-O sandbox forgery ---------------------------------------------------------------


@pytest.mark.parametrize(
    "annotations",
    [
        # CRI-O's sandbox spec plus containerd's uid key from the pod's annotations
        {**f.crio(ctype="sandbox", container="POD"), "io.kubernetes.cri.sandbox-uid": "pod-uid-1"},
        # CRI-O copied a pod annotation over its own container type
        f.crio(container="POD", copied={"io.kubernetes.cri-o.ContainerType": "container"}),
    ],
    ids=["mixed-key-sets", "copied-type"],
)
def test_crio_sandbox_cannot_pass_for_a_container(
    node: FakeNode, containers: Containers, tmp_path: Path, annotations: dict[str, str]
) -> None:
    """Before: the containerd key set was read, the type defaulted to container: GPU 0."""
    env = k8s_env(node, tmp_path, [("pod-uid-1", "POD", [uuid(node, 0)])])
    cdi = {"cdi.k8s.io/forged": "nvidia.com/gpu=0"}
    seen = containers.probe(env, annotations={**annotations, **cdi})
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == []
    assert "treated as a pod sandbox" in record(seen)["decision"]["reasons"][0]["why"]


def test_crio_container_gets_its_allocation(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 5)])])
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.crio())
    assert seen["dev"] == gpus(5), seen["stderr"]


# --- 6. markers (and CDI) of an unprivileged pod container stay within its allocation -----------

MARKER_ALL = {
    "destination": "/var/run/nvidia-container-devices/all",
    "type": "bind",
    "source": "/dev/null",
    "options": ["bind", "ro"],
}


@pytest.mark.parametrize(("allocated", "want"), [([], []), ([4], gpus(4))])
def test_hostpath_marker_gets_at_most_the_allocation(
    node: FakeNode,
    containers: Containers,
    tmp_path: Path,
    allocated: list[int],
    want: list[str],
) -> None:
    """A pod author with hostPath access mounts /dev/null at .../all: before, all 8 GPUs."""
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, i) for i in allocated])])
    seen = containers.probe(env, annotations=f.k8s(), mounts=[MARKER_ALL])
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == want


def test_cdi_beyond_the_allocation_is_cut_to_it(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 1)])])
    annotations = {**f.k8s(), "cdi.k8s.io/x": "nvidia.com/gpu=1,nvidia.com/gpu=3"}
    seen = containers.probe(env, annotations=annotations)
    assert seen["dev"] == gpus(1), seen["stderr"]

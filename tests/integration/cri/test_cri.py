"""Kubernetes end to end through containerd's CRI plugin, on containerd 1.6 and on containerd 2.x
(the daemons: conftest.py; every test runs on both, ids [containerd-1.6] and [containerd-2.3.4]).

Each test is a pod as the kubelet runs it: the device plugins' allocation in the kubelet's
checkpoint, RunPodSandbox (host network), CreateContainer with the env, mounts and annotations
the kubelet passes (CDI annotations from a device plugin included), StartContainer; then what
the container sees (ExecSync: `ls /dev`, its process's env, an exec'd process's env), what
gpuhook recorded, and StopContainer/RemoveContainer/StopPodSandbox/RemovePodSandbox.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cri.conftest import ENGINES, IMAGE, IMAGE_ALL, MPS_GPU, Cri
from tests.integration.cri.kubelet import Allocation, Pod
from tests.integration.test_leak_matrix import gpus

pytestmark = [pytest.mark.slow, pytest.mark.root]

PCT = "gpuhook.io/mps-active-thread-percentage"
MIB = 1 << 20

# The io.kubernetes.* annotations containerd 1.6.20's CRI plugin writes into the OCI spec
# (observed in the bundles' config.json; docs/kubernetes.md, "Kubernetes: what containerd 1.6's
# CRI plugin writes"); 2.3.4 writes the same, and io.kubernetes.cri.podsandbox.image-name in the
# sandbox's.
SANDBOX_KEYS = {
    "io.kubernetes.cri.container-type",
    "io.kubernetes.cri.sandbox-id",
    "io.kubernetes.cri.sandbox-log-directory",
    "io.kubernetes.cri.sandbox-name",
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.cri.sandbox-uid",
}
CONTAINER_KEYS = {
    "io.kubernetes.cri.container-name",
    "io.kubernetes.cri.container-type",
    "io.kubernetes.cri.image-name",
    "io.kubernetes.cri.sandbox-id",
    "io.kubernetes.cri.sandbox-name",
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.cri.sandbox-uid",
}


def cdi(
    k8s: Cri, index: int, resource: str = "nvidia.com/gpu", container: str = "main"
) -> Allocation:
    """What the NVIDIA device plugin's Allocate answers with the cdi-annotations strategy."""
    key = f"cdi.k8s.io/nvidia-device-plugin_{uuidlib.uuid4()}"
    uuid = k8s.uuid(index)
    return Allocation(container, resource, (uuid,), annotations={key: f"nvidia.com/gpu={uuid}"})


def envvar(k8s: Cri, index: int, container: str = "main") -> Allocation:
    """What it answers with the envvar strategy (the default)."""
    uuid = k8s.uuid(index)
    return Allocation(container, "nvidia.com/gpu", (uuid,), envs={"NVIDIA_VISIBLE_DEVICES": uuid})


def grant(k8s: Cri, pod: Pod, *allocations: Allocation) -> tuple[Allocation, ...]:
    """The kubelet's order: Allocate (the checkpoint is written), then CreateContainer."""
    k8s.allocate(*((pod, a) for a in allocations))
    return allocations


# --- the default-all leak and the allocation -----------------------------------------------------


def test_default_all_leak_closed(k8s: Cri) -> None:
    """No allocation for this pod, image env NVIDIA_VISIBLE_DEVICES=all: no GPU, and the
    container's own env says void (nothing left for a stock hook to honour)."""
    k8s.allocate((Pod(name="other"), envvar(k8s, 0)))
    with k8s.pod(Pod()) as pod:
        cid = pod.container(image=IMAGE_ALL)
        seen = pod.probe(cid)
        env = pod.process_env(cid)
        record = k8s.record(cid)
    assert seen["dev"] == []
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert record["decision"]["refused"] is True
    assert (
        "no GPU resource is allocated to pod ml/trainer"
        in (record["decision"]["reasons"][0]["why"])
    )


def test_the_leak_is_there_under_the_stock_policy(k8s: Cri) -> None:
    """Control: the same pod under policy.kubernetes.env_requests: trust (what the stock runtime
    does) gets every GPU, so the test above would see a leak if gpuhook let one through."""
    k8s.configure(policy={"kubernetes": {"env_requests": "trust"}}, mps={"gpus": []})
    with k8s.pod(Pod()) as pod:
        seen = pod.probe(pod.container(image=IMAGE_ALL))
    assert seen["dev"] == gpus(*range(8))


def test_allocation_honoured(k8s: Cri) -> None:
    """The device plugin allocated GPU 1 (env strategy) to a container whose image says all:
    exactly GPU 1."""
    p = Pod()
    with k8s.pod(p) as pod:
        cid = pod.container(image=IMAGE_ALL, allocations=grant(k8s, p, envvar(k8s, 1)))
        seen = pod.probe(cid)
        env = pod.process_env(cid)
    assert seen["dev"] == gpus(1)
    assert env["NVIDIA_VISIBLE_DEVICES"] == k8s.uuid(1)
    name = k8s.node.truth["gpus"][1]["name"]
    assert seen["smi"] == [f"GPU 0: {name} (UUID: {k8s.uuid(1)})", "rc=0"]


def test_two_cdi_annotations_are_one_request(k8s: Cri) -> None:
    """Two nvidia.com/* resources, two Allocate answers, two CDI annotations: GPU 1 and GPU 3."""
    p = Pod()
    allocations = grant(k8s, p, cdi(k8s, 1), cdi(k8s, 3, resource="nvidia.com/gpu.shared"))
    with k8s.pod(p) as pod:
        seen = pod.probe(pod.container(allocations=allocations))
    assert seen["dev"] == gpus(1, 3)


# --- the pod sandbox --------------------------------------------------------------------------


def test_pod_sandbox_gets_nothing(k8s: Cri) -> None:
    """The pause image says NVIDIA_VISIBLE_DEVICES=all and the pod's container is allocated
    GPU 1: the sandbox's spec gets no device and env void; the container gets GPU 1."""
    p = Pod()
    with k8s.pod(p) as pod:
        cid = pod.container(allocations=grant(k8s, p, cdi(k8s, 1)))
        seen = pod.probe(cid)
        record = k8s.record(pod.id)
        spec = k8s.spec(pod.id)
        assert record["bundle"] == str(k8s.bundle(pod.id))
        pid = (k8s.bundle(pod.id) / "init.pid").read_text().strip()
        pause_dev = sorted(d.name for d in Path(f"/proc/{pid}/root/dev").iterdir())
    assert seen["dev"] == gpus(1)
    assert record["kubernetes"]["container_type"] == "sandbox"
    assert record["kubernetes"]["pod_uid"] == p.uid
    assert record["decision"]["devices"] == [] and record["decision"]["refused"] is True
    assert "a pod sandbox never gets GPUs" in record["decision"]["reasons"][0]["why"]
    assert not any("nvidia" in d.get("path", "") for d in spec["linux"].get("devices", []))
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec["process"]["env"]
    assert not any(name.startswith("nvidia") for name in pause_dev), pause_dev


# --- what containerd passes through -------------------------------------------------------------


def test_annotations_containerd_writes(k8s: Cri) -> None:
    """The io.kubernetes.* keys of the sandbox's and the container's spec (docs/kubernetes.md)."""
    p = Pod()
    with k8s.pod(p) as pod:
        cid = pod.container()
        sandbox = k8s.spec(pod.id)["annotations"]
        container = k8s.spec(cid)["annotations"]
    # containerd 2.x adds the sandbox's image to the sandbox's spec.
    more = {"io.kubernetes.cri.podsandbox.image-name"} if k8s.engine != ENGINES[0] else set()
    assert {k for k in sandbox if k.startswith("io.kubernetes.")} == SANDBOX_KEYS | more
    assert {k for k in container if k.startswith("io.kubernetes.")} == CONTAINER_KEYS
    assert sandbox["io.kubernetes.cri.container-type"] == "sandbox"
    assert container["io.kubernetes.cri.container-type"] == "container"
    assert (
        container["io.kubernetes.cri.sandbox-id"]
        == pod.id
        == sandbox["io.kubernetes.cri.sandbox-id"]
    )
    assert (
        container["io.kubernetes.cri.sandbox-uid"],
        container["io.kubernetes.cri.sandbox-name"],
        container["io.kubernetes.cri.sandbox-namespace"],
    ) == (p.uid, p.name, p.namespace)
    assert container["io.kubernetes.cri.container-name"] == "main"
    assert container["io.kubernetes.cri.image-name"] == IMAGE


def test_gpuhook_pod_annotation_reaches_the_spec(k8s: Cri) -> None:
    """pod_annotations = ["gpuhook.io/*"] (written by `gpuhook runtime configure`): the pod's
    gpuhook.io/* annotation is in the container's (and the sandbox's) spec; other pod annotations
    and the kubelet's container annotations are not."""
    p = Pod(annotations={PCT: "30", "example.com/team": "ml"})
    with k8s.pod(p) as pod:
        cid = pod.container()
        container = k8s.spec(cid)["annotations"]
        sandbox = k8s.spec(pod.id)["annotations"]
    assert container[PCT] == "30" and sandbox[PCT] == "30"
    assert "example.com/team" not in container and "example.com/team" not in sandbox
    assert "io.kubernetes.container.hash" not in container


# --- MPS ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mps(cri: Cri) -> Iterator[Cri]:
    """The MPS control daemon of the suite's shared GPU, started with gpuhook mps."""
    cri.configure()
    out = cri.gpuhook("mps", "start")
    assert out.returncode == 0, out.stderr
    yield cri
    cri.gpuhook("mps", "stop")


def test_mps_limits_applied_to_a_pod(k8s: Cri, mps: Cri) -> None:
    """A pod allocated the MPS-shared GPU, with a gpuhook.io/* pod annotation: its container's
    process has the pipe directory and its limits (the annotation's thread share)."""
    p = Pod(annotations={PCT: "30"})
    with k8s.pod(p) as pod:
        cid = pod.container(allocations=grant(k8s, p, cdi(k8s, MPS_GPU)))
        seen = pod.probe(cid)
        env = pod.process_env(cid)
        pipe = pod.exec(cid, "/bin/ls", "/run/gpuhook/mps/pipe").split()
    share = int(k8s.node.truth["gpus"][MPS_GPU]["memory"]) // 2 // MIB
    assert seen["dev"] == gpus(MPS_GPU)
    assert {k: v for k, v in env.items() if k.startswith("CUDA_MPS_")} == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/gpuhook/mps/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={share}M",
    }
    assert "control" in pipe


# --- inspect ------------------------------------------------------------------------------------


def test_inspect_container_names_the_pod(k8s: Cri) -> None:
    p = Pod(name="inspected", namespace="team-a")
    with k8s.pod(p) as pod:
        cid = pod.container(allocations=grant(k8s, p, cdi(k8s, 1)))
        out = k8s.gpuhook("inspect", "container", cid[:16], "--output", "table")
    assert out.returncode == 0, out.stderr
    assert f"Kubernetes container team-a/inspected container main (pod uid {p.uid})" in out.stdout


# --- exec'd processes (ExecSync: kubectl exec, exec probes) -------------------------------------


def test_exec_gets_gpuhooks_env(k8s: Cri) -> None:
    """containerd builds an exec'd process from its own stored spec: gpuhook's values must reach
    it too. A granted container (CDI, image says all) and a refused one (image says all)."""
    granted, refused = Pod(name="granted"), Pod(name="refused")
    allocations = grant(k8s, granted, cdi(k8s, 1))
    with k8s.pod(granted) as pod:
        got = pod.exec_env(pod.container(image=IMAGE_ALL, allocations=allocations))
    with k8s.pod(refused) as pod:
        denied = pod.exec_env(pod.container(image=IMAGE_ALL))
    assert got["NVIDIA_VISIBLE_DEVICES"] == k8s.uuid(1)
    assert denied["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_exec_in_an_mps_pod_gets_the_limits(k8s: Cri, mps: Cri) -> None:
    p = Pod(annotations={PCT: "30"})
    with k8s.pod(p) as pod:
        env = pod.exec_env(pod.container(allocations=grant(k8s, p, cdi(k8s, MPS_GPU))))
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpuhook/mps/pipe"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"

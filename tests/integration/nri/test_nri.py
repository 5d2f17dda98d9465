"""gpuhook as an NRI plugin of containerd 2.3.4 (the daemon and the plugin: conftest.py), with
no gpuhook runtime registered: containerd runs plain runc, and whatever GPU a container gets
comes from the plugin's adjustment of the spec containerd built.

Each test is a pod as the kubelet runs it (the device plugin's allocation in the kubelet's
checkpoint, RunPodSandbox, CreateContainer, StartContainer), then what the container sees
(ExecSync), what gpuhook recorded, and what containerd and the plugin logged.
"""

from __future__ import annotations

import pytest

from tests.integration.cri.conftest import IMAGE, IMAGE_ALL
from tests.integration.cri.kubelet import Allocation, Pod
from tests.integration.nri.conftest import NriCri
from tests.integration.test_leak_matrix import gpus

pytestmark = [pytest.mark.slow, pytest.mark.root]


def envvar(nri: NriCri, uuid: str, container: str = "main") -> Allocation:
    """What NVIDIA's device plugin's Allocate answers with the envvar strategy (its default)."""
    return Allocation(container, "nvidia.com/gpu", (uuid,), envs={"NVIDIA_VISIBLE_DEVICES": uuid})


def grant(nri: NriCri, pod: Pod, *allocations: Allocation) -> tuple[Allocation, ...]:
    nri.allocate(*((pod, a) for a in allocations))
    return allocations


def test_the_plugin_registered_and_synchronized(nri: NriCri) -> None:
    log = nri.plugin.log.read_text()
    assert 'nri registered plugin="10-gpuhook"' in log
    assert 'nri configured runtime="containerd v2.3.4" request_timeout_ms=2000' in log
    assert "nri synchronized containers=" in log
    assert nri.ctd.registrations() >= 1


def test_the_leak_pod_gets_no_gpu(nri: NriCri) -> None:
    """Image env NVIDIA_VISIBLE_DEVICES=all, nothing allocated to the pod: no GPU node, the
    env says void, the record says refused and why."""
    nri.allocate((Pod(name="other"), envvar(nri, nri.uuid(0))))
    with nri.pod(Pod()) as pod:
        cid = pod.container(image=IMAGE_ALL)
        seen = pod.probe(cid)
        env = pod.process_env(cid)
        record = nri.record(cid)
        spec = nri.spec(cid)
    assert seen["dev"] == []
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert record["decision"]["refused"] is True
    assert (
        "no GPU resource is allocated to pod ml/trainer" in record["decision"]["reasons"][0]["why"]
    )
    assert "gpuhook" not in spec["process"]["args"][0]  # plain runc: no gpuhook runtime
    assert not [d for d in spec["linux"].get("devices", []) if "nvidia" in d["path"]]


def test_an_allocated_pod_gets_exactly_its_gpu(nri: NriCri) -> None:
    p = Pod()
    with nri.pod(p) as pod:
        cid = pod.container(image=IMAGE_ALL, allocations=grant(nri, p, envvar(nri, nri.uuid(1))))
        seen = pod.probe(cid)
        env = pod.process_env(cid)
        exec_env = pod.exec_env(cid)
        record = nri.record(cid)
    assert seen["dev"] == gpus(1)
    assert env["NVIDIA_VISIBLE_DEVICES"] == exec_env["NVIDIA_VISIBLE_DEVICES"] == nri.uuid(1)
    name = nri.node.truth["gpus"][1]["name"]
    assert seen["smi"] == [f"GPU 0: {name} (UUID: {nri.uuid(1)})", "rc=0"]
    assert record["decision"]["refused"] is False
    assert record["kubernetes"]["pod_uid"] == p.uid


def test_a_mig_device(nri: NriCri) -> None:
    mig = nri.node.truth["gpus"][6]["mig_devices"][1]
    p = Pod()
    with nri.pod(p) as pod:
        cid = pod.container(allocations=grant(nri, p, envvar(nri, mig["uuid"])))
        seen = pod.probe(cid)
        env = pod.process_env(cid)
    caps = sorted(c["path"] for c in mig["caps_nodes"])
    assert seen["dev"] == sorted([*gpus(6), "/dev/nvidia-caps", *caps])
    assert env["NVIDIA_VISIBLE_DEVICES"] == mig["uuid"]


def test_a_container_without_a_request_is_left_alone(nri: NriCri) -> None:
    with nri.pod(Pod()) as pod:
        cid = pod.container(image=IMAGE)
        seen = pod.probe(cid)
        out = nri.gpuhook("inspect", "container", cid)
    assert seen["dev"] == []
    assert out.returncode != 0  # no GPU marker: no record, as the shim keeps none

"""GPU pods on a real cluster (issue 35): etcd, kube-apiserver, scheduler, controller-manager,
the kubelet as a Node and containerd 2.3.4 with gpuhook-runtime as its default runtime, on the
fake node, with NVIDIA's DRA driver (tests/integration/cluster/nvidia_dra.py) publishing its
GPUs and MIG devices. Claims are allocated by the real scheduler, prepared by the driver's
kubelet plugin, and their CDI specs applied by containerd; each test asserts the /dev/nvidia*
nodes the pod saw (its log), gpuhook's decision record and `gpuhook inspect pod`."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests.conftest import FakeNode
from tests.integration.cluster import nvidia_dra, pods
from tests.integration.cluster.conftest import IMAGE, IMAGE_ALL, MPS_GPU
from tests.integration.cluster.stack import BIN, Cluster

pytestmark = [pytest.mark.slow, pytest.mark.root]

CONTROL = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]


@pytest.fixture(scope="module")
def dra(k8s: Cluster, node: FakeNode, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NVIDIA's DRA driver running, its devices published, and the claim templates."""
    hook_log = nvidia_dra.start(k8s, node, tmp_path_factory.mktemp("nvidia-dra"))
    mps_gpu = node.truth["gpus"][MPS_GPU]["uuid"]  # left to the shared claim's test
    k8s.apply([
        nvidia_dra.claim_template("one-gpu", "gpu.nvidia.com", avoid=mps_gpu),
        nvidia_dra.claim_template("two-gpus", "gpu.nvidia.com", 2, avoid=mps_gpu),
        nvidia_dra.claim_template("one-mig", "mig.nvidia.com"),
    ])  # fmt: skip
    return hook_log


@pytest.fixture(scope="module")
def injector(k8s: Cluster) -> Iterator[None]:
    """NRI's sample device-injector on containerd's NRI socket: it adds the device nodes a pod
    annotation names, as any NRI plugin may, with no claim and no allocation behind them."""
    log = open(k8s.work / "logs" / "nri-device-injector.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(BIN / "nri-device-injector"), "-idx", "20",
         "-socket-path", str(k8s.work / "ctd" / "nri" / "nri.sock")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    log.close()
    try:
        k8s.wait_for(
            "the NRI plugin registered",
            lambda: "20-nri-device-injector" in k8s.log("containerd", 400),
            30,
        )
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def gpus(*minors: int) -> list[str]:
    """The GPU nodes (and control nodes) a pod of ``minors`` sees; NVIDIA's CDI spec adds
    /dev/nvidia-modeset beside them."""
    return sorted([*CONTROL, "/dev/nvidia-modeset", *(f"/dev/nvidia{m}" for m in minors)])


def gpu_minors(seen: dict[str, Any]) -> list[int]:
    return sorted(int(d[len("/dev/nvidia") :]) for d in seen["dev"] if d[11:].isdigit())


def claim_of(k8s: Cluster, pod: str) -> dict[str, Any]:
    """The pod's ResourceClaim (generated from its template): name and allocated devices."""
    status = k8s.get("pod", pod)["status"]
    [ref] = status["resourceClaimStatuses"]
    claim = k8s.get("resourceclaim", ref["resourceClaimName"])
    return {
        "name": claim["metadata"]["name"],
        "devices": [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]],
    }


def inspect_pod(node: FakeNode, k8s: Cluster, name: str) -> dict[str, Any]:
    out = node.gpuhook(
        "inspect", "pod", f"default/{name}", "-o", "json",
        env={"GPUHOOK_CONFIG": k8s.gpuhook_config},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def main_record(view: dict[str, Any]) -> dict[str, Any]:
    [main] = [c for c in view["containers"] if c["kubernetes"]["container_name"] == "main"]
    return dict(main)


def engine_reasons(record: dict[str, Any]) -> str:
    reasons = record["decision"]["reasons"]
    return "\n".join(r["why"] for r in reasons if r["channel"] == "engine-cdi")


def test_a_pod_without_a_claim_whose_image_says_all_gets_no_gpu(
    k8s: Cluster, node: FakeNode
) -> None:
    """No claim, no device plugin: the image's NVIDIA_VISIBLE_DEVICES=all gets no GPU."""
    seen = pods.run(k8s, pods.pod("no-claim-all", IMAGE_ALL))
    assert seen["phase"] == "Running", seen
    assert seen["dev"] == []
    record = main_record(inspect_pod(node, k8s, "no-claim-all"))
    assert record["decision"]["devices"] == []
    pods.delete(k8s, "no-claim-all")


def test_a_dra_pod_with_one_gpu(k8s: Cluster, node: FakeNode, dra: Path) -> None:
    """Before: the pod saw its GPU and gpuhook recorded "no GPU request in the spec",
    gpu_container false; inspect pod said it held no GPU."""
    seen = pods.run(k8s, pods.pod("dra-one", IMAGE_ALL, claims=[("gpu", "one-gpu")]))
    assert seen["phase"] == "Running", seen
    claim = claim_of(k8s, "dra-one")
    [minor] = gpu_minors(seen)
    assert claim["devices"] == [f"gpu-{minor}"]
    assert seen["dev"] == gpus(minor)
    record = main_record(inspect_pod(node, k8s, "dra-one"))
    assert record["decision"]["channel"] == "engine-cdi"
    assert len(record["decision"]["devices"]) == 1
    why = engine_reasons(record)
    assert f"DRA claim default/{claim['name']} (gpu-{minor} of gpu.nvidia.com)" in why
    # doctor reads the real kubelet's checkpoint: the claim, its CDI spec, its GPU
    out = node.gpuhook("doctor", "-o", "json", env={"GPUHOOK_CONFIG": k8s.gpuhook_config})
    [dra_check] = [c for c in json.loads(out.stdout)["checks"] if c["check"] == "kubelet DRA state"]
    assert dra_check["status"] == "pass", dra_check
    assert "1 claims of gpu.nvidia.com" in dra_check["message"]
    pods.delete(k8s, "dra-one")


def test_a_dra_pod_with_two_gpus(k8s: Cluster, node: FakeNode, dra: Path) -> None:
    seen = pods.run(k8s, pods.pod("dra-two", IMAGE, claims=[("gpus", "two-gpus")]))
    assert seen["phase"] == "Running", seen
    claim = claim_of(k8s, "dra-two")
    minors = gpu_minors(seen)
    assert sorted(claim["devices"]) == sorted(f"gpu-{m}" for m in minors) and len(minors) == 2
    assert seen["dev"] == gpus(*minors)
    record = main_record(inspect_pod(node, k8s, "dra-two"))
    assert len(record["decision"]["devices"]) == 2
    assert f"DRA claims default/{claim['name']}" in engine_reasons(record)
    pods.delete(k8s, "dra-two")


def test_a_dra_pod_with_a_mig_device(k8s: Cluster, node: FakeNode, dra: Path) -> None:
    seen = pods.run(k8s, pods.pod("dra-mig", IMAGE_ALL, claims=[("mig", "one-mig")]))
    assert seen["phase"] == "Running", seen
    claim = claim_of(k8s, "dra-mig")
    [device] = claim["devices"]
    parent = int(device.split("-")[1])
    gpu = next(g for g in node.truth["gpus"] if g["minor"] == parent)
    profile = device.split("-mig-")[1].split("-")[0]
    [mig] = [m for m in gpu["mig_devices"] if m["profile"].replace(".", "") == profile]
    caps = sorted(c["path"] for c in mig["caps_nodes"])
    assert seen["dev"] == sorted([*gpus(parent), "/dev/nvidia-caps", *caps])
    record = main_record(inspect_pod(node, k8s, "dra-mig"))
    assert [d["uuid"] for d in record["decision"]["devices"]] == [mig["uuid"]]
    assert f"({device} of gpu.nvidia.com)" in engine_reasons(record)
    pods.delete(k8s, "dra-mig")


def test_an_extended_resource_pod_served_by_dra(k8s: Cluster, node: FakeNode, dra: Path) -> None:
    """DRAExtendedResource: `nvidia.com/gpu: 1` with no device plugin on the node, served by
    the DeviceClass that names it: the scheduler makes the pod a claim, the driver prepares it."""
    seen = pods.run(k8s, pods.pod("dra-ext", IMAGE_ALL, limits={"nvidia.com/gpu": "1"}))
    assert seen["phase"] == "Running", seen
    [minor] = gpu_minors(seen)
    assert seen["dev"] == gpus(minor)
    record = main_record(inspect_pod(node, k8s, "dra-ext"))
    assert record["decision"]["channel"] == "engine-cdi"
    assert f"(gpu-{minor} of gpu.nvidia.com)" in engine_reasons(record)
    pods.delete(k8s, "dra-ext")


def test_a_claim_shared_by_two_pods_under_mps(k8s: Cluster, node: FakeNode, dra: Path) -> None:
    """One ResourceClaim of gpuhook's MPS-shared GPU, named by two pods: the driver prepares it
    once for both, each pod's container is a client of the GPU's daemon with half of it, and so
    is a process exec'd into it (kubectl exec)."""
    gpu = node.truth["gpus"][MPS_GPU]
    k8s.apply(nvidia_dra.shared_claim("shared-mps", gpu["uuid"]))
    share = int(gpu["memory"]) // 2 // (1 << 20)
    want = {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/gpuhook/mps/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={share}M",
    }
    names = ["mps-a", "mps-b"]
    for name in names:
        seen = pods.run(k8s, pods.pod(name, IMAGE, claims=[("gpu", "claim:shared-mps")]))
        assert seen["phase"] == "Running", seen
        assert gpu_minors(seen) == [gpu["minor"]]
        assert {k: v for k, v in seen["env"].items() if k.startswith("CUDA_MPS_")} == want
        execd = k8s.kubectl("exec", name, "--", "/bin/sh", "-c", "env | grep ^CUDA_MPS_").stdout
        assert dict(line.split("=", 1) for line in execd.split()) == want
        record = main_record(inspect_pod(node, k8s, name))
        assert record["mps"]["group"] == f"gpu{MPS_GPU}"
        assert "DRA claim default/shared-mps" in engine_reasons(record)
    pods.delete(k8s, *names)
    k8s.kubectl("delete", "resourceclaim", "shared-mps", "--wait=false")


def test_a_forged_injection_without_a_claim_is_refused(
    k8s: Cluster, node: FakeNode, dra: Path, injector: None
) -> None:
    """An NRI plugin adds /dev/nvidia5 to a pod that claimed nothing: the create fails with
    gpuhook's one line, the pod never runs."""
    doc = pods.pod("forged", IMAGE)
    device = {"path": "/dev/nvidia5", "type": "c", "major": 195, "minor": 5, "file_mode": 438}
    doc["metadata"]["annotations"] = {
        "devices.noderesource.dev/container.main": json.dumps([device])
    }
    events = pods.stuck(k8s, doc, "gpuhook: the engine injected /dev/nvidia5")
    assert "no allocation covers it" in events
    assert k8s.pod_phase("forged") == "Pending"
    pods.delete(k8s, "forged")


def test_the_cluster_started_within_ci_time(k8s: Cluster) -> None:
    assert k8s.up_seconds < 120, k8s.up_seconds
    print(f"\ncluster up in {k8s.up_seconds:.1f}s", end="")
    assert testbed.RUNTIME in Path(k8s.work / "ctd" / "config.toml").read_text()

"""GPUs allocated by Dynamic Resource Allocation (issue 35), against real runc containers through
gpuhook-runtime on the fake node. Each spec is what containerd 2.x writes for a pod whose claim
NVIDIA's DRA driver prepared: the claim's CDI spec's device nodes (the GPU, and the nvidia-caps
nodes of a MIG device) and cgroup rules in linux.devices, its common env (NVIDIA_CTK_LIBCUDA_DIR,
NVIDIA_VISIBLE_DEVICES=void) APPENDED after the image's, no annotation naming the claim; the
kubelet's DRA checkpoint (``<kubelet_dir>/dra_manager_state``) as kubelet 1.36 writes it. Each
asserts the /dev/nvidia* nodes the container sees, the create's one line, and what the record and
`gpuhook inspect pod` say."""

from __future__ import annotations

import json
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests import dra_state
from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.integration.test_leak_matrix import gpus, write_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.root]

CDI_ENV = ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu", "NVIDIA_VISIBLE_DEVICES=void"]
IMAGE_ALL = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]


class Pod:
    """One pod of a test: its uid and name, and the gpuhook env of a node config whose
    kubelet_dir holds the DRA checkpoint given (and an empty device-plugin checkpoint)."""

    def __init__(self, node: FakeNode, tmp_path: Path, claims: list[dict[str, Any]]) -> None:
        self.uid = f"pod-{uuidlib.uuid4().hex[:12]}"
        self.name = f"dra-{self.uid[4:12]}"
        kubelet = tmp_path / "kubelet"
        dra_state.write(kubelet, [self._own(c) for c in claims])
        cp = write_checkpoint(tmp_path / "kubelet_internal_checkpoint", [])
        policy = {"kubernetes": {"checkpoint": str(cp), "kubelet_dir": str(kubelet)}}
        self.env = node.variant(tmp_path, policy=policy)
        self.node = node

    def _own(self, claim: dict[str, Any]) -> dict[str, Any]:
        """A claim given as prepared for "POD" is prepared for this pod."""
        pods = claim["PodUIDs"]
        return {**claim, "PodUIDs": {self.uid if p == "POD" else p: v for p, v in pods.items()}}

    def annotations(self) -> dict[str, str]:
        return f.k8s(uid=self.uid, name=self.name, namespace="ml")


def containers_control(node: FakeNode) -> list[tuple[str, int, int]]:
    return [(c["path"], c["major"], c["minor"]) for c in node.truth["control_nodes"]]


def dra_gpus(*minors: int) -> list[str]:
    """What a claim pod sees: its GPU nodes and the CDI spec's control nodes."""
    return sorted([*gpus(*minors), "/dev/nvidia-modeset"])


def gpu_nodes(*minors: int) -> list[tuple[str, int, int]]:
    return [(f"/dev/nvidia{m}", 195, m) for m in minors]


def mig_nodes(node: FakeNode, gpu: int, slot: int) -> list[tuple[str, int, int]]:
    mig = node.truth["gpus"][gpu]["mig_devices"][slot]
    caps = [(c["path"], c["major"], c["minor"]) for c in mig["caps_nodes"]]
    return [*gpu_nodes(node.truth["gpus"][gpu]["minor"]), *caps]


def claim_pod(
    containers: Containers,
    pod: Pod,
    nodes: list[tuple[str, int, int]],
    image_env: list[str],
    cdi_env: list[str] = CDI_ENV,
) -> dict[str, Any]:
    """The standard probe in the pod's container as containerd 2.x creates it from the claim's
    CDI spec (in Go's compact JSON)."""
    bundle = containers.bundle(
        args=("/bin/sh", "-c", testbed.PROBE), env=image_env, annotations=pod.annotations()
    )
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["env"] += cdi_env
    if nodes:  # the claim spec's common edits: the control nodes, nvidia-modeset included
        control = containers_control(pod.node)
        nodes = [*nodes, *control]
    linux = spec.setdefault("linux", {})
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    for path, major, minor in nodes:
        mode = 292 if "nvidia-caps" in path else 438
        node = {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": mode}
        linux.setdefault("devices", []).append({**node, "uid": 0, "gid": 0})
        rules.append({"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"})
    (bundle / "config.json").write_text(json.dumps(spec, separators=(",", ":")))
    cid = f"gh-{uuidlib.uuid4().hex[:12]}"
    out = containers.run(bundle, pod.env, container_id=cid)
    seen = testbed.parse_probe(out.stdout)
    seen.update(returncode=out.returncode, stderr=out.stderr, bundle=bundle, container_id=cid)
    return seen


def decision(seen: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads((seen["bundle"] / "gpuhook-decision.json").read_text())["decision"])


def inspect_pod(node: FakeNode, pod: Pod) -> str:
    out = node.gpuhook("inspect", "pod", f"ml/{pod.name}", env=pod.env)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_dra_pod_with_one_gpu(node: FakeNode, containers: Containers, tmp_path: Path) -> None:
    """Before: the container saw nvidia3 and the record said "no GPU request in the spec",
    gpu_container false, and inspect pod said it held no GPU."""
    pod = Pod(node, tmp_path, [dra_state.claim("c-1", "one-gpu", ["POD"], ["gpu-3"])])
    seen = claim_pod(containers, pod, gpu_nodes(3), IMAGE_ALL)
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == dra_gpus(3)
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == node.truth["gpus"][3]["uuid"]
    got = decision(seen)
    assert got["channel"] == "engine-cdi" and not got["refused"]
    assert [d["id"] for d in got["devices"]] == ["3"]
    shown = inspect_pod(node, pod)
    assert "DRA claim ml/one-gpu (gpu-3 of gpu.nvidia.com)" in shown


def test_a_dra_pod_with_two_gpus(node: FakeNode, containers: Containers, tmp_path: Path) -> None:
    pod = Pod(node, tmp_path, [dra_state.claim("c-2", "two-gpus", ["POD"], ["gpu-1", "gpu-4"])])
    seen = claim_pod(containers, pod, gpu_nodes(1, 4), IMAGE_ALL)
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == dra_gpus(1, 4)
    assert [d["id"] for d in decision(seen)["devices"]] == ["1", "4"]
    assert "ml/two-gpus (gpu-1 of gpu.nvidia.com), ml/two-gpus (gpu-4" in inspect_pod(node, pod)


def test_a_dra_pod_with_a_mig_device(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """NVIDIA's driver publishes GPU 6's MIG devices, e.g. gpu-6-mig-2g20gb-<profile>-<start>."""
    mig = node.truth["gpus"][6]["mig_devices"][1]
    profile = mig["name"].rsplit(" ", 1)[-1].replace(".", "")
    name = f"gpu-6-mig-{profile}-14-4"
    pod = Pod(node, tmp_path, [dra_state.claim("c-3", "mig", ["POD"], [name])])
    seen = claim_pod(containers, pod, mig_nodes(node, 6, 1), IMAGE_ALL)
    assert seen["returncode"] == 0, seen["stderr"]
    caps = sorted(c["path"] for c in mig["caps_nodes"])
    assert seen["dev"] == sorted([*dra_gpus(6), "/dev/nvidia-caps", *caps])
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == mig["uuid"]
    assert [d["id"] for d in decision(seen)["devices"]] == ["6:1"]
    assert f"DRA claim ml/mig ({name} of gpu.nvidia.com)" in inspect_pod(node, pod)


def test_a_pod_without_a_claim_whose_image_says_all_gets_no_gpu(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    pod = Pod(node, tmp_path, [dra_state.claim("c-4", "elsewhere", ["other-pod"], ["gpu-2"])])
    seen = claim_pod(containers, pod, [], IMAGE_ALL, cdi_env=[])
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == []
    assert not decision(seen)["devices"]
    assert "refused" in inspect_pod(node, pod)


def test_a_forged_cdi_injection_without_a_claim_is_refused(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """A CDI spec naming GPU 5 for a pod whose claim holds GPU 2 (the claim's CDI names of the
    other pod, or a spec dropped into the CDI folder): the create fails with one line."""
    pod = Pod(node, tmp_path, [dra_state.claim("c-5", "mine", ["POD"], ["gpu-2"])])
    seen = claim_pod(containers, pod, gpu_nodes(2, 5), IMAGE_ALL)
    assert seen["returncode"] != 0
    lines = [x for x in seen["stderr"].splitlines() if x.startswith("gpuhook:")]
    assert len(lines) == 1, seen["stderr"]
    assert "the engine injected /dev/nvidia5 (GPU 5" in lines[0]
    assert "DRA claim ml/mine (gpu-2 of gpu.nvidia.com) allocates 2" in lines[0]
    # no container, so no record for inspect pod: the dry run over its bundle says why
    dry = node.gpuhook("inspect", "spec", str(seen["bundle"]), env=pod.env)
    assert dry.returncode != 0 and dry.stderr.strip() == lines[0], dry.stderr


def test_the_images_all_without_the_drivers_void_grants_only_the_claim(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """A driver whose CDI spec sets no NVIDIA_VISIBLE_DEVICES: the image's `all` reaches the
    runtime as the last value. It grants no other GPU and refuses none of the claim's."""
    pod = Pod(node, tmp_path, [dra_state.claim("c-6", "one", ["POD"], ["gpu-2"])])
    seen = claim_pod(containers, pod, gpu_nodes(2), IMAGE_ALL, cdi_env=[])
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == dra_gpus(2)


def test_inspect_pod_by_uid_explains_a_claim_that_cannot_start(
    node: FakeNode, tmp_path: Path
) -> None:
    """A pod refused or never started has no record; its claim's CDI spec is in no CDI folder
    (lost from /var/run/cdi after a reboot while the checkpoint persisted) and the kubelet no
    longer has the pod: inspect pod <uid> says both."""
    pod = Pod(node, tmp_path, [dra_state.claim("c-7", "lost", ["POD"], ["gpu-2"])])
    out = node.gpuhook("inspect", "pod", pod.uid, "-o", "json", env=pod.env)
    assert out.returncode == 0, out.stderr
    [claim] = json.loads(out.stdout)["dra_claims"]
    assert (claim["claim"], claim["devices"]) == ("ml/lost", ["gpu-2 (gpu.nvidia.com)"])
    assert "a stale checkpoint" in claim["problems"][0]
    assert "CDI device k8s.gpu.nvidia.com/claim=c-7-gpu-2 is in no spec" in claim["problems"][1]
    table = node.gpuhook("inspect", "pod", pod.uid, "-o", "table", env=pod.env)
    assert "DRA claims" in table.stdout and "ml/lost (c-7): gpu-2 (gpu.nvidia.com)" in table.stdout
    missing = node.gpuhook("inspect", "pod", "no-such-uid", env=pod.env)
    assert missing.returncode != 0 and "no decision record" in missing.stderr

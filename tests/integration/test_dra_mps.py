"""A DRA claim shared by two pods on one GPU gets gpuhook's MPS (issue 35, sharing on DRA): the
claim's GPU is an MPS-shared GPU of gpuhook's config (mps.gpus), so each pod's container, whose
GPU node containerd injected from the claim's CDI spec, is verified against the claim (its
PodUIDs hold both pods) and becomes a client of that GPU's control daemon with its share of the
GPU (active thread percentage and pinned memory limit) from gpuhook's MPS config. Real runc
through gpuhook-runtime on the fake node, the fake MPS daemon."""

from __future__ import annotations

import json
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import dra_state
from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.integration.test_dra_node import CDI_ENV
from tests.integration.test_leak_matrix import write_checkpoint
from tests.integration.test_mps import MIB, Mps, container_env

pytestmark = [pytest.mark.slow, pytest.mark.root]

GPU = 1
SCRIPT = "env | grep ^CUDA_MPS_; ls /run/gpuhook/mps/pipe"


@pytest.fixture
def shared(node: FakeNode, tmp_path: Path) -> Iterator[tuple[Mps, list[str]]]:
    """MPS on GPU 1 (2 replicas), its daemon started, and a claim of GPU 1 prepared for two
    pods (NVIDIA's driver's ShareID set: one device, several consumers)."""
    pods = [f"pod-{uuidlib.uuid4().hex[:10]}" for _ in range(2)]
    kubelet = tmp_path / "kubelet"
    claim = dra_state.claim("c-s", "shared-gpu", pods, [f"gpu-{GPU}"], share_id="share-1")
    dra_state.write(kubelet, [claim])
    cp = write_checkpoint(tmp_path / "kubelet_internal_checkpoint", [])
    m = Mps(node, tmp_path / "mps-test")
    m.env = node.variant(
        m.folder,
        mps={"root": str(m.root), "gpus": [GPU], "replicas": 2},
        state_dir=str(m.folder / "state"),
        inventory={"path": str(node.root / "state" / "inventory.json")},
        policy={"kubernetes": {"checkpoint": str(cp), "kubelet_dir": str(kubelet)}},
    )
    m.start()
    yield m, pods
    m.cleanup()


def test_a_claim_shared_by_two_pods_gets_mps(
    node: FakeNode, containers: Containers, shared: tuple[Mps, list[str]]
) -> None:
    mps, pod_uids = shared
    share = int(node.truth["gpus"][GPU]["memory"]) // 2 // MIB
    for i, uid in enumerate(pod_uids):
        bundle = containers.bundle(
            args=("/bin/sh", "-c", SCRIPT),
            env=["NVIDIA_VISIBLE_DEVICES=all"],
            annotations=f.k8s(uid=uid, name=f"shared-{i}", namespace="ml"),
        )
        spec = json.loads((bundle / "config.json").read_text())
        spec["process"]["env"] += CDI_ENV
        node_ = {"path": f"/dev/nvidia{GPU}", "type": "c", "major": 195, "minor": GPU}
        spec["linux"]["devices"] = [{**node_, "fileMode": 438, "uid": 0, "gid": 0}]
        spec["linux"]["resources"]["devices"].append(
            {"allow": True, "type": "c", "major": 195, "minor": GPU, "access": "rwm"}
        )
        (bundle / "config.json").write_text(json.dumps(spec, separators=(",", ":")))
        out = containers.run(bundle, mps.env)
        assert out.returncode == 0, out.stderr
        assert container_env(out.stdout) == {
            "CUDA_MPS_PIPE_DIRECTORY": "/run/gpuhook/mps/pipe",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={share}M",
        }
        # the daemon's pipe folder, mounted: its control socket and pid file
        assert out.stdout.strip().splitlines()[-2:] == ["control", "nvidia-cuda-mps-control.pid"]
        record = json.loads((bundle / "gpuhook-decision.json").read_text())
        assert record["decision"]["channel"] == "engine-cdi"
        assert record["mps"]["group"] == f"gpu{GPU}"
        why = [r["why"] for r in record["decision"]["reasons"] if r["channel"] == "engine-cdi"]
        assert "DRA claim ml/shared-gpu (gpu-1 of gpu.nvidia.com)" in why[0]

"""doctor's kubelet DRA state check (issue 35): why a pod's claim cannot start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuhook.cli import doctor, doctor_dra
from tests import dra_state
from tests.logcapture import paper_node

POD = "pod-uid-1"


def check(
    tmp_path: Path, claims: list[dict[str, Any]] | None, specs: tuple[str, ...] = ()
) -> list[str]:
    kubelet = tmp_path / "kubelet"
    (kubelet / "pods" / POD).mkdir(parents=True)
    if claims is not None:
        dra_state.write(kubelet, claims)
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    kind = "k8s.gpu.nvidia.com/claim"
    (cdi / "claim.json").write_text(
        json.dumps({"cdiVersion": "0.5.0", "kind": kind, "devices": [{"name": n} for n in specs]})
    )
    config = paper_node(tmp_path, policy={"kubernetes": {"kubelet_dir": str(kubelet)}})
    results = doctor_dra.check_dra(doctor.Node(str(config)))
    return [f"{r.status}: {r.message}" for r in results]


def test_no_dra_state_is_skipped(tmp_path: Path) -> None:
    [line] = check(tmp_path, None)
    assert line.startswith("skip: no DRA state")


def test_a_healthy_claim_passes(tmp_path: Path) -> None:
    claim = dra_state.claim("c-1", "x", [POD], ["gpu-2"])
    [line] = check(tmp_path, [claim], ("c-1-gpu-2",))
    assert line.startswith("pass:") and "1 claims of gpu.nvidia.com" in line


def test_a_claim_whose_cdi_spec_is_lost(tmp_path: Path) -> None:
    """kubernetes#141433: /var/run/cdi emptied by a reboot, the checkpoint kept."""
    [line] = check(tmp_path, [dra_state.claim("c-1", "x", [POD], ["gpu-2"])])
    assert line.startswith("fail: claim ml/x (c-1): CDI device k8s.gpu.nvidia.com/claim=c-1-gpu-2")
    assert "its pods cannot start" in line


def test_a_stale_claim_and_an_unknown_device(tmp_path: Path) -> None:
    claim = dra_state.claim("c-9", "old", ["gone-pod"], ["gpu-12"])
    lines = check(tmp_path, [claim], ("c-9-gpu-12",))
    assert lines[0].startswith("warn: claim ml/old (c-9) is prepared for gone-pod")
    assert lines[1].startswith("fail: claim ml/old (c-9): device gpu-12 is no GPU")


def test_a_torn_checkpoint_fails(tmp_path: Path) -> None:
    kubelet = tmp_path / "kubelet"
    kubelet.mkdir()
    (kubelet / "dra_manager_state").write_text('{"Data": "{}", "Checksum": 1}')
    config = paper_node(tmp_path, policy={"kubernetes": {"kubelet_dir": str(kubelet)}})
    [result] = doctor_dra.check_dra(doctor.Node(str(config)))
    assert result.status == "fail" and "fails its checksum" in result.message

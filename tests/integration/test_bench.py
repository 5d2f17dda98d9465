"""The bench harness works end to end (tiny N): every case runs through plain runc and the
gpuhook-runtime dispatcher, the concurrent creates succeed with whole specs, and the JSON report
carries what the README table is made of. Timings are not asserted: this is not a timing test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]


def test_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "lifecycle.py"),
            "-n",
            "2",
            "--warmup",
            "1",
            "--concurrency",
            "3",
            "--rounds",
            "1",
            "--quiet",
            "--json",
            str(out),
            "--markdown",
            str(tmp_path / "bench.md"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "targets (gpuhook):" in run.stdout
    report = json.loads(out.read_text())
    table = (tmp_path / "bench.md").read_text()
    assert table.startswith("| case | runc median (p95) |") and "Same run:" in table
    cases = {(r["case"], r["runtime"]) for r in report["cases"]}
    for case in ("nongpu", "leak", "gpu1", "gpu1big", "gpu8", "mig56", "passthrough"):
        assert (case, "runc") in cases and (case, "gpuhook") in cases
    for row in report["cases"]:
        assert row["n"] == 2 and 0 < row["min"] <= row["median"] <= row["p95"]
        if row["case"] != "passthrough":
            assert set(row["phases"]) == {"create", "start", "delete"}
    concurrent = {r["runtime"]: r for r in report["concurrent"]}
    for name in ("runc", "gpuhook"):
        assert concurrent[name]["attempts"] == 3
        assert concurrent[name]["failures"] == 0
        assert concurrent[name]["corrupt_specs"] == 0
    assert {t["target"].split(" ")[0] for t in report["targets"]} >= {
        "nongpu",
        "leak",
        "gpu1",
        "gpu1big",
        "gpu8",
        "mig56",
        "passthrough",
        "3",
    }
    assert report["machine"]["python_start_ms"]["n"] == 2
    assert report["runc_on_edited_gpu1"]["n"] == 2
    assert "plain runc on gpuhook's 1-GPU spec: median" in run.stdout
    # where the 1-GPU overhead goes: runc's parts of gpuhook's spec, run by plain runc
    assert {k: v["n"] for k, v in report["runc_parts"].items()} == {
        "edited": 2,
        "nohook": 2,
        "perfile": 2,
    }
    assert len(report["gpu1_parts_ms"]) == 4 and "part by part" in run.stdout
    assert any(t["target"].startswith("gpuhook's own share") for t in report["targets"])
    assert report["machine"]["cpus"] >= 1 and report["machine"]["versions"]["runc"]
    mode = report["mode"]
    assert mode["service_socket"].endswith("/runtime.sock") and not mode["no_service"]
    assert (mode["compare_python"], mode["peers"], mode["nodes"]) == (False, [], None)
    assert "not the runtime service's workers" in run.stdout


def test_realnode_bench_smoke(tmp_path: Path, fake_node_factory: Any) -> None:
    """bench/realnode.py (the figures of a real GPU node) on a fake node's config: every case
    through runc and gpuhook-runtime with the service, the GPU specs checked, JSON and table."""
    node = fake_node_factory("--gpus", "1")
    node.refresh()
    out = tmp_path / "real.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "realnode.py"),
            "--config",
            str(node.config),
            "-n",
            "2",
            "--warmup",
            "1",
            "--work",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("| case | runc median (p95), overhead | gpuhook median (p95)")
    assert "plain runc on gpuhook's GPU-0 spec: median" in run.stdout
    report = json.loads(out.read_text())
    cases = {(r["case"], r["runtime"]) for r in report["cases"]}
    for case in ("nongpu", "leak", "gpu1", "gpu1big"):
        assert (case, "runc") in cases and (case, "gpuhook") in cases
    assert all(r["n"] == 2 for r in report["cases"]) and report["runc_on_edited_gpu1"]["n"] == 2
    assert list((tmp_path / "work").iterdir()) == []  # the bundles and the service are gone
    records = Path(node.truth["state_dir"]) / "containers"
    assert not records.exists() or list(records.iterdir()) == []  # none among the node's

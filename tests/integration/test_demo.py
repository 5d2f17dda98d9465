"""The README's first command runs `make demo` (tools/demo.py): it must keep working and keep
showing what it says it shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.root]


def test_the_demo_runs_real_containers_and_explains_them(tmp_path: Path) -> None:
    env = {**os.environ, "GPUHOOK_DEMO_DIR": str(tmp_path / "demo")}
    run = subprocess.run(
        [sys.executable, str(REPO / "tools" / "demo.py")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    seen = [line for line in run.stdout.splitlines() if line.startswith("/dev nodes:")]
    # 3a: docker-style GPU 1; 3b: the default-all leak, refused; 3c: the allocated GPU 2
    assert [s.split(":", 1)[1].split() for s in seen] == [
        ["nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidiactl"],
        [],
        ["nvidia-uvm", "nvidia-uvm-tools", "nvidia2", "nvidiactl"],
    ]
    assert "NVIDIA_VISIBLE_DEVICES=void" in run.stdout
    assert "gpuhook runtime service: listening on " in run.stdout
    pod = run.stdout.split("inspect pod ml/trainer", 1)[1]
    assert "demo-leak" in pod and "refused" in pod and "demo-alloc" in pod and "granted 2" in pod
    selftest = run.stdout.split("gpuhook selftest --output table", 1)[1]
    assert "PASS  mig 7:2 " in selftest and "PASS  kubernetes " in selftest
    assert "selftest: 0 failed, 18 passed, 1 skipped" in selftest

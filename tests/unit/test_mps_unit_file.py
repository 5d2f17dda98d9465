"""The systemd template unit packaging/systemd/gpuhook-mps@.service: its commands are the CLI's,
and systemd itself accepts the file."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "packaging" / "systemd" / "gpuhook-mps@.service"


def test_unit_runs_gpuhook_mps_start_and_stop_for_its_instance() -> None:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    service = parser["Service"]
    assert (service["Type"], service["RemainAfterExit"]) == ("oneshot", "yes")
    assert service["ExecStart"] == "/usr/bin/gpuhook mps start %i"
    assert service["ExecStop"] == "/usr/bin/gpuhook mps stop %i"
    assert parser["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    unit = tmp_path / "gpuhook-mps@.service"
    unit.write_text(UNIT.read_text())
    out = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "gpuhook-mps@0.service")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    problems = [
        line
        for line in (out.stdout + out.stderr).splitlines()
        if line.strip()
        and "/usr/bin/gpuhook is not executable" not in line  # not installed on a dev machine
        and "man nvidia-cuda-mps-control(1)" not in line  # the man page comes with the driver
    ]
    assert problems == []

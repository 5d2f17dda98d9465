"""The systemd template unit packaging/systemd/gpuhook-mps@.service: its commands are the CLI's,
and systemd itself accepts the file."""

from __future__ import annotations

import configparser
import shutil
from pathlib import Path

import pytest

from tests.conftest import systemd_verify

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
    # the man page comes with the driver
    assert systemd_verify(tmp_path / "gpuhook-mps@0.service", "nvidia-cuda-mps-control(1)") == []

"""The systemd unit packaging/systemd/gpuhook-nri.service: it runs the CLI's `gpuhook nri`,
restarts it whatever ends it, is shipped but neither enabled nor started, and systemd accepts
it."""

from __future__ import annotations

import configparser
import shutil
from pathlib import Path

import pytest

from tests.conftest import systemd_verify

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "packaging" / "systemd" / "gpuhook-nri.service"


def test_unit_runs_the_plugin_and_restarts_it() -> None:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    svc = parser["Service"]
    assert svc["ExecStart"] == "/usr/bin/gpuhook nri"
    assert (svc["Type"], svc["Restart"]) == ("simple", "always")
    assert parser["Unit"]["StartLimitIntervalSec"] == "0"  # never given up on
    assert parser["Install"]["WantedBy"] == "multi-user.target"
    rules = (REPO / "packaging" / "deb" / "debian" / "rules").read_text()
    assert "dh_installsystemd --no-start --no-enable $(OPT_IN_UNITS)" in rules
    assert "OPT_IN_UNITS := $(filter gpuhook-nri.service,$(UNITS))" in rules


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text())
    assert systemd_verify(unit, "gpuhook(1)") == []


def test_the_cli_runs_the_plugin_on_the_socket_it_is_given(tmp_path: Path) -> None:
    """`gpuhook nri --help` names the default socket and index; a bad index is refused with
    one line before anything is connected."""
    import subprocess

    import testbed

    out = subprocess.run([testbed.GPUHOOK, "nri", "--help"], capture_output=True, text=True,
                         check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "/var/run/nri/nri.sock" in out.stdout
    bad = subprocess.run([testbed.GPUHOOK, "nri", "--index", "7"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "gpuhook: Invalid value for --index: the NRI plugin index must be two digits, not '7' "
        "(see: gpuhook nri --help)"
    ]

"""`gpuhook doctor` in NRI mode: containerd's NRI settings, the running plugin's status, and the
nri and containerd checks' lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhook.cli import doctor, doctor_engines
from gpuhook.engines import containerd_nri
from gpuhook.nri import state
from tests.logcapture import paper_node

V3 = """version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = 'runc'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = '/usr/sbin/runc'
"""
REQUIRED = """
[plugins.'io.containerd.nri.v1.nri'.default_validator]
  enable = true
  required_plugins = ['gpuhook']
"""


@pytest.mark.parametrize(
    ("text", "enabled", "required"),
    [
        (V3, True, ()),  # containerd 2.x: NRI on by default, no validator
        (V3 + REQUIRED, True, ("gpuhook",)),
        (V3.replace("version = 3", "version = 2") + "\n[plugins.x]\n", False, ()),  # 1.7: off
        (V3 + "[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n", False, ()),
        (V3 + REQUIRED.replace("enable = true", "enable = false"), True, ()),
    ],
)
def test_containerd_nri_settings(
    tmp_path: Path, text: str, enabled: bool, required: tuple[str, ...]
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    settings = containerd_nri.read(str(path))
    assert (settings.error, settings.enabled, settings.required) == ("", enabled, required)
    assert settings.socket == "/var/run/nri/nri.sock"


def test_a_validator_names_the_plugin_by_name_or_index_and_name() -> None:
    assert containerd_nri.NriSettings(True, required=("10-gpuhook",)).requires("gpuhook")
    assert not containerd_nri.NriSettings(True, required=("gpuhook-x",)).requires("gpuhook")


def _node(tmp_path: Path, containerd: str) -> doctor.Node:
    path = tmp_path / "config.toml"
    path.write_text(containerd)
    return doctor.Node(str(paper_node(tmp_path)), containerd_config=str(path))


def test_runtime_mode_skips_the_nri_check(tmp_path: Path) -> None:
    node = _node(tmp_path, V3)
    assert doctor_engines.check_nri(node).status == doctor.SKIP
    assert doctor_engines.check_containerd(node).status == doctor.FAIL  # no runtime, no plugin


def test_nri_mode_passes_when_containerd_requires_the_plugin(tmp_path: Path) -> None:
    node = _node(tmp_path, V3 + REQUIRED)
    assert node.config is not None
    state.announce(node.config, "/var/run/nri/nri.sock", "10-gpuhook")
    try:
        nri = doctor_engines.check_nri(node)
        containerd = doctor_engines.check_containerd(node)
        engines = doctor_engines.check_engines(node)
    finally:
        state.retire(node.config)
    assert (nri.status, containerd.status, engines) == (doctor.PASS, doctor.PASS, [])
    assert nri.message.endswith("on /var/run/nri/nri.sock; containerd requires it (fail closed)")
    assert containerd.message.startswith("NRI mode: gpuhook's NRI plugin 10-gpuhook decides")
    assert state.running(node.config) is None  # retired


def test_nri_mode_warns_when_the_plugin_is_not_required(tmp_path: Path) -> None:
    node = _node(tmp_path, V3)
    assert node.config is not None
    state.announce(node.config, "/s", "10-gpuhook")
    try:
        nri = doctor_engines.check_nri(node)
    finally:
        state.retire(node.config)
    assert nri.status == doctor.WARN
    assert "NRI fails open" in nri.message
    assert "required_plugins = ['gpuhook']" in nri.fix


def test_the_status_of_a_plugin_that_exited_is_not_believed(tmp_path: Path) -> None:
    node = _node(tmp_path, V3 + REQUIRED)
    assert node.config is not None
    status = Path(node.config.state_dir) / state.STATUS
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text('{"pid": 1, "start": 0, "socket": "/s", "plugin": "10-gpuhook"}')
    assert state.running(node.config) is None
    assert doctor_engines.check_nri(node).status == doctor.SKIP

"""`gpuhook inspect spec` as an operator runs it on a bundle's config.json (a dry run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuhook import log
from gpuhook.cli.commands import run
from tests import factories as f
from tests.logcapture import paper_node


def test_inspect_spec_diff_is_a_unified_diff_that_ends_its_last_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GPUHOOK_DEBUG", raising=False)
    config = paper_node(tmp_path)
    bundle = tmp_path / "b"
    (bundle / "rootfs").mkdir(parents=True)
    config_json = bundle / "config.json"
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"])
    config_json.write_text(json.dumps(spec))
    try:
        code = run(["--config", str(config), "inspect", "spec", str(config_json), "--diff"])
    finally:
        log.configure("info", "")
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:2] == [f"--- {config_json}", f"+++ {config_json} (gpuhook)"]
    assert any(line.startswith("+") and "/dev/nvidia1" in line for line in lines)
    assert out.endswith("}\n")  # the spec's last line, ended like every other
    assert json.loads(config_json.read_text()) == spec  # a dry run writes nothing

"""The man page the .deb ships (tools/mkman.py): every gpuhook command is in it, and it renders
without a single groff or man warning."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from gpuhook.cli.commands import main as cli

REPO = Path(__file__).resolve().parents[2]


def render_source() -> str:
    out = subprocess.run(
        [sys.executable, str(REPO / "tools" / "mkman.py")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SOURCE_DATE_EPOCH": "1700000000"},
    )
    return out.stdout


def leaf_commands(group: click.Group, prefix: str) -> list[str]:
    ctx = click.Context(group)
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        if isinstance(cmd, click.Group):
            out += leaf_commands(cmd, f"{prefix} {name}")
        else:
            out.append(f"{prefix} {name}")
    return out


def test_every_command_has_a_section() -> None:
    page = render_source()
    assert page.startswith('.TH GPUHOOK 1 "2023-11-14" "gpuhook 0.1.0"')
    sections = [line for line in page.splitlines() if line.startswith(".SS ")]
    commands = leaf_commands(cli, "gpuhook")
    assert "gpuhook config validate" in commands
    assert len(sections) == len(commands)
    for command in commands:
        assert any(s.startswith(f'.SS "{command.replace("-", chr(92) + "-")} ') for s in sections)
    assert "\\fB\\-\\-show\\fR" in page  # an option of config validate, with its help
    assert "Print the configuration with defaults filled in." in page


@pytest.mark.skipif(shutil.which("man") is None, reason="man-db is not installed")
def test_renders_without_warnings(tmp_path: Path) -> None:
    source = tmp_path / "gpuhook.1"
    source.write_text(render_source())
    out = subprocess.run(
        ["man", "--warnings", "-E", "UTF-8", "-l", str(source)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "MANWIDTH": "80", "LC_ALL": "C.UTF-8"},
    )
    assert out.returncode == 0
    assert out.stderr == ""
    text = re.sub(".\b", "", out.stdout)  # grotty's overstrike bold/underline
    assert "gpuhook-runtime is argv-compatible with runc(8)." in " ".join(text.split())
    assert "gpuhook inventory refresh [OPTIONS]" in text

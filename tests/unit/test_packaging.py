"""The Debian packaging's static facts: one version everywhere, maintainer scripts that parse."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import gpuhook

REPO = Path(__file__).resolve().parents[2]
DEBIAN = REPO / "packaging" / "deb" / "debian"


def test_one_version_everywhere() -> None:
    changelog = DEBIAN.joinpath("changelog").read_text().splitlines()[0]
    match = re.fullmatch(r"gpuhook \(([^)]+)\) \S+; urgency=\w+", changelog)
    assert match is not None, changelog
    pyproject = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert pyproject is not None
    # A native package (source format 3.0 (native)): the Debian version is the upstream one.
    assert DEBIAN.joinpath("source", "format").read_text().strip() == "3.0 (native)"
    assert match.group(1) == pyproject.group(1) == gpuhook.__version__


def test_maintainer_scripts_are_posix_sh() -> None:
    for name in ("postinst", "prerm", "postrm"):
        script = DEBIAN / f"gpuhook.{name}"
        assert script.read_text().startswith("#!/bin/sh\n")
        assert "#DEBHELPER#" in script.read_text()
        out = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr

"""The vendored pynvml (shipped in the .deb, where Debian has no python3-pynvml) is the unmodified
release pinned in scripts/bootstrap, and gpuhook falls back to it when no pynvml is installed."""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhook import _vendor

REPO = Path(__file__).resolve().parents[2]
VENDORED = REPO / "src" / "gpuhook" / "_vendor" / "pynvml.py"


def test_vendored_copy_is_the_pinned_release() -> None:
    pin = re.search(r"nvidia-ml-py==([0-9.]+)", (REPO / "scripts" / "bootstrap").read_text())
    assert pin is not None
    assert pin.group(1) == _vendor.PYNVML_VERSION
    body = VENDORED.read_bytes()
    assert hashlib.sha256(body).hexdigest() == _vendor.PYNVML_SHA256
    assert b"Redistribution and use in source and binary forms" in body[:2000]  # BSD-3 header


def test_vendored_copy_matches_the_installed_wheel() -> None:
    installed = importlib.metadata.version("nvidia-ml-py")  # a dependency (pyproject.toml)
    if installed != _vendor.PYNVML_VERSION:
        pytest.skip(f"nvidia-ml-py {installed} installed, {_vendor.PYNVML_VERSION} vendored")
    import pynvml

    assert Path(pynvml.__file__).read_bytes() == VENDORED.read_bytes()


def test_falls_back_to_the_vendored_copy_without_pynvml(tmp_path: Path) -> None:
    # An interpreter that sees gpuhook's source but no pynvml anywhere (-I -S, and a
    # sys.path without site-packages), as /usr/bin/python3 sees the .deb's files.
    code = (
        "import sys\n"
        f"sys.path[:] = [{str(REPO / 'src')!r}] + [p for p in sys.path if 'packages' not in p]\n"
        "import gpuhook._site\n"
        "gpuhook._site._done = True\n"  # keep site-packages (and its pynvml) out
        "from gpuhook.inventory.nvml import _import_pynvml\n"
        "print(_import_pynvml().__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "gpuhook._vendor.pynvml"

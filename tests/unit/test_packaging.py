"""The Debian packaging's static facts: one version everywhere, maintainer scripts that parse and
run modules that exist, one floor for the NVML bindings, no third-party copy in the tree."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import gpuhook
from gpuhook.inventory import nvml

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


def test_maintainer_scripts_run_modules_that_exist() -> None:
    for name in ("postinst", "prerm", "postrm"):
        text = (DEBIAN / f"gpuhook.{name}").read_text()
        for module in re.findall(r"python3 -I -m ([\w.]+)", text):
            path = REPO / "src" / (module.replace(".", "/") + ".py")
            assert path.is_file(), f"gpuhook.{name} runs {module}: no {path}"


NVML = REPO / "packaging" / "nvidia-ml-py"


def test_one_nvml_bindings_floor_and_pin() -> None:
    """The NVML loader's floor is the one the .deb and pyproject.toml ask for, and the release
    packaged (debian/changelog, the sdist's pin, the venv's pin) satisfies it."""
    floor = nvml.PYNVML_MINIMUM
    control = DEBIAN.joinpath("control").read_text()
    assert f"python3-nvidia-ml-py (>= {floor})," in control and "| python3-pynvml" not in control
    assert f'"nvidia-ml-py>={floor}",' in (REPO / "pyproject.toml").read_text()
    head = NVML.joinpath("debian", "changelog").read_text().splitlines()[0]
    match = re.fullmatch(r"python-nvidia-ml-py \(([\d.]+)-(\d+)\) \S+; urgency=\w+", head)
    assert match is not None, head
    upstream = match.group(1)
    assert nvml.release_tuple(upstream) >= nvml.release_tuple(floor)
    ((sha256, sdist),) = [
        line.split() for line in NVML.joinpath("SHA256SUMS").read_text().splitlines()
    ]
    assert re.fullmatch(r"[0-9a-f]{64}", sha256)
    assert sdist == f"nvidia_ml_py-{upstream}.tar.gz"
    assert NVML.joinpath("debian", "source", "format").read_text().strip() == "3.0 (quilt)"
    # scripts/bootstrap's venv pin is read from the same changelog.
    (line,) = [x for x in (REPO / "scripts/bootstrap").read_text().splitlines() if "NVML_PY=" in x]
    bootstrap = subprocess.run(
        ["sh", "-c", f'{line}; echo "$NVML_PY"'],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert bootstrap.stdout.strip() == upstream


def test_no_third_party_code_in_the_tree() -> None:
    """Third-party code comes in as a package (python3-nvidia-ml-py), never as a copy."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    notice = "Copyright (c) 2011-2023, " + "NVIDIA"  # pynvml.py's header, split to not match here
    copies = [
        name
        for name in filter(None, tracked)
        if (REPO / name).is_file() and notice in (REPO / name).read_text(errors="replace")
    ]
    assert copies == []
    assert not (REPO / "src" / "gpuhook" / "_vendor").exists()

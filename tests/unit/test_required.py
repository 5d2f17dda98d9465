"""CI cannot pass with a proof skipped: tests/required.py under GPUHOOK_REQUIRE_ALL=1."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# under GPUHOOK_REQUIRE_ALL/CI the inner run refuses to start unless root, and setpriv needs root:
# those tests are marked root (skipped when not root, outside CI)

SUITE = """
import pytest

@pytest.mark.slow
@pytest.mark.root
def test_proof():
    pass

@pytest.mark.slow
def test_other_proof():
    pass

def test_unit():
    pass

def test_tool_missing():
    if {skip}:
        pytest.skip("no such tool")
"""


def run(
    tmp_path: Path, *args: str, skip: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.required"]\n')
    (tmp_path / "test_suite.py").write_text(SUITE.format(skip=skip))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  slow\n  root\n")
    full = {k: v for k, v in os.environ.items() if k not in ("CI", "GPUHOOK_REQUIRE_ALL")}
    full.update(PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=full,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.root
def test_a_full_run_passes_and_counts(tmp_path: Path) -> None:
    out = run(tmp_path, GPUHOOK_REQUIRE_ALL="1")
    assert out.returncode == 0, out.stdout
    assert "gpuhook: 2 root/slow tests ran" in out.stdout


def test_outside_ci_a_skip_is_a_skip(tmp_path: Path) -> None:
    out = run(tmp_path, "-m", "not slow", skip=True)
    assert out.returncode == 0, out.stdout


@pytest.mark.root
def test_in_ci_any_skip_fails(tmp_path: Path) -> None:
    out = run(tmp_path, skip=True, CI="true")
    assert out.returncode == 1, out.stdout
    assert "GPUHOOK_REQUIRE_ALL: skipped: test_suite.py::test_tool_missing: " in out.stdout


@pytest.mark.root
def test_in_ci_a_deselected_proof_fails(tmp_path: Path) -> None:
    out = run(tmp_path, "-k", "not other", GPUHOOK_REQUIRE_ALL="1")
    assert out.returncode == 1, out.stdout
    assert "deselected root/slow test: test_suite.py::test_other_proof" in out.stdout
    out = run(tmp_path, "-m", "not slow", GPUHOOK_REQUIRE_ALL="1")
    assert out.returncode == 1, out.stdout
    assert "no root/slow test ran" in out.stdout


@pytest.mark.root
def test_in_ci_not_root_is_an_error() -> None:
    """Not root: outside CI the root/slow tests skip; in CI the run refuses to start."""
    with tempfile.TemporaryDirectory() as folder:
        _as_nobody(Path(folder))


def _as_nobody(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)  # pytest's own tmp folders are root's alone
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    for env, rc, line in (({}, 0, "2 skipped"), ({"CI": "true"}, 4, "need root")):
        run(tmp_path)  # writes the suite
        full = {k: v for k, v in os.environ.items() if k not in ("CI", "GPUHOOK_REQUIRE_ALL")}
        full.update(PYTHONPATH=str(REPO), HOME=str(tmp_path), **env)
        out = subprocess.run(
            [*nobody, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            cwd=tmp_path,
            env=full,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert out.returncode == rc and line in out.stdout + out.stderr, out.stdout + out.stderr

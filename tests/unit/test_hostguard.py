"""A test that writes a watched host folder fails the run (tests/hostguard.py), naming the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
import tests.hostguard as hostguard

hostguard.WATCHED = ({watched!r},)
pytest_plugins = ["tests.hostguard"]
"""

SUITE = """
from pathlib import Path

def test_clean():
    pass

def test_writes_the_host():
    Path({target!r}).write_text("left behind")
"""


def _run(folder: Path, target: Path) -> subprocess.CompletedProcess[str]:
    (folder / "conftest.py").write_text(CONFTEST.format(watched=str(target.parent)))
    (folder / "test_suite.py").write_text(SUITE.format(target=str(target)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("GPUHOOK_REQUIRE_ALL", None)
    env.pop("CI", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        capture_output=True, text=True, env=env, cwd=folder, timeout=120, check=False,
    )  # fmt: skip


def test_a_file_left_in_a_watched_folder_fails_the_run(tmp_path: Path) -> None:
    watched = tmp_path / "cdi"
    watched.mkdir()
    (watched / "nvidia.yaml").write_text("kept")  # there before the run: not the run's doing
    suite = tmp_path / "suite"
    suite.mkdir()
    out = _run(suite, watched / "gpuhook-nvidia.json")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "2 passed" in out.stdout
    assert "tests wrote the host's folders" in out.stdout
    assert f"added {watched / 'gpuhook-nvidia.json'}" in out.stdout
    assert "nvidia.yaml" not in out.stdout


def test_changes_name_added_removed_and_changed_files(tmp_path: Path) -> None:
    from tests import hostguard

    (tmp_path / "a").write_text("1")
    (tmp_path / "b").write_text("2")
    before = hostguard.snapshot((str(tmp_path),))
    (tmp_path / "a").unlink()
    (tmp_path / "b").write_text("22")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c").write_text("3")
    after = hostguard.snapshot((str(tmp_path),))
    assert hostguard.changes(before, after) == [
        f"added {tmp_path / 'sub' / 'c'}",
        f"removed {tmp_path / 'a'}",
        f"changed {tmp_path / 'b'}",
    ]
    assert hostguard.changes(after, hostguard.snapshot((str(tmp_path),))) == []


def test_the_session_guards_run_gpuhook_and_keeps_gpuhooks_cache_elsewhere(tmp_path: Path) -> None:
    """The host's /run/gpuhook is watched; the session's gpuhook caches each config it loads in a
    folder of its own (GPUHOOK_CACHE_DIR), as every process the tests start inherits it."""
    from gpuhook.config import cache, loading
    from tests import hostguard

    assert "/run/gpuhook" in hostguard.WATCHED
    folder = os.environ["GPUHOOK_CACHE_DIR"]
    assert os.path.isdir(folder) and not folder.startswith("/run/gpuhook")
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {tmp_path}\n")
    loading.load(str(config))
    assert cache.cache_dir_for(str(config)) == folder + str(config)
    assert (Path(folder + str(config)) / cache.COMPILED_NAME).is_file()

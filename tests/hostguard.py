"""No test writes the host's folders: a pytest plugin (loaded by tests/conftest.py).

Tests write only inside their temp folders. The folders below belong to the node: an operator's
CDI specs, which every CDI-aware engine reads (a spec left there by a test once broke the podman
tests with "conflicting device"), and gpuhook's own ``/run/gpuhook`` (the node's config cache,
runtime pointer, service socket and MPS folders). At the end of the session, a file added,
changed or removed under them fails the run, naming the file.

gpuhook caches each config it loads under ``GPUHOOK_CACHE_DIR`` (default /run/gpuhook/config):
the session sets it to a folder of its own for every gpuhook it starts, as an operator running a
second gpuhook beside the node's would (each fake node exports its own as well).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

WATCHED = ("/etc/cdi", "/var/run/cdi", "/run/gpuhook")
ENV_CACHE_DIR = "GPUHOOK_CACHE_DIR"
_BEFORE = pytest.StashKey[dict[str, tuple[int, int]]]()
_CACHE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """The session's gpuhook config cache: a temp folder, in this process's environment (so in
    every process it starts with it), removed at the end."""
    folder = tempfile.mkdtemp(prefix="gpuhook-test-cache-")
    config.stash[_CACHE] = folder
    os.environ[ENV_CACHE_DIR] = folder


def session_env() -> dict[str, str]:
    """The start of an environment a test builds from nothing for a gpuhook it runs: PATH and
    the session's config cache folder."""
    return {key: os.environ[key] for key in ("PATH", ENV_CACHE_DIR)}


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_CACHE, "")
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def snapshot(folders: tuple[str, ...] | None = None) -> dict[str, tuple[int, int]]:
    """Every file under ``folders`` (default :data:`WATCHED`): path -> (size, mtime in ns).
    Folders themselves are left out (an empty folder a tool makes before writing is no state)."""
    files: dict[str, tuple[int, int]] = {}
    for folder in WATCHED if folders is None else folders:
        for top, _dirs, names in os.walk(folder):
            for name in names:
                path = os.path.join(top, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                files[path] = (st.st_size, st.st_mtime_ns)
    return files


def changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """One line per file added, removed or changed between two snapshots."""
    lines = [f"added {p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    lines += [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return lines


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = snapshot()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    lines = changes(session.config.stash[_BEFORE], snapshot())
    if lines:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "tests wrote the host's folders (write only inside temp folders):\n  "
        text += "\n  ".join(lines)
        if reporter is not None:
            reporter.write_line(text, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

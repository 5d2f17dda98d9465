"""No test writes the host's folders: a pytest plugin (loaded by tests/conftest.py).

Tests write only inside their temp folders. The folders below belong to the node (an operator's
CDI specs, which every CDI-aware engine reads; a spec left there by a test once broke the podman
tests with "conflicting device"). At the end of the session, a file added, changed or removed
under them fails the run, naming the file.
"""

from __future__ import annotations

import os

import pytest

WATCHED = ("/etc/cdi", "/var/run/cdi")
_BEFORE = pytest.StashKey[dict[str, tuple[int, int]]]()


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

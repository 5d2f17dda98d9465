"""CI's guarantee that the proofs ran: a pytest plugin (loaded by tests/conftest.py).

Outside CI, tests marked ``root`` or ``slow`` are skipped when not root, and a test may skip
where its tool is missing. Under ``GPUHOOK_REQUIRE_ALL=1`` (``.ci/run`` sets it; ``CI=true``
does too) that would hide the proofs SECURITY.md cites, so there the run fails when:

- it is not root (root/slow tests would be skipped): a usage error before anything runs;
- a root/slow test was collected but deselected (``-m``, ``-k``, ``--deselect``);
- any test was skipped, whatever the reason (named, with the reason);
- no root/slow test ran at all (for instance, none was collected).

The terminal summary says how many root/slow tests ran.
"""

from __future__ import annotations

import os

import pytest

MARKERS = ("root", "slow")
_SKIPPED = pytest.StashKey[list[str]]()
_DESELECTED = pytest.StashKey[list[str]]()
_RAN = pytest.StashKey[set[str]]()


def required(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether this run must prove everything (CI)."""
    return environ.get("GPUHOOK_REQUIRE_ALL") == "1" or environ.get("CI", "").lower() == "true"


def _heavy(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) is not None for m in MARKERS)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SKIPPED] = []
    config.stash[_DESELECTED] = []
    config.stash[_RAN] = set()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    if required():
        raise pytest.UsageError(
            "GPUHOOK_REQUIRE_ALL/CI: the root and slow tests need root (mknod, runc); run as root"
        )
    skip = pytest.mark.skip(reason="needs root (mknod, runc)")
    for item in items:
        if _heavy(item):
            item.add_marker(skip)


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        config = items[0].config
        config.stash[_DESELECTED] += [i.nodeid for i in items if _heavy(i)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        item.config.stash[_SKIPPED].append(f"{item.nodeid}: {reason}")
    elif report.when == "call" and report.passed and _heavy(item):
        item.config.stash[_RAN].add(item.nodeid)
    return None


def problems(config: pytest.Config) -> list[str]:
    """What makes a required run fail; empty when every test ran."""
    out = [f"skipped: {entry}" for entry in config.stash[_SKIPPED]]
    out += [f"deselected root/slow test: {nodeid}" for nodeid in config.stash[_DESELECTED]]
    if not config.stash[_RAN]:
        out.append("no root/slow test ran")
    return out


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if required() and exitstatus == 0 and problems(session.config):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    config = terminalreporter.config
    ran = len(config.stash[_RAN])
    terminalreporter.write_line(f"gpuhook: {ran} root/slow tests ran")
    if required():
        for line in problems(config):
            terminalreporter.write_line(f"GPUHOOK_REQUIRE_ALL: {line}", red=True)

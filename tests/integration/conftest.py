"""Fixtures of the integration suites: containerd 2.x's binaries (unpacked once a session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import containerd2


@pytest.fixture(scope="session")
def containerd2_bin() -> Path:
    """The folder with containerd 2.x (``containerd``, ``containerd-shim-runc-v2``, ``ctr``), or a
    one-line failure: CI must never pass without it."""
    try:
        return containerd2.unpack()
    except containerd2.Missing as exc:
        pytest.fail(str(exc), pytrace=False)

"""Which modules an import statement loads, in a fresh ``python3 -I -S`` (as gpuhook-runtime
starts it), for tests that keep the container-create path free of heavy modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def loaded(statement: str, candidates: set[str]) -> list[str]:
    """The names in ``candidates`` that are in ``sys.modules`` after ``statement`` ran."""
    code = (
        f"import sys; sys.path.insert(0, {str(SRC)!r}); {statement}; "
        f"print(*sorted(set({sorted(candidates)!r}) & set(sys.modules)), sep='\\n')"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return out.split()

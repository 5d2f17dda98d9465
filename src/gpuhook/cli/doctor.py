"""``gpuhook doctor``: check the node, one small function per check.

A check is a function ``(Node) -> Result | list[Result]`` registered with :func:`register`; it
reads what it needs from the :class:`Node` (the config, the inventory, the engine configs) and
says ``pass``, ``warn``, ``fail`` or ``skip`` with one line, and for a failure (or a warning) the
fix. A new check is one registered function; :func:`run` runs them in order and never lets one
check's crash hide the others. The CLI renders the results (``tables.doctor_table``) and exits
non-zero when any check fails.

The checks are in three modules, reported in this order: the node itself
(:mod:`gpuhook.cli.doctor_node`), what runs containers (:mod:`gpuhook.cli.doctor_engines`) and
the node's shared state (:mod:`gpuhook.cli.doctor_host`). Each module registers its checks
ahead of the next one's first (:func:`section`), so the order holds whichever is imported first.
What a check is (statuses, :class:`Result`, :class:`Node`, :func:`register`) is
:mod:`gpuhook.cli.doctor_check`, which the check modules import; this module imports them (their
checks register themselves on import) and re-exports that vocabulary.
"""

from __future__ import annotations

from typing import Any

from gpuhook.cli import doctor_engines, doctor_host, doctor_node
from gpuhook.cli.doctor_check import (
    CHECKS,
    FAIL,
    PASS,
    SKIP,
    STATUSES,
    WARN,
    Check,
    Node,
    Result,
    register,
    section,
)
from gpuhook.errors import describe

__all__ = [
    "CHECKS",
    "FAIL",
    "PASS",
    "SECTIONS",
    "SKIP",
    "STATUSES",
    "WARN",
    "Check",
    "Node",
    "Result",
    "register",
    "run",
    "section",
    "view",
]


def run(node: Node, checks: list[Check] | None = None) -> list[Result]:
    results: list[Result] = []
    for check in CHECKS if checks is None else checks:
        if check.needs_config and node.config is None:
            results.append(Result(check.name, SKIP, "needs a valid config (see the config check)"))
            continue
        try:
            out = check.function(node)
        except Exception as exc:  # one broken check must not hide the others
            results.append(Result(check.name, FAIL, f"the check itself failed: {describe(exc)[1]}"))
            continue
        results.extend(out if isinstance(out, list) else [out])
    return results


def view(results: list[Result]) -> dict[str, Any]:
    summary = {s: sum(1 for r in results if r.status == s) for s in STATUSES}
    return {
        "ok": summary[FAIL] == 0,
        "summary": summary,
        "checks": [r.to_dict() for r in results],
    }


SECTIONS = (doctor_node, doctor_engines, doctor_host)

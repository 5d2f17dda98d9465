"""The self test's report: one :class:`Result` line per check, the timings of the containers it
ran, and their table (the JSON and YAML forms are the view itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuhook.cli.render import check_lines
from gpuhook.cli.render import table as columns
from gpuhook.model import check
from gpuhook.model.frozen import Frozen

if TYPE_CHECKING:
    from typing import Any

PASS, FAIL, SKIP = check.PASS, check.FAIL, check.SKIP
STATUSES = (PASS, FAIL, SKIP)


class Result(check.CheckResult):
    """One line: the check, PASS/FAIL/SKIP, what was seen, and for a failure the fix."""

    _statuses = STATUSES


class Timing(Frozen):
    """One container's ``create`` call through gpuhook-runtime, and plain runc's on the same
    bundle (None where that did not run to its exit): what gpuhook adds to a container start
    (the decision, the spec edit, runc's work for what was injected, the ldcache hook), without
    the container's own run (nvidia-smi and a CUDA program take far longer on a real GPU)."""

    check: str
    container_id: str
    gpuhook_s: float | None
    runc_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "container_id": self.container_id,
            "gpuhook_runtime_ms": _ms(self.gpuhook_s),
            "runc_ms": _ms(self.runc_s),
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def view(
    results: list[Result], timings: list[Timing], work_dir: str, runtimes: dict[str, str]
) -> dict[str, Any]:
    summary = {s: sum(1 for r in results if r.status == s) for s in STATUSES}
    return {
        "ok": summary[FAIL] == 0,
        "summary": summary,
        "checks": [r.to_dict() for r in results],
        "runtimes": dict(runtimes),
        "containers": [t.to_dict() for t in timings],
        "work_dir": work_dir,
    }


def table(data: dict[str, Any], color: bool = False) -> str:
    """The check lines (a failure with its fix), the timings, then the summary."""

    lines = check_lines(data["checks"], (FAIL, SKIP), color)
    if data["containers"]:
        rows = [
            [t["check"], _shown(t["gpuhook_runtime_ms"]), _shown(t["runc_ms"]), _diff(t)]
            for t in data["containers"]
        ]
        lines.append("\n")
        lines.append(columns(["CONTAINER", "GPUHOOK-RUNTIME", "RUNC", "DIFFERENCE"], rows))
        lines.append(
            f"(the create call; gpuhook-runtime: {data['runtimes'].get('gpuhook-runtime', '-')}, "
            f"runc: plain {data['runtimes'].get('runc') or 'runc'} on the same bundle)\n"
        )
    s = data["summary"]
    lines.append(f"\nselftest: {s[FAIL]} failed, {s[PASS]} passed, {s[SKIP]} skipped\n")
    return "".join(lines)


def _shown(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.0f} ms"


def _diff(timing: dict[str, Any]) -> str:
    ours, plain = timing["gpuhook_runtime_ms"], timing["runc_ms"]
    if ours is None or plain is None:
        return "-"
    return f"{round(ours - plain):+d} ms"

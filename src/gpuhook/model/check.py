"""One line of a check report, as ``gpuhook doctor`` and ``gpuhook selftest`` print it: the
check's name, its status, what was seen and, for a failure or a warning, the fix. Written once
here; doctor reports every status, selftest's :class:`gpuhook.selftest.report.Result` all but
``warn``."""

from __future__ import annotations

from gpuhook.model.frozen import Frozen, _init

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

PASS = "pass"  # noqa: S105 - a status word
WARN = "warn"
FAIL = "fail"
SKIP = "skip"
STATUSES = (PASS, WARN, FAIL, SKIP)


class CheckResult(Frozen):
    """One line of the report; ``message`` and ``fix`` with their whitespace folded."""

    check: str
    status: str
    message: str
    fix: str = ""

    _statuses: ClassVar[tuple[str, ...]] = STATUSES  # this kind of report's statuses

    def __init__(self, check: str, status: str, message: str, fix: str = "") -> None:
        if status not in self._statuses:
            raise ValueError(f"unknown check status {status!r}")
        _init(
            self,
            check=check,
            status=status,
            message=" ".join(message.split()),
            fix=" ".join(fix.split()),
        )

    def to_dict(self) -> dict[str, Any]:
        """``check``, ``status``, ``message``, ``fix``: the JSON of a report line."""
        return {name: getattr(self, name) for name in self._fields}

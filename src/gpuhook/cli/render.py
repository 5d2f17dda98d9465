"""Turning views (plain dicts) into what a person or a program reads: tables, JSON, YAML."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

FORMATS = ("table", "json", "yaml")


def to_json(view: Any) -> str:
    return json.dumps(view, indent=2, sort_keys=False) + "\n"


def to_yaml(view: Any) -> str:
    return str(yaml.safe_dump(view, sort_keys=False, default_flow_style=False, width=100))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "") -> str:
    """Left-aligned columns separated by two spaces; empty cells shown as '-'."""
    cells = [[str(h) for h in headers]] + [
        ["-" if c is None or c == "" else str(c) for c in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        lines.append(indent + line)
    return "\n".join(lines) + "\n"


def section(title: str, body: str, color: bool) -> str:
    head = f"\x1b[1m{title}\x1b[0m" if color else title
    return f"{head}\n{body}"


def check_lines(checks: list[dict[str, Any]], fix_for: tuple[str, ...], color: bool) -> list[str]:
    """One line per check (doctor's, selftest's): status, check, what was found, and its fix
    for a status in ``fix_for``."""
    width = max((len(c["check"]) for c in checks), default=5)
    lines = []
    for c in checks:
        status = c["status"]
        line = f"{paint(status.upper().ljust(4), status, color)}  {c['check'].ljust(width)}  "
        line += c["message"]
        if c.get("fix") and status in fix_for:
            line += f"; fix: {c['fix']}"
        lines.append(line.rstrip() + "\n")
    return lines


def paint(text: str, status: str, color: bool) -> str:
    """Colour a status word: pass/granted green, warn yellow, fail/refused red."""
    if not color:
        return text
    code = {
        "pass": "32",
        "ok": "32",
        "granted": "32",
        "fresh": "32",
        "warn": "33",
        "stale": "33",
        "ignored": "33",
        "superseded": "2",
        "skip": "2",
        "fail": "31",
        "refused": "31",
        "error": "31",
    }.get(status)
    return f"\x1b[{code}m{text}\x1b[0m" if code else text


def mib(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB"


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s ago"
    if s < 7200:
        return f"{s // 60}m ago"
    if s < 172800:
        return f"{s // 3600}h ago"
    return f"{s // 86400}d ago"

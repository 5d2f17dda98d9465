"""The CRI plugin's ``default_runtime_name`` as ``gpuhook runtime configure --set-as-default``
sets it and ``unconfigure`` gives it back (pure, text in, text out).

The line is edited as text so that undo can restore the file byte for byte:

- a file whose default is ``runc`` gets ``<name>`` in place (quotes, spacing and a trailing
  comment kept); undo puts ``runc`` back;
- a file whose default is another runtime gets ``<name>`` and a marker comment with the
  previous value (``# gpuhook runtime configure: was 'crun'``); undo puts that value back and
  drops the comment;
- a file without ``default_runtime_name`` (containerd then uses runc) gets the line right after
  its ``[plugins.<cri>.containerd]`` header, or a new table at the end of the file, marked
  ``# gpuhook runtime configure: added``; undo removes what was added.

Every edit is checked by its caller against the intended data (:func:`containerd_toml.verify`).
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

from gpuhook.engines import containerd_toml as ctoml
from gpuhook.engines.common import RUNC
from gpuhook.engines.readers import CRI_PLUGIN
from gpuhook.errors import RegistrationError

MARK = "# gpuhook runtime configure:"
ADDED = f"{MARK} added"
LINE = re.compile(r"^(\s*default_runtime_name\s*=\s*)([\"'])([^\"']*)\2(.*)$")
_WAS = re.compile(rf"^\s*{re.escape(MARK)} was (.+?)\s*$")


def _lines_of(text: str) -> list[int]:
    return [i for i, line in enumerate(text.split("\n")) if LINE.match(line)]


def set_default(text: str, version: int, name: str, quote: str, source: str) -> str:
    """``text`` with ``default_runtime_name = <name>`` in the CRI plugin's containerd table."""
    lines = text.split("\n")
    found = _lines_of(text)
    if len(found) > 1:
        raise RegistrationError(
            f"{source}: default_runtime_name appears {len(found)} times; nothing written "
            "(edit the file by hand)"
        )
    value = ctoml.toml_string(name, quote)
    if found:
        m = LINE.match(lines[found[0]])
        if m is None or m.group(3) == name:
            return text
        tail = m.group(4)
        if m.group(3) != RUNC and not tail.strip():
            tail = f"  {MARK} was {m.group(2)}{m.group(3)}{m.group(2)}"
        lines[found[0]] = f"{m.group(1)}{value}{tail}"
        return "\n".join(lines)
    headers = [i for i, line in enumerate(lines) if ctoml.header_re(version, "").match(line)]
    if len(headers) == 1:
        at = headers[0]
        lines.insert(at + 1, f"{_key_indent(lines, at)}default_runtime_name = {value}  {ADDED}")
        return "\n".join(lines)
    plugin = CRI_PLUGIN[version]
    head = f"[plugins.{quote}{plugin}{quote}.containerd]  {ADDED}"
    block = f"\n{head}\n  default_runtime_name = {value}  {ADDED}\n"
    return text + block if text.endswith("\n") else text + "\n" + block


def _key_indent(lines: list[str], header: int) -> str:
    """The indentation of the table's keys: its first key's, else the header's plus two."""
    for line in lines[header + 1 :]:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if ctoml.HEADER.match(line):
            break
        return line[: len(line) - len(line.lstrip())]
    head = lines[header]
    return head[: len(head) - len(head.lstrip())] + "  "


def previous(text: str, name: str) -> tuple[bool, str]:
    """What undo gives back for a default of ``<name>``: (present, value). Not present: the
    line was added by configure (remove it); else the value to restore (runc unless the line's
    marker names another)."""
    for line in text.split("\n"):
        m = LINE.match(line)
        if m is None or m.group(3) != name:
            continue
        tail = m.group(4)
        if ADDED in tail:
            return False, ""
        was = _WAS.match(tail)
        if was is not None:
            return True, _parse_value(was.group(1))
    return True, RUNC


def _parse_value(raw: str) -> str:
    try:
        value: Any = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return RUNC
    return value if isinstance(value, str) else RUNC


def unset_default(lines: list[str], i: int, name: str, out: list[str]) -> bool:
    """Undo's handling of line ``i`` (appended to ``out`` as it should read). Returns False
    when the line is not a default of ``<name>`` (the caller copies it)."""
    m = LINE.match(lines[i])
    if m is None or m.group(3) != name:
        return False
    tail = m.group(4)
    if ADDED in tail:
        if out and ADDED in out[-1] and ctoml.HEADER.match(out[-1]):
            out.pop()  # the table configure added for the line, and the blank line before it
            if out and not out[-1].strip():
                out.pop()
        return True
    was = _WAS.match(tail)
    if was is not None:
        out.append(f"{m.group(1)}{was.group(1)}")
    else:
        out.append(f"{m.group(1)}{m.group(2)}{RUNC}{m.group(2)}{tail}")
    return True

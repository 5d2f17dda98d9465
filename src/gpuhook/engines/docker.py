"""Register gpuhook-runtime with docker (pure: text in, text out).

``daemon.json`` gets ``runtimes.<name> = {"path": <runtime path>}`` and, as the default,
``"default-runtime": <name>``. Every other key keeps its value and its place; the file's
indentation is kept. JSON has no comments, so nothing else is lost. Unconfiguring removes the
runtime and, where ``<name>`` was the default, the ``default-runtime`` key (runc is docker's
default). Malformed input raises :class:`gpuhook.errors.RegistrationError` with one line.
"""

from __future__ import annotations

import json
from typing import Any

from gpuhook.engines.common import DEFAULT_NAME, DEFAULT_RUNTIME_PATH, RUNC, Edit, check_name
from gpuhook.errors import RegistrationError


def _docker_load(text: str | None, source: str) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise RegistrationError(f"{source}: malformed JSON: duplicate key {key!r}")
            out[key] = value
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise RegistrationError(
            f"{source}: malformed JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(data, dict):
        raise RegistrationError(
            f"{source}: the top level must be a JSON object, not {_json_kind(data)}"
        )
    runtimes = data.get("runtimes")
    if runtimes is not None and not isinstance(runtimes, dict):
        raise RegistrationError(
            f"{source}: runtimes: must be an object, not {_json_kind(runtimes)}"
        )
    for key, value in (runtimes or {}).items():
        if not isinstance(value, dict):
            raise RegistrationError(
                f"{source}: runtimes.{key}: must be an object, not {_json_kind(value)}"
            )
    default = data.get("default-runtime")
    if default is not None and not isinstance(default, str):
        raise RegistrationError(
            f"{source}: default-runtime: must be a string, not {_json_kind(default)}"
        )
    return data


def _json_kind(value: Any) -> str:
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return kinds.get(type(value), "a number")


def _json_indent(text: str | None) -> str:
    """The indentation unit of a JSON text (two spaces when it has none)."""
    for line in (text or "").splitlines()[1:]:
        stripped = line.lstrip(" \t")
        if stripped and stripped != line:
            return line[: len(line) - len(stripped)]
    return "  "


def _docker_dump(data: dict[str, Any], like: str | None) -> str:
    """``data`` as JSON, in the layout of ``like`` (the file's text): members whose value did not
    change keep their exact text, changed ones are rewritten in place, new ones go last."""
    unit = _json_indent(like)
    full = json.dumps(data, indent=unit, ensure_ascii=False) + "\n"
    if not like or not like.strip():
        return full
    start = len(like) - len(like.lstrip())
    try:
        spliced = _splice(like, start, data, unit)
    except (ValueError, IndexError):
        return full
    text = like[:start] + spliced[0] + like[spliced[1] :]
    # The splice must read back as exactly the intended data, key order included.
    try:
        same = json.dumps(json.loads(text)) == json.dumps(data)
    except ValueError:
        same = False
    return text if same else full


_WS = " \t\n\r"


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _splice(text: str, start: int, new: Any, unit: str) -> tuple[str, int]:
    """Re-render the JSON value at ``text[start:]`` as ``new``; returns (text, end of old value).
    Objects are edited member by member; any other value that changed is re-serialised."""
    decoder = json.JSONDecoder()
    old, end = decoder.raw_decode(text, start)
    if json.dumps(old) == json.dumps(new):
        return text[start:end], end
    if not (isinstance(old, dict) and isinstance(new, dict) and old):
        return _render(new, text, start, unit), end
    members: list[tuple[str, int, int, int]] = []  # key, key start, value start, value end
    i = _skip(text, start + 1)
    while True:
        key, after_key = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
        colon = _skip(text, after_key)
        if text[colon] != ":":
            raise ValueError("expected ':'")
        value_start = _skip(text, colon + 1)
        _, value_end = decoder.raw_decode(text, value_start)
        members.append((key, i, value_start, value_end))
        i = _skip(text, value_end)
        if text[i] == "}":
            break
        i = _skip(text, i + 1)
    head = text[start : members[0][1]]
    tail = text[members[-1][3] : end]
    one_line = "\n" not in text[start:end]
    if len(members) > 1:
        sep = text[members[0][3] : members[1][1]]
    else:
        sep = ", " if one_line else ",\n" + _line_indent(text, members[0][1])
    key_indent = _line_indent(text, members[0][1])
    parts: list[str] = []
    by_key = {m[0]: m for m in members}
    for key, value in new.items():
        if key in by_key:
            _, k_start, v_start, _v_end = by_key[key]
            body, _ = _splice(text, v_start, value, unit)
            parts.append(text[k_start:v_start] + body)
        else:
            rendered = json.dumps(
                value, ensure_ascii=False, indent=None if one_line else unit
            ).replace("\n", "\n" + key_indent)
            parts.append(f"{json.dumps(key, ensure_ascii=False)}: {rendered}")
    return head + sep.join(parts) + tail, end


def _line_indent(text: str, pos: int) -> str:
    line_start = text.rfind("\n", 0, pos) + 1
    prefix = text[line_start:pos]
    return prefix if not prefix.strip() else ""


def _render(value: Any, text: str, pos: int, unit: str) -> str:
    line = text[text.rfind("\n", 0, pos) + 1 : pos]
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    return json.dumps(value, ensure_ascii=False, indent=unit).replace("\n", "\n" + indent)


def docker_configure(
    text: str | None,
    *,
    name: str = DEFAULT_NAME,
    runtime_path: str = DEFAULT_RUNTIME_PATH,
    set_default: bool = False,
    source: str = "daemon.json",
) -> Edit:
    """Add (or update) ``runtimes.<name>`` and, with ``set_default``, ``default-runtime``."""
    check_name(name)
    data = _docker_load(text, source)
    before = json.loads(json.dumps(data))
    notes: list[str] = []
    runtimes = data.setdefault("runtimes", {})
    entry = runtimes.get(name)
    if entry is None:
        runtimes[name] = {"path": runtime_path}
        notes.append(f"added runtime {name} -> {runtime_path}")
    elif entry.get("path") != runtime_path:
        entry["path"] = runtime_path
        notes.append(f"runtime {name}: path set to {runtime_path}")
    previous = data.get("default-runtime")
    if set_default:
        if previous != name:
            data["default-runtime"] = name
            notes.append(f"default runtime: {previous or RUNC} -> {name}")
    elif previous != name:
        notes.append(
            f"the default runtime stays {previous or RUNC}: only containers run with "
            f"--runtime {name} go through gpuhook (use --set-as-default)"
        )
    if data == before:
        return Edit(text or "", False, tuple(notes))
    return Edit(_docker_dump(data, text), True, tuple(notes))


def docker_unconfigure(
    text: str | None, *, name: str = DEFAULT_NAME, source: str = "daemon.json"
) -> Edit:
    """Remove ``runtimes.<name>`` (and ``runtimes`` when that leaves it empty); drop
    ``default-runtime`` when it names ``<name>`` (docker's default is runc)."""
    check_name(name)
    data = _docker_load(text, source)
    notes: list[str] = []
    changed = False
    runtimes = data.get("runtimes")
    if isinstance(runtimes, dict) and name in runtimes:
        del runtimes[name]
        notes.append(f"removed runtime {name}")
        if not runtimes:
            del data["runtimes"]
        changed = True
    if data.get("default-runtime") == name:
        del data["default-runtime"]
        notes.append(f"default runtime: {name} -> {RUNC}")
        changed = True
    if not changed:
        return Edit(text or "", False, tuple(notes))
    return Edit(_docker_dump(data, text), True, tuple(notes))

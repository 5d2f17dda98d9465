"""containerd's ``config.toml`` as gpuhook edits it (pure): its config version and tables read
from plain data (:mod:`tomllib`), the CRI plugin's path, the file's own style when writing
(tomlkit items, quote character, indentation, blank lines before new tables), and the check that
an edited file parses to exactly the intended data (:func:`verify`): an edit that would change
anything else is refused, never written."""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from typing import TYPE_CHECKING, Any

import tomlkit

from gpuhook.engines.common import (
    RUNC,
)
from gpuhook.engines.readers import CRI_PLUGIN
from gpuhook.errors import RegistrationError

if TYPE_CHECKING:
    from tomlkit.items import Table


HEADER = re.compile(r"^\s*\[")


def config_version(plain: dict[str, Any], source: str) -> int:
    version = plain.get("version")
    if version is None:
        raise RegistrationError(
            f"{source}: no 'version = 2' (containerd 1.x) or 'version = 3|4' (containerd 2.x) "
            "line; gpuhook edits config versions 2, 3 and 4 only"
        )
    if isinstance(version, bool) or version not in CRI_PLUGIN:
        raise RegistrationError(
            f"{source}: version: config version {version!r} is not supported (2, 3 or 4)"
        )
    return int(version)


def walk(plain: dict[str, Any], keys: tuple[str, ...], source: str) -> dict[str, Any] | None:
    """The plain table at ``keys``, None where absent; a non-table on the way is an error."""
    node: Any = plain
    for i, key in enumerate(keys):
        node = node.get(key)
        if node is None:
            return None
        if not isinstance(node, dict):
            where = ".".join(toml_key(k) for k in keys[: i + 1])
            raise RegistrationError(f"{source}: {where}: must be a table")
    return node  # type: ignore[no-any-return]


def toml_key(key: str) -> str:
    return key if re.match(r"^[A-Za-z0-9_-]+$", key) else json.dumps(key)


def cri_path(version: int) -> tuple[str, ...]:
    return ("plugins", CRI_PLUGIN[version], "containerd")


def check_shape(plain: dict[str, Any], version: int, name: str, source: str) -> None:
    cri = walk(plain, cri_path(version), source)
    if cri is None:
        return
    runtimes = walk(plain, (*cri_path(version), "runtimes"), source) or {}
    for key in (RUNC, name):
        if key in runtimes:
            walk(plain, (*cri_path(version), "runtimes", key), source)
            walk(plain, (*cri_path(version), "runtimes", key, "options"), source)
    default = cri.get("default_runtime_name")
    if default is not None and not isinstance(default, str):
        raise RegistrationError(
            f"{source}: {'.'.join(toml_key(k) for k in cri_path(version))}.default_runtime_name:"
            " must be a string"
        )


def tk_get(container: Any, key: str) -> Any:
    try:
        return container[key]
    except (KeyError, tomlkit.exceptions.NonExistentKey):
        return None


def tk_table(container: Any, keys: tuple[str, ...]) -> Table | None:
    node = container
    for key in keys:
        node = tk_get(node, key)
        if node is None:
            return None
    return node  # type: ignore[no-any-return]


def tk_ensure(container: Any, keys: tuple[str, ...]) -> Any:
    """The table at ``keys``, creating missing ones as super tables (no header of their own)."""
    node = container
    for key in keys:
        child = tk_get(node, key)
        if child is None:
            child = tomlkit.table(is_super_table=True)
            node[key] = child
            child = node[key]
        node = child
    return node


def quote(doc_text: str, plugin: str) -> str:
    """The quote character the file uses for the plugin name (containerd 2.x writes '...')."""
    if f"'{plugin}'" in doc_text and f'"{plugin}"' not in doc_text:
        return "'"
    return '"'


def toml_string(value: str, quote: str) -> str:
    if quote == "'" and "'" not in value and "\n" not in value:
        return f"'{value}'"
    return json.dumps(value, ensure_ascii=False)


def tk_string(value: str, quote: str) -> Any:
    """A tomlkit string item in the file's quote style."""
    literal = quote == "'" and "'" not in value and "\n" not in value
    return tomlkit.string(value, literal=literal)


def toml_value(value: Any, quote: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return toml_string(value, quote)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v, quote) for v in value) + "]"
    return str(tomlkit.item(value).as_string())


def indent_of(text: str, needle: str) -> tuple[str, str] | None:
    """(header indent, key indent) of the table whose header line contains ``needle``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if HEADER.match(line) and needle in line.replace("'", '"'):
            header = line[: len(line) - len(line.lstrip())]
            for nxt in lines[i + 1 :]:
                if nxt.strip() and not nxt.lstrip().startswith("#"):
                    if HEADER.match(nxt):
                        break
                    return header, nxt[: len(nxt) - len(nxt.lstrip())]
            return header, header + "  "
    return None


def space_new_headers(old: str, new: str) -> str:
    """Put a blank line before a table header that the edit added, as in the files containerd
    writes."""
    old_lines = old.splitlines()
    new_lines = new.splitlines()
    added: set[int] = set()
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "insert":
            added.update(range(j1, j2))
        elif tag == "replace":  # lines beyond those replaced one for one are new
            added.update(range(j1 + (i2 - i1), j2))
    out: list[str] = []
    for j, line in enumerate(new_lines):
        if j > 0 and HEADER.match(line) and out and out[-1].strip() and j in added:
            out.append("")
        out.append(line)
    text = "\n".join(out) + "\n"
    if not old.endswith("\n\n"):
        text = text.rstrip("\n") + "\n"
    return text


def verify(text: str, expected: dict[str, Any], source: str) -> None:
    try:
        got = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RegistrationError(
            f"{source}: internal error: the edited file would not parse ({exc}); nothing written"
        ) from None
    if not same(got, expected):
        raise RegistrationError(
            f"{source}: internal error: the edit would change more than gpuhook's keys; "
            "nothing written (please report this with the file)"
        )


def plain(value: Any) -> Any:
    """A deep copy of tomllib (or unwrapped tomlkit) data as plain JSON types: dates and times
    become their text, so two readings of a file compare equal."""
    return json.loads(json.dumps(value, default=str))


def same(a: Any, b: Any) -> bool:
    return bool(plain(a) == plain(b))


def parses_as(text: str, expected: dict[str, Any]) -> bool:
    try:
        return bool(text) and same(tomllib.loads(text), expected)
    except tomllib.TOMLDecodeError:
        return False


def header_re(version: int, suffix: str) -> re.Pattern[str]:
    plugin = re.escape(CRI_PLUGIN[version])
    return re.compile(
        rf"^\s*\[\s*plugins\s*\.\s*([\"'])?{plugin}\1?\s*\.\s*containerd{suffix}\s*\]\s*(#.*)?$"
    )


def runtime_header_re(version: int, name: str) -> re.Pattern[str]:
    n = re.escape(name)
    return header_re(version, rf"\s*\.\s*runtimes\s*\.\s*(?:\"{n}\"|'{n}'|{n})(?:\s*\..*)?")

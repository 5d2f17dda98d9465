"""docs/reference.md cannot drift from the code: every command of the click tree has its section
there with each of its options, every key of the config schema its row with the code's default,
and the reverse (a section, option or row the code does not have fails too)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import yaml

from gpuhook.cli.commands import main as cli
from gpuhook.config import loading

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference.md"
SCHEMA = REPO / "src" / "gpuhook" / "schemas" / "config.schema.json"
NAME = "<name>"  # a key the operator names (additionalProperties)


def _section(text: str, title: str) -> str:
    """The text of the '## title' section, up to the next '## ' heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/reference.md has no '## {title}' section"
    return match.group(1)


def command_sections(text: str) -> dict[str, str]:
    """'### `gpuhook inspect pod`' -> the text below it, in the Commands section."""
    parts = re.split(r"^### `([^`]+)`\n", _section(text, "Commands"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def cli_commands(group: click.Group = cli, name: str = "gpuhook") -> dict[str, click.Command]:
    """Every command a user can run, by its full name: the root (its options) and the leaves."""
    found: dict[str, click.Command] = {name: group} if name == "gpuhook" else {}
    ctx = click.Context(group)
    for sub in group.list_commands(ctx):
        command = group.get_command(ctx, sub)
        assert command is not None
        if isinstance(command, click.Group):
            found.update(cli_commands(command, f"{name} {sub}"))
        else:
            found[f"{name} {sub}"] = command
    return found


def options(command: click.Command) -> list[set[str]]:
    """Each option's names (``{"--output", "-o"}``), --help aside."""
    found = [set(p.opts + p.secondary_opts) for p in command.params if isinstance(p, click.Option)]
    return [names for names in found if "--help" not in names]


def named_options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", text))


def schema_keys(node: dict[str, Any], prefix: str = "") -> set[str]:
    """The dotted keys of the config schema: its leaves, and the maps of operator-named keys."""
    keys: set[str] = set()
    for name, sub in node.get("properties", {}).items():
        key = f"{prefix}{name}"
        named = sub.get("additionalProperties")
        if "properties" in sub:
            keys |= schema_keys(sub, f"{key}.")
        else:
            keys.add(key)
        if isinstance(named, dict):
            keys |= schema_keys(named, f"{key}.{NAME}.")
    return keys


def reference_rows(text: str) -> dict[str, str]:
    """The 'Configuration keys' table: key -> its default cell (the text between backticks)."""
    rows: dict[str, str] = {}
    for line in _section(text, "Configuration keys").splitlines():
        match = re.match(r"^\| `([^`]+)` \| (?:`([^`]*)`)? *\|", line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} has two rows"
            rows[match.group(1)] = match.group(2) or ""
    return rows


def default_of(key: str) -> Any:
    value: Any = loading.DEFAULTS
    for part in key.split("."):
        value = value[part]
    return value


def test_every_command_has_its_section_and_every_section_a_command() -> None:
    sections = set(command_sections(REFERENCE.read_text()))
    commands = set(cli_commands())
    assert "gpuhook config validate" in commands
    assert commands - sections == set(), "commands missing from docs/reference.md"
    assert sections - commands == set(), "docs/reference.md names commands the CLI lacks"


def test_every_option_is_in_its_commands_section_and_no_other() -> None:
    sections = command_sections(REFERENCE.read_text())
    for name, command in cli_commands().items():
        named = named_options(sections.get(name, ""))
        missing = [sorted(o) for o in options(command) if not o & named]
        assert not missing, f"{name}: options missing from docs/reference.md: {missing}"
        if command.context_settings.get("ignore_unknown_options"):
            continue  # its arguments are the hook writer's, not click's
        known = set().union(*options(command))
        extra = {o for o in named if o.startswith("--")} - known
        assert not extra, f"{name}: docs/reference.md names options it lacks: {sorted(extra)}"


def test_every_config_key_has_its_row_and_every_row_a_key() -> None:
    rows = set(reference_rows(REFERENCE.read_text()))
    keys = schema_keys(json.loads(SCHEMA.read_text()))
    assert "policy.kubernetes.env_requests" in keys and f"mps.groups.{NAME}.gpus" in keys
    assert keys - rows == set(), "config keys missing from docs/reference.md"
    assert rows - keys == set(), "docs/reference.md names config keys the schema lacks"


def test_every_default_is_the_codes() -> None:
    rows = reference_rows(REFERENCE.read_text())
    for key, cell in rows.items():
        if NAME in key:
            assert cell == "", f"{key}: an operator-named key has no default"
            continue
        assert yaml.safe_load(cell) == default_of(key), f"{key}: docs say {cell!r}"


def test_the_check_catches_a_key_added_without_its_line(tmp_path: Path) -> None:
    schema = json.loads(SCHEMA.read_text())
    schema["properties"]["inject"]["properties"]["new_key"] = {"type": "string"}
    missing = schema_keys(schema) - set(reference_rows(REFERENCE.read_text()))
    assert missing == {"inject.new_key"}

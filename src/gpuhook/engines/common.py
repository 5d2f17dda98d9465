"""What every engine's registration edit shares (pure): the result type, the runtime name rule,
the TOML reading of containerd and podman, the diff, and gpuhook's defaults.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from typing import TYPE_CHECKING

import tomlkit
from tomlkit.exceptions import TOMLKitError

from gpuhook.errors import RegistrationError
from gpuhook.model.frozen import Frozen

if TYPE_CHECKING:
    from typing import Any

    from tomlkit.toml_document import TOMLDocument

DEFAULT_NAME = "gpuhook"
DEFAULT_RUNTIME_PATH = "/usr/bin/gpuhook-runtime"
RUNC = "runc"
RUNC_TYPE = "io.containerd.runc.v2"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Edit(Frozen):
    """The result of one edit: the new text, whether it differs, and what was done (for people)."""

    text: str
    changed: bool
    notes: tuple[str, ...] = ()


def check_name(name: str) -> None:
    if not _NAME.match(name):
        raise RegistrationError(
            f"runtime name {name!r}: use letters, digits, '_', '.', '-' (e.g. {DEFAULT_NAME})"
        )
    if name in (RUNC, RUNC_TYPE):
        raise RegistrationError(f"runtime name {name!r} is reserved for runc itself")


def toml_load(text: str, source: str) -> tuple[TOMLDocument, dict[str, Any]]:
    """``text`` parsed by tomlkit (to edit, comments and layout kept) and by tomllib (the
    reference reading); malformed TOML raises :class:`RegistrationError` with one line. Each
    engine checks the types of the keys it edits itself."""


    try:
        plain = tomllib.loads(text)
        doc = tomlkit.parse(text)
    except (tomllib.TOMLDecodeError, TOMLKitError) as exc:
        raise RegistrationError(f"{source}: malformed TOML: {exc}; nothing written") from None
    return doc, plain


def unified_diff(before: str, after: str, path: str, now: str = " (now)") -> str:
    """``before`` -> ``after`` as a unified diff of ``path`` (``<path><now>`` -> ``<path>
    (gpuhook)``, /dev/null for an empty ``before``); every line ends with a newline, the last
    lines of texts that lack one included."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        f"{path}{now}" if before else "/dev/null",
        f"{path} (gpuhook)",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)

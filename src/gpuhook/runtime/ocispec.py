"""The OCI bundle at the edge: read config.json, write it back atomically, read OCI state.

The spec stays a raw dict end to end, so keys gpuhook does not know survive untouched.
"""

from __future__ import annotations

import os

from gpuhook import _fastjson
from gpuhook.errors import SpecError
from gpuhook.fsutil import atomic_write, remove_stale_temps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CONFIG_NAME = "config.json"


def config_path(bundle: str) -> str:
    return os.path.join(bundle, CONFIG_NAME)


def read_raw(bundle: str) -> bytes:
    path = config_path(bundle)
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        if not os.path.isdir(bundle):
            raise SpecError(f"bundle {bundle} does not exist") from None
        raise SpecError(f"no {CONFIG_NAME} in bundle {bundle}") from None
    except IsADirectoryError:
        raise SpecError(f"{path} is a directory") from None
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror}") from None


def parse(raw: bytes, bundle: str = "") -> dict[str, Any]:
    """The spec of ``raw``; a key repeated in one object is refused (runc, in Go, would merge
    what gpuhook reads as the last: SECURITY.md, parser differentials)."""
    try:
        spec = _fastjson.loads(raw, unique_keys=True)
    except ValueError as exc:
        raise SpecError(
            f"malformed {config_path(bundle) if bundle else CONFIG_NAME}: {exc}"
        ) from None
    if not isinstance(spec, dict):
        raise SpecError(f"malformed {config_path(bundle)}: the top level is not an object")
    return spec


def load(bundle: str) -> dict[str, Any]:
    return parse(read_raw(bundle), bundle)


def dumps(spec: dict[str, Any]) -> bytes:
    try:
        return _fastjson.dumps(spec).encode()
    except ValueError as exc:
        raise SpecError(f"cannot serialize the spec: {exc}") from None


def write(bundle: str, spec: dict[str, Any], *, before_replace: object = None) -> None:
    """Replace config.json atomically, keeping its mode. SpecError with one line on failure."""
    path = config_path(bundle)
    remove_stale_temps(path)
    try:
        atomic_write(path, dumps(spec), before_replace=before_replace)
    except OSError as exc:
        raise SpecError(f"cannot write {path}: {exc.strerror or exc}") from None


def rootfs(bundle: str, spec: dict[str, Any]) -> str:
    root = spec.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise SpecError(f"{config_path(bundle)} has no root.path")
    return path if path.startswith("/") else os.path.normpath(os.path.join(bundle, path))


def parse_state(raw: bytes) -> dict[str, Any]:
    """The OCI state a runtime passes to hooks on stdin."""
    try:
        state = _fastjson.loads(raw)
    except ValueError as exc:
        raise SpecError(f"malformed OCI state on stdin: {exc}") from None
    if not isinstance(state, dict) or not isinstance(state.get("bundle"), str):
        raise SpecError("malformed OCI state on stdin: no bundle")
    return state

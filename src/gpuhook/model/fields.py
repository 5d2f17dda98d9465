"""Typed readers for ``from_dict``: a corrupted file surfaces as ValueError."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def _get(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    try:
        value = d[key]
    except (KeyError, TypeError):
        raise ValueError(f"missing field {key!r}") from None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _opt(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    if d.get(key) is None:
        return default
    return _get(d, key, kind)


def _strs(d: Mapping[str, Any], key: str) -> tuple[str, ...]:
    values = _opt(d, key, list, [])
    if not all(isinstance(v, str) for v in values):
        raise ValueError(f"field {key!r} must hold strings")
    return tuple(values)


def _objs(d: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    values = _opt(d, key, list, [])
    if not all(isinstance(v, dict) for v in values):
        raise ValueError(f"field {key!r} must hold objects")
    return values  # type: ignore[no-any-return]

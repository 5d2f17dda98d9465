"""JSON on the container-create hot path, without importing :mod:`json`.

``import json`` costs several milliseconds because :mod:`json.decoder` pulls in :mod:`re`.
The C accelerator :mod:`_json` that :mod:`json` itself uses costs a fraction of a millisecond,
so the hot path drives it directly. Output and accepted input are those of :mod:`json`
(compact separators, NaN/Infinity refused). Where :mod:`_json` is missing, :mod:`json` is
the fallback.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

_WS = " \t\n\r"


class JsonError(ValueError):
    """Input is not valid JSON (or not encodable). The message names the position."""


def _refuse_constant(name: str) -> object:
    raise JsonError(f"{name} is not valid JSON")


def _no_default(obj: object) -> object:
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


class _Context:
    """The attribute set ``_json.make_scanner`` reads, as ``json.JSONDecoder`` provides it."""

    strict = True
    object_hook = None
    object_pairs_hook: Callable[[list[tuple[str, object]]], object] | None = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_refuse_constant)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """An object whose keys are all different. Go's encoding/json, which runc decodes with,
    merges a repeated object into the first, where Python keeps only the last: a spec with a
    repeated key would be read differently by the two."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        repeated = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise JsonError(f"the key {repeated!r} appears twice in one object")
    return out


class _UniqueContext(_Context):
    object_pairs_hook = staticmethod(_unique_keys)


try:
    import _json

    _scanner: Callable[[str, int], tuple[object, int]] = _json.make_scanner(_Context())  # type: ignore[arg-type]
    _unique_scanner: Callable[[str, int], tuple[object, int]] = _json.make_scanner(
        _UniqueContext()  # type: ignore[arg-type]
    )
    _encoder: Callable[[object, int], list[str] | tuple[str, ...]] = _json.make_encoder(
        None, _no_default, _json.encode_basestring_ascii, None, ":", ",", False, False, False
    )

    def loads(data: str | bytes, unique_keys: bool = False) -> object:
        """Parse one JSON document; raise :class:`JsonError` when it is not valid JSON, or with
        ``unique_keys`` when an object holds a key twice."""
        if isinstance(data, bytes):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise JsonError(f"not UTF-8 at byte {exc.start}") from None
        else:
            text = data
        start = len(text) - len(text.lstrip(_WS))
        try:
            obj, end = (_unique_scanner if unique_keys else _scanner)(text, start)
        except JsonError:
            raise
        except StopIteration as stop:
            raise JsonError(f"expecting a value at char {stop.value}") from None
        except RecursionError:
            raise JsonError("nested too deeply") from None
        except (ValueError, SystemError):
            # The C scanner raises json.JSONDecodeError only once json.decoder is imported
            # (SystemError otherwise). Errors are off the hot path: let json say what is wrong.
            raise JsonError(_stdlib_error(text)) from None
        rest = text[end:].lstrip(_WS) if end < len(text) else ""
        if rest:
            raise JsonError(f"extra data at char {len(text) - len(rest)}")
        return obj

    def _stdlib_error(text: str) -> str:
        import json

        try:
            json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            return str(exc)
        return "invalid JSON"

    def dumps(obj: object) -> str:
        """Serialize to compact ASCII JSON; raise :class:`JsonError` for what JSON cannot hold."""
        try:
            return "".join(_encoder(obj, 0))
        except (TypeError, ValueError, RecursionError) as exc:
            raise JsonError(str(exc)) from None

except ImportError:  # pragma: no cover - CPython always ships _json
    import json as _stdjson

    def loads(data: str | bytes, unique_keys: bool = False) -> object:
        hook = _unique_keys if unique_keys else None
        try:
            return _stdjson.loads(data, parse_constant=_refuse_constant, object_pairs_hook=hook)
        except JsonError:
            raise
        except (ValueError, RecursionError) as exc:
            raise JsonError(str(exc)) from None

    def dumps(obj: object) -> str:
        try:
            return _stdjson.dumps(obj, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise JsonError(str(exc)) from None

"""Structured logging: JSON lines to ``log.file``, one event per decision.

Two backends write the same line shape (``timestamp``, ``level``, ``event``, then the bound and
given keys):

* structlog, in the CLI and wherever structlog is already imported (tests assert events with
  ``structlog.testing.capture_logs``);
* a stdlib writer for the runtime shim, whose hot path cannot afford structlog's import
  (~80 ms measured on the target machine).

``GPUHOOK_DEBUG=1`` or ``log.level: debug`` turns on debug events in every executable. Logging
never raises and never writes to stdout (the shim's stdout may be a container's console).
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    class Logger(Protocol):
        def bind(self, **kw: Any) -> Logger: ...
        def debug(self, event: str, **kw: Any) -> Any: ...
        def info(self, event: str, **kw: Any) -> Any: ...
        def warning(self, event: str, **kw: Any) -> Any: ...
        def error(self, event: str, **kw: Any) -> Any: ...


LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

_state: dict[str, Any] = {"backend": "fast", "file": "", "level": 20}


def timestamp(now: float | None = None) -> str:
    """ISO 8601 UTC with microseconds and ``Z``, as structlog's ``TimeStamper(fmt="iso")``."""
    now = time.time() if now is None else now
    micro = int((now % 1) * 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{micro:06d}Z"


def configure(level: str, file: str, *, prefer_structlog: bool = False) -> None:
    """Set the level and destination for this process.

    ``prefer_structlog`` (the CLI) imports and configures structlog; otherwise structlog is used
    only when something already imported it. structlog's processor chain is set up once per
    process; later calls change only the level and the file (so a capture set up around them,
    such as ``structlog.testing.capture_logs``, keeps capturing).
    """
    _state["file"] = file
    _state["level"] = LEVELS.get(level, 20)
    use_structlog = prefer_structlog or "structlog" in sys.modules
    _state["backend"] = "structlog" if use_structlog else "fast"
    if not use_structlog:
        return
    import structlog

    if file:
        _ensure_dir(file)
    wrapper = structlog.make_filtering_bound_logger(_state["level"])
    if _state.get("structlog_ready"):
        structlog.configure(wrapper_class=wrapper)
        return
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _reorder,
            # Compact separators: the same bytes as the shim's writer (gpuhook._fastjson).
            structlog.processors.JSONRenderer(separators=(",", ":"), sort_keys=False),
        ],
        wrapper_class=wrapper,
        logger_factory=_SafeFileLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    _state["structlog_ready"] = True


def _reorder(_logger: Any, _name: str, event_dict: Any) -> Any:
    head: dict[str, Any] = {
        k: event_dict.pop(k) for k in ("timestamp", "level", "event") if k in event_dict
    }
    head.update(event_dict)
    return head


class _SafeFileLoggerFactory:
    """structlog logger factory appending to the configured file (read at each event, so
    :func:`configure` can change it); a file that cannot be opened drops events."""

    def __call__(self, *_args: Any) -> _AppendLogger:
        return _AppendLogger()


class _AppendLogger:
    def msg(self, message: str) -> None:
        _append(_state["file"], message)

    log = debug = info = warning = warn = error = critical = exception = failure = fatal = msg


def _ensure_dir(path: str) -> None:
    try:
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    except OSError:
        pass


def _append(path: str, line: str) -> None:
    if not path:
        return
    data = (line + "\n").encode("utf-8", "replace")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        _ensure_dir(path)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return
    except OSError:
        return
    try:
        os.write(fd, data)  # one write of a line: O_APPEND keeps concurrent writers' lines whole
    except OSError:
        pass
    finally:
        os.close(fd)


class _FastLogger:
    """The shim's stdlib backend: same keys as the structlog configuration above."""

    __slots__ = ("_context",)

    def __init__(self, context: dict[str, Any]) -> None:
        self._context = context

    def bind(self, **kw: Any) -> _FastLogger:
        return _FastLogger({**self._context, **kw})

    def _emit(self, level: str, event: str, kw: dict[str, Any]) -> None:
        if LEVELS[level] < _state["level"] or not _state["file"]:
            return
        from gpuhook import _fastjson

        record: dict[str, Any] = {"timestamp": timestamp(), "level": level, "event": event}
        record.update(self._context)
        record.update(kw)
        try:
            line = _fastjson.dumps(record)
        except ValueError:
            line = _fastjson.dumps({k: str(v) for k, v in record.items()})
        _append(_state["file"], line)

    def debug(self, event: str, **kw: Any) -> None:
        self._emit("debug", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        self._emit("info", event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._emit("warning", event, kw)

    def error(self, event: str, **kw: Any) -> None:
        self._emit("error", event, kw)


def get_logger(**context: Any) -> Logger:
    if _state["backend"] == "structlog":
        import structlog

        return structlog.get_logger().bind(**context)  # type: ignore[no-any-return]
    return _FastLogger(dict(context))


def debug_enabled() -> bool:
    return bool(_state["level"] <= LEVELS["debug"])

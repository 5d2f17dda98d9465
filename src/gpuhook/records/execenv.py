"""gpuhook's environment for processes started with ``exec`` (``kubectl exec``, exec probes).

containerd builds an exec'd process from its own stored spec, not from the ``config.json`` that
gpuhook rewrote, so the process would miss what the create decided: the granted
``NVIDIA_VISIBLE_DEVICES``, ``void`` for a refusal, the MPS pipe folder and limits. A create whose
rewrite changed the environment writes a marker, ``<state_dir>/exec-env/<id>`` (atomically: what
to set and what to remove); the dispatcher sends an ``exec`` to Python only when that marker
exists (one stat), and the shim writes the values into runc's ``--process FILE`` (atomically)
before it execs the runtime. ``exec`` without ``--process`` needs nothing: runc then builds the
process from the bundle's (rewritten) ``config.json``. The dispatcher removes the marker (and the
record link) when a ``delete`` succeeds; the creates' sweep removes it with its dangling link
(:mod:`.sweep`); ``gpuhook gc`` removes those of containers the runtime no longer has.
"""

from __future__ import annotations

import os

from gpuhook import _fastjson
from gpuhook.errors import SpecError
from gpuhook.records.ids import valid_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DIR = "exec-env"  # under state_dir; the dispatcher's path is rendered from this name


def marker_path(state_dir: str, container_id: str) -> str:
    """Where the container's marker is; "" for an id runc would refuse (no path is made of it)."""
    return os.path.join(state_dir, DIR, container_id) if valid_id(container_id) else ""


def diff(before: list[str], after: list[str]) -> tuple[list[str], list[str]]:
    """What the rewrite did to the environment: (entries to set, names to remove)."""
    old = set(before)
    names_after = {e.partition("=")[0] for e in after}
    added = [e for e in after if e not in old]
    removed = sorted({e.partition("=")[0] for e in before} - names_after)
    return added, removed


def remember(state_dir: str, container_id: str, root: str, before: Any, after: Any) -> str:
    """Write (or, when the environment is unchanged, remove) the container's marker; "" on
    success, else a one-line failure (a marker never blocks a create: its exec misses the env)."""
    from gpuhook.fsutil import atomic_write

    env_before = before if isinstance(before, list) else []
    env_after = after if isinstance(after, list) else []
    added, removed = diff([str(e) for e in env_before], [str(e) for e in env_after])
    path = marker_path(state_dir, container_id)
    if not path:
        return f"container id {container_id!r} is not a valid runc id; no exec-env marker"
    try:
        if not added and not removed:
            forget(state_dir, container_id)
            return ""
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        body = {"root": root, "set": added, "unset": removed}
        atomic_write(path, _fastjson.dumps(body).encode(), 0o644, fsync=False)
    except OSError as exc:
        return f"cannot write exec-env marker {path}: {exc.strerror}"
    return ""


def forget(state_dir: str, container_id: str) -> None:
    """Remove the container's marker if it has one (best effort: never fails the caller)."""
    path = marker_path(state_dir, container_id)
    try:
        if path:
            os.unlink(path)
    except OSError:
        pass


def load(state_dir: str, container_id: str) -> dict[str, Any] | None:
    """The container's marker, None when it has none. SpecError when it cannot be read."""
    path = marker_path(state_dir, container_id)
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            marker = _fastjson.loads(fh.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot read exec-env marker {path}: {exc}") from None
    if not isinstance(marker, dict) or not isinstance(marker.get("set"), list):
        raise SpecError(f"malformed exec-env marker {path}")
    return marker


def environment(env: list[str], marker: dict[str, Any]) -> list[str]:
    """The process's environment with gpuhook's values (pure)."""
    values = [str(e) for e in marker.get("set", [])]
    drop = {str(n) for n in marker.get("unset", [])} | {e.partition("=")[0] for e in values}
    return [e for e in env if e.partition("=")[0] not in drop] + values


def apply(process_file: str, marker: dict[str, Any]) -> None:
    """Put gpuhook's values into runc's process file (atomically). SpecError on failure."""
    from gpuhook.fsutil import atomic_write

    try:
        with open(process_file, "rb") as fh:
            st = os.fstat(fh.fileno())
            process = _fastjson.loads(fh.read())
        if not isinstance(process, dict):
            raise ValueError("the top level is not an object")
        env = process.get("env")
        process["env"] = environment(env if isinstance(env, list) else [], marker)
        atomic_write(
            process_file, _fastjson.dumps(process).encode(), st.st_mode & 0o777, fsync=False
        )
    except (OSError, ValueError) as exc:
        raise SpecError(f"cannot add gpuhook's environment to {process_file}: {exc}") from None

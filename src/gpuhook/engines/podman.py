"""Register gpuhook-runtime with podman (pure: text in, text out).

``containers.conf`` gets an ``[engine.runtimes]`` entry ``<name> = ["<runtime path>"]`` and, as
the default, ``[engine] runtime = "<name>"``. podman reads the file on every command (there is
no daemon to restart) and merges ``/etc/containers/containers.conf`` over the distribution's
``/usr/share/containers/containers.conf``, so a new file needs only gpuhook's keys. The file is
edited with tomlkit, which keeps comments and layout; the result is re-read with :mod:`tomllib`
and compared with the intended change, so an edit that would alter anything else is refused.

podman resolves CDI devices itself (``podman run --device nvidia.com/gpu=1``) from the specs in
``/etc/cdi`` and ``/var/run/cdi``: ``gpuhook inventory refresh`` keeps gpuhook's there
(``cdi.output``).

Unconfiguring removes the runtime entry and, where ``<name>`` was the default, the ``runtime``
key (podman's own default, crun or runc, applies again). Malformed input raises
:class:`gpuhook.errors.RegistrationError` with one line.
"""

from __future__ import annotations

import tomllib
from typing import Any

import tomlkit

from gpuhook.engines.common import DEFAULT_NAME, DEFAULT_RUNTIME_PATH, Edit, check_name, toml_load
from gpuhook.errors import RegistrationError

ENGINE = "engine"
RUNTIMES = "runtimes"
RUNTIME = "runtime"


def _load(text: str | None, source: str) -> tuple[Any, dict[str, Any]]:
    """tomlkit document and plain data; the ``engine`` keys gpuhook edits must have their types."""
    doc, plain = toml_load(text or "", source)
    engine = plain.get(ENGINE, {})
    if not isinstance(engine, dict):
        raise RegistrationError(f"{source}: 'engine' is not a table; nothing written")
    if not isinstance(engine.get(RUNTIMES, {}), dict):
        raise RegistrationError(f"{source}: 'engine.runtimes' is not a table; nothing written")
    if not isinstance(engine.get(RUNTIME, ""), str):
        raise RegistrationError(f"{source}: 'engine.runtime' is not a string; nothing written")
    return doc, plain


def _wanted(
    plain: dict[str, Any], name: str, runtime_path: str | None, set_default: bool
) -> dict[str, Any]:
    """The plain data after the change (``runtime_path`` None: unconfigure)."""
    out = tomllib.loads(tomlkit.dumps(plain))
    engine = out.setdefault(ENGINE, {})
    runtimes = engine.setdefault(RUNTIMES, {})
    if runtime_path is not None:
        runtimes[name] = [runtime_path]
        if set_default:
            engine[RUNTIME] = name
        return out
    runtimes.pop(name, None)
    if engine.get(RUNTIME) == name:
        del engine[RUNTIME]
    return out


def _table(container: Any, key: str) -> Any:
    if key not in container:
        container.add(key, tomlkit.table())
    return container[key]


def _finish(text: str | None, doc: Any, expected: dict[str, Any], source: str) -> str:
    new = tomlkit.dumps(doc)
    if tomllib.loads(new) != _trimmed(expected, tomllib.loads(text or "")):
        raise RegistrationError(
            f"{source}: the edit would change more than gpuhook's keys; nothing written"
        )
    return new


def _trimmed(expected: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``expected`` less the empty ``engine``/``engine.runtimes`` tables the file did not have."""
    engine = expected.get(ENGINE, {})
    if not engine.get(RUNTIMES) and RUNTIMES not in before.get(ENGINE, {}):
        engine.pop(RUNTIMES, None)
    if not engine and ENGINE not in before:
        expected.pop(ENGINE, None)
    return expected


def podman_configure(
    text: str | None,
    *,
    name: str = DEFAULT_NAME,
    runtime_path: str = DEFAULT_RUNTIME_PATH,
    set_default: bool = False,
    source: str = "containers.conf",
) -> Edit:
    """Add the runtime (and make it the default); unchanged when it is already so."""
    check_name(name)
    doc, plain = _load(text, source)
    expected = _wanted(plain, name, runtime_path, set_default)
    notes = [f"runtime {name} = [{runtime_path!r}] in [engine.runtimes]"]
    if set_default:
        notes.append(f"[engine] runtime = {name!r}: every podman container goes through gpuhook")
    if _trimmed(expected, plain) == plain:
        return Edit(text or "", False, tuple(notes))
    engine = _table(doc, ENGINE)
    _table(engine, RUNTIMES)[name] = [runtime_path]
    if set_default:
        engine[RUNTIME] = name
    return Edit(_finish(text, doc, expected, source), True, tuple(notes))


def podman_unconfigure(
    text: str | None, *, name: str = DEFAULT_NAME, source: str = "containers.conf"
) -> Edit:
    """Remove the runtime entry, and the ``runtime`` key where it names it."""
    check_name(name)
    doc, plain = _load(text, source)
    expected = _wanted(plain, name, None, False)
    if _trimmed(expected, plain) == plain:
        return Edit(text or "", False, ())
    engine = doc[ENGINE]
    notes = [f"removed runtime {name} from [engine.runtimes]"]
    if RUNTIMES in engine and name in engine[RUNTIMES]:
        del engine[RUNTIMES][name]
    if engine.get(RUNTIME) == name:
        del engine[RUNTIME]
        notes.append("removed [engine] runtime: podman's own default runtime applies again")
    return Edit(_finish(text, doc, expected, source), True, tuple(notes))

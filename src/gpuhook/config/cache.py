"""The compiled config cache and the dispatcher's pointer file (the create path's config I/O).

Validation needs :mod:`yaml` and :mod:`jsonschema`, which are far too slow to import on every
container start, so a validated, normalized copy of each config file is cached as JSON under
``<cache folder>/<absolute config path>/compiled.json`` and reused while the file's identity
(device, inode, size, mtime), gpuhook's version and the known keys are unchanged
(:func:`gpuhook.config.loading.load`). The same folder holds ``runtime``, the pointer the
``gpuhook-runtime`` dispatcher reads to run calls without Python: four lines, the resolved
low-level runtime path, the state folder (where the exec-env markers are), the log level and the
runtime service's socket (empty: none). Python and the dispatcher trust a cache file by the one
rule of :func:`trusted_file` (:data:`UNTRUSTED_MODE` is rendered into the dispatcher).

The cache folder is ``/run/gpuhook/config`` (:data:`CACHE_ROOT`), or ``GPUHOOK_CACHE_DIR`` for
every executable that has it in its environment, as ``GPUHOOK_CONFIG`` names the file: a second
gpuhook beside the node's (a test suite, a config tried out) keeps its cache to itself. The
dispatcher reads the same variable (:func:`cache_root` states the rule both apply).
"""

from __future__ import annotations

import os

from gpuhook.config.types import ENV_CACHE_DIR
from gpuhook.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config.types import Config

CACHE_ROOT = "/run/gpuhook/config"
COMPILED_NAME = "compiled.json"
POINTER_NAME = "runtime"
# A cache file names what root execs: one with any of these mode bits set (group- or
# world-writable) is never acted on, nor a symbolic link, nor a file owned by anyone but root or
# the running user. gpuhook.runtime.dispatch renders the dispatcher's check from this.
UNTRUSTED_MODE = 0o022
POINTER_MODE = 0o644


def plain_path(path: str) -> bool:
    """Absolute, without ``//``, ``/./`` or ``/../`` or a trailing ``/.`` or ``/..``: a path
    that names its folder without any lookup (the dispatcher's ``plain_path``)."""
    return (
        path.startswith("/")
        and not any(part in path for part in ("//", "/./", "/../"))
        and not path.endswith(("/.", "/.."))
    )


def cache_root(config_path: str = "") -> str:
    """The cache folder: ``GPUHOOK_CACHE_DIR`` when set, else :data:`CACHE_ROOT`. Raises
    :class:`ConfigError` (for ``config_path``) when the variable is not a plain absolute path;
    the dispatcher then reads no pointer and leaves every call to Python, which says so."""
    value = os.environ.get(ENV_CACHE_DIR, "")
    if not value:
        return CACHE_ROOT
    if not plain_path(value):
        raise ConfigError(
            config_path or ENV_CACHE_DIR,
            f"{ENV_CACHE_DIR}={value!r} is not an absolute path without //, . or .. parts",
        )
    return value


def cache_dir_for(path: str) -> str:
    """The cache folder of one config file: its absolute path mirrored under :func:`cache_root`.

    A mirrored path (not a hash) lets the dispatcher compute it without any lookup.
    """
    return cache_root(path) + os.path.abspath(path)


def trusted_file(st: os.stat_result) -> bool:
    """A cache file this process may act on (``st`` of the file opened without following a
    link): a regular file written by root or by this user, and writable by no one else. The
    cache names the runtime that gpuhook-runtime execs, as root."""
    import stat

    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid in (0, os.geteuid())
        and not st.st_mode & UNTRUSTED_MODE
    )


def read(cache_dir: str, identity: list[Any]) -> dict[str, Any] | None:
    """The compiled config of ``identity`` (``{"config": ..., "runtime": ...}``), or None when
    there is none, it is not trusted, or it was compiled from another file or build."""
    from gpuhook import _fastjson

    path = os.path.join(cache_dir, COMPILED_NAME)
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as fh:
            if not trusted_file(os.fstat(fh.fileno())):
                return None
            cached = _fastjson.loads(fh.read())
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or cached.get("identity") != identity:
        return None
    if not isinstance(cached.get("config"), dict) or not isinstance(cached.get("runtime"), str):
        return None
    return cached


def write(cache_dir: str, identity: list[Any], config: Config) -> None:
    """Cache a compiled config and (re)write the pointer. Best effort: a node where /run/gpuhook
    is not writable only loses speed."""
    from gpuhook import _fastjson
    from gpuhook.fsutil import atomic_write

    try:
        os.makedirs(cache_dir, mode=0o755, exist_ok=True)
        body = {"identity": identity, "config": config.data, "runtime": config.runtime}
        atomic_write(
            os.path.join(cache_dir, COMPILED_NAME),
            _fastjson.dumps(body).encode(),
            0o644,
            fsync=False,
        )
    except OSError:
        return
    write_pointer(cache_dir, config)


def pointer_text(config: Config) -> str:
    """The dispatcher's pointer: runtime, state folder, log level, service socket (one line
    each; the socket's may be empty)."""
    # The file's level, never GPUHOOK_DEBUG of the process that happens to write the pointer:
    # the dispatcher reads that variable of each call itself.
    lines = (config.runtime, config.state_dir, config.data["log"]["level"])
    if any("\n" in x or not x for x in lines) or not all(x.startswith("/") for x in lines[:2]):
        return ""
    socket = config.service_socket
    if "\n" in socket or (socket and not socket.startswith("/")):
        socket = ""
    return "".join(x + "\n" for x in (*lines, socket))


def pointer_intact(cache_dir: str) -> bool:
    """The pointer is there and trusted (else it is written anew)."""
    try:
        st = os.lstat(os.path.join(cache_dir, POINTER_NAME))
    except FileNotFoundError:
        return False  # write_pointer writes it only when the config allows one
    except OSError:
        return True  # unreadable here: nothing this process could repair
    return trusted_file(st)


def write_pointer(cache_dir: str, config: Config) -> None:
    """(Re)write the dispatcher's pointer, or remove it when the config allows none."""
    from gpuhook.fsutil import atomic_write

    runtime_file = os.path.join(cache_dir, POINTER_NAME)
    pointer = pointer_text(config)
    try:
        if pointer:
            atomic_write(runtime_file, pointer.encode(), POINTER_MODE, fsync=False)
        elif os.path.lexists(runtime_file):
            os.unlink(runtime_file)
    except OSError:
        pass

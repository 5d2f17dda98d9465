"""The container-create fast path: a spec that cannot carry a GPU request, with ``posix`` alone.

Most containers on a node ask for no GPU, and each one's ``create`` starts the shim. The shim's
full path imports :mod:`os` (which alone costs about a third of the interpreter's own start,
through ``_collections_abc``), the config machinery and the record writer. This module does the
same job for a spec that the byte pre-check clears, importing nothing but built-in modules
(``posix``, ``time``: both loaded with the interpreter) and :mod:`gpuhook.runtime.runc_argv`:

1. parse the runc argv (:mod:`gpuhook.runtime.runc_argv`, the shim's own parser);
2. read ``<bundle>/config.json`` and run the byte pre-check
   (:func:`gpuhook.markers.may_request_gpu`);
3. read this module's cache beside the compiled config
   (``/run/gpuhook/config/<config path>/fastpath``), valid only for the config file's identity
   (device, inode, size, mtime), gpuhook's version and the identity of ``records/writer.py``;
4. write the decision record from the cached template (the shim's full path rendered it with
   :func:`gpuhook.records.writer.build`, so the record format has one owner) and its link, as
   :func:`gpuhook.records.writer.write` does;
5. ``execv`` the low-level runtime with the untouched argv.

Whenever anything is unusual (no cache yet or a stale one, debug logging, a relative config
path, a container id or bundle path that would need escaping, a file that cannot be read, the
records folder missing) it returns and the full path
(:mod:`gpuhook.runtime.shim`) handles the create
as before, writing the cache for the next container. The fast path never reports an error
itself and never blocks a container.
"""

import posix
import time

from gpuhook import markers
from gpuhook.runtime import runc_argv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuhook.config import Config

# No ``from __future__ import annotations`` (its import costs ~0.15 ms): annotations here are
# evaluable at runtime.

# Mirrors of gpuhook.config / gpuhook.records.writer / gpuhook.fsutil constants (a unit test keeps
# them
# equal; importing those modules is what this one avoids).
ENV_CONFIG = b"GPUHOOK_CONFIG"
ENV_DEBUG = b"GPUHOOK_DEBUG"
DEFAULT_CONFIG = "/etc/gpuhook/config.yaml"
CACHE_ROOT = "/run/gpuhook/config"
TMP_MARK = ".gpuhook-tmp-"

CACHE_NAME = "fastpath"
CACHE_MAGIC = b"gpuhook-fastpath 1"
NOTE = "no GPU marker in config.json (the spec was not parsed)"

# Placeholders in the cached record template (JSON-safe ASCII, never produced otherwise).
MARK_ID = "@@gpuhook:container-id@@"
MARK_BUNDLE = "@@gpuhook:bundle@@"
MARK_TIME = "@@gpuhook:timestamp@@"
MARK_ROOT = "@@gpuhook:runtime-root@@"

# runc's container id alphabet (gpuhook.records.writer.valid_id); other ids take the full path.
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+-.")
_MAX_SPEC = 64 << 20


def create(argv: list[str]) -> None:
    """Handle ``create``/``run`` of a spec without GPU markers and exec the runtime; return
    (having changed nothing that the full path would not redo) in every other case."""
    try:
        _create(argv)
    except Exception:  # noqa: S110 - anything unexpected: the full path decides and reports
        pass


def _create(argv: list[str]) -> None:
    args = runc_argv.parse(argv[1:])
    if not args.is_create:
        return
    cid = args.container_id
    if not _safe_id(cid):
        return
    bundle = _abspath(args.bundle or ".")
    root = args.root
    if not _json_safe(bundle) or not _json_safe(root):
        return
    raw = _read(bundle + "/config.json", _MAX_SPEC)
    if raw is None or markers.may_request_gpu(raw):
        return
    config = config_file()
    if not config:
        return
    cached = load_cache(config)
    if cached is None:
        return
    runtime, records_dir, record_name, template = cached
    record = (
        template.replace(b'"' + MARK_TIME.encode() + b'"', repr(time.time()).encode())
        .replace(MARK_ID.encode(), cid.encode())
        .replace(MARK_BUNDLE.encode(), bundle.encode())
        .replace(MARK_ROOT.encode(), root.encode())
    )
    path = bundle + "/" + record_name
    if not _write(path, record) or not _link(path, records_dir + "/" + cid + ".json"):
        return  # the full path writes it again, creating the records folder or logging why not
    posix.execv(runtime, [runtime, *argv[1:]])


# --- the cache ----------------------------------------------------------------------------------


def config_file() -> str:
    """The config file the shim uses, as an absolute path; "" when only the full path may
    resolve it (a relative GPUHOOK_CONFIG) or when debug logging is forced by the environment."""
    env = posix.environ
    if env.get(ENV_DEBUG, b"") not in (b"", b"0"):
        return ""
    named = env.get(ENV_CONFIG, b"")
    if not named:
        return DEFAULT_CONFIG
    if not named.startswith(b"/") or b"\n" in named:
        return ""
    try:
        return _normpath(named.decode())
    except UnicodeDecodeError:
        return ""


def _identity(config: str) -> bytes:
    """The config file's identity, gpuhook's version, and the identity of the record builder."""
    from gpuhook import __version__

    st = posix.stat(config)
    code = posix.stat(__file__.rpartition("/")[0].rpartition("/")[0] + "/records/writer.py")
    return (
        f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {__version__} "
        f"{code.st_size} {code.st_mtime_ns}"
    ).encode()


def cache_path(config: str) -> str:
    return CACHE_ROOT + config + "/" + CACHE_NAME


def load_cache(config: str) -> tuple[str, str, str, bytes] | None:
    """``(runtime, records_dir, record_name, template)`` when the cache matches the config file
    and this code, else None."""
    try:
        identity = _identity(config)
    except OSError:
        return None
    data = _read(cache_path(config), 1 << 20, trusted=True)
    if data is None:
        return None
    lines = data.split(b"\n")
    if len(lines) != 7 or lines[0] != CACHE_MAGIC or lines[1] != identity or lines[6]:
        return None
    try:
        runtime, records_dir, record_name = (x.decode() for x in lines[2:5])
    except UnicodeDecodeError:
        return None
    if not runtime.startswith("/") or not records_dir.startswith("/"):
        return None
    return runtime, records_dir, record_name, lines[5]


def identity_before_load() -> bytes:
    """Taken by the full path *before* it loads the config, so a cache written after that load
    can only be older than the file, never newer (an edit in between makes it a miss)."""
    config = config_file()
    if not config:
        return b""
    try:
        return _identity(config)
    except OSError:
        return b""


def remember(identity: bytes, config: "Config") -> None:
    """Write the cache for ``config``, loaded under ``identity`` (the full path calls this after a
    create without GPU markers). Best effort: a node where it cannot be written only loses speed.
    """
    try:
        _remember(identity, config)
    except Exception:  # noqa: S110 - best effort, never on a container's way
        pass


def _remember(identity: bytes, loaded: "Config") -> None:
    config = config_file()
    runtime, records_dir = loaded.runtime, loaded.records_dir
    if not identity or not config or loaded.log_level == "debug" or not runtime:
        return
    if "\n" in runtime + records_dir or not runtime.startswith("/"):
        return
    if not records_dir.startswith("/"):
        return
    from gpuhook import _fastjson
    from gpuhook.records import writer

    record = writer.build(
        MARK_ID, MARK_BUNDLE, None, NOTE, runtime=runtime, root=MARK_ROOT, config=loaded.source
    )
    if not isinstance(record.get("timestamp"), float):
        return  # a record shape this template cannot express: no fast path
    record["timestamp"] = MARK_TIME
    template = _fastjson.dumps(record).encode()
    # Each placeholder exactly once.
    marks = (MARK_ID, MARK_BUNDLE, MARK_ROOT, '"' + MARK_TIME + '"')
    if b"\n" in template or any(template.count(m.encode()) != 1 for m in marks):
        return
    body = b"\n".join(
        [
            CACHE_MAGIC,
            identity,
            runtime.encode(),
            records_dir.encode(),
            writer.RECORD_NAME.encode(),
            template,
            b"",
        ]
    )
    path = cache_path(config)
    if _read(path, 1 << 20) == body:
        return
    _write(path, body)


# --- posix helpers ------------------------------------------------------------------------------


def _read(path: str, limit: int, trusted: bool = False) -> bytes | None:
    """The file's bytes (None when unreadable or over ``limit``). ``trusted``: only a file owned
    by root or this user and writable by no one else (as gpuhook.config trusts its cache: the
    fast path's cache names the runtime gpuhook-runtime execs as root)."""
    try:
        fd = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC | posix.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if trusted:
            st = posix.fstat(fd)
            if st.st_uid not in (0, posix.geteuid()) or st.st_mode & 0o022:
                return None
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = posix.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > limit:
                return None
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        posix.close(fd)


def _write(path: str, data: bytes) -> bool:
    """Atomically replace ``path`` (mode 0644), as gpuhook.fsutil.atomic_write(fsync=False): a
    temp file in the same folder, renamed over it. False (and nothing left behind) on failure."""
    folder, _, base = path.rpartition("/")
    tmp = f"{folder}/.{base}{TMP_MARK}{posix.getpid()}-{posix.urandom(4).hex()}"
    try:
        fd = posix.open(
            tmp,
            posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW | posix.O_CLOEXEC,
            0o600,
        )
    except OSError:
        return False
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[posix.write(fd, view) :]
            posix.fchmod(fd, 0o644)
        finally:
            posix.close(fd)
        posix.replace(tmp, path)
    except OSError:
        try:
            posix.unlink(tmp)
        except OSError:
            pass
        return False
    return True


def _link(target: str, link: str) -> bool:
    """Point ``link`` at ``target`` as gpuhook.records.writer.write does. False only when the
    records
    folder does not exist (the full path creates it); other failures are ignored, as the full
    path ignores a non-GPU container's record failure."""
    try:
        posix.symlink(target, link)
    except FileNotFoundError:
        return False
    except FileExistsError:
        try:
            if posix.readlink(link) != target:
                tmp = f"{link}.{posix.getpid()}.tmp"
                posix.symlink(target, tmp)
                posix.replace(tmp, link)
        except OSError:
            pass
    except OSError:
        pass
    return True


def _safe_id(cid: str) -> bool:
    return 0 < len(cid) <= 1024 and cid not in (".", "..") and all(c in _ID_CHARS for c in cid)


def _json_safe(text: str) -> bool:
    """Printable ASCII without quote or backslash: the same inside a JSON string."""
    return all(" " <= c <= "~" and c not in '"\\' for c in text)


def _abspath(path: str) -> str:
    if not path.startswith("/"):
        path = posix.getcwd() + "/" + path
    return _normpath(path)


def _normpath(path: str) -> str:
    """posixpath.normpath for an absolute path (without importing posixpath)."""
    root = "//" if path.startswith("//") and not path.startswith("///") else "/"
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return root + "/".join(parts)

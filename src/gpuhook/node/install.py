"""``gpuhook node install|uninstall``: put gpuhook on a node from the DaemonSet's pod, take it off.

Install, in this order (a failing step stops, and what is not yet done stays undone):

1. validate the config (the ConfigMap's file; none: a minimal one) and plan the engine's config
   edit: a bad config or a malformed engine config leaves the node untouched;
2. write the record of the install (``/opt/gpuhook/install.json``: the engine, and which of the
   paths gpuhook may create did not exist before), unless a previous install left one;
3. copy the self-contained runtime (:mod:`gpuhook.node.bundle`) to ``/opt/gpuhook``, file by
   file, each replaced atomically, the dispatchers last;
4. write ``/etc/gpuhook/config.yaml`` (a different file that was there is saved as a backup);
5. refresh the inventory with the host copy itself, chrooted into the host root, so the
   inventory holds host paths (the config's driver root, e.g. ``/`` or ``/run/nvidia/driver``);
6. register ``/opt/gpuhook/bin/gpuhook-runtime`` as the engine's default runtime (``runtime
   configure``: backup kept, nothing written when it is already registered);
7. restart the engine through the host's PID 1 when the registration changed (or a previous
   install changed it and did not get to restart).

Uninstall: unregister first (backup kept), restart the engine, then remove ``/opt/gpuhook`` and
every recorded path that the install (or gpuhook on the node since) created. So the engine never
points at a runtime that is not there, and a pod restarted at any point converges. Containers
created through gpuhook keep its path as their shim's runtime: while one is there, that file is
replaced in place by a pass-through to the low-level runtime instead of removed.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
from typing import TYPE_CHECKING, Any

from gpuhook.config import cache as config_cache
from gpuhook.config import loading as config_loading
from gpuhook.config.types import DEFAULT_PATH
from gpuhook.engines import configure, readers
from gpuhook.errors import ConfigError, NodeInstallError
from gpuhook.fsutil import atomic_write, temp_name
from gpuhook.model.frozen import Frozen
from gpuhook.node import bundle, host
from gpuhook.node.metrics import MetricsChild
from gpuhook.runtime import prepared

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

RECORD = f"{bundle.PREFIX}/install.json"
CONFIG = DEFAULT_PATH
HOOK_PATH = f"{bundle.PREFIX}/bin/gpuhook"
METRICS_CHECK_S = 10.0  # how often the metrics process is restarted when it exited
RUNTIME_PATH = f"{bundle.PREFIX}/bin/gpuhook-runtime"
LDCONFIG = f"{bundle.PREFIX}/bin/ldconfig"
# Where containerd (the system's, and docker's own) keeps its runc shims' task folders.
TASK_STATES = ("/run/containerd", "/run/docker/containerd/daemon")
TASKS = "io.containerd.runtime.v2.task"
STUB_RUNTIME = (
    "#!/bin/sh\n"
    "# Left by `gpuhook node uninstall`: containers created through gpuhook-runtime still have\n"
    "# their shims call this path; it hands every call to the low-level runtime.\n"
    'exec {runtime} "$@"\n'
)
DEFAULT_CONFIG = (
    "# gpuhook config written by `gpuhook node install` (no --config given)\n"
    f"hook:\n  path: {HOOK_PATH}\n  ldconfig: {LDCONFIG}\n"
).encode()


class Record(Frozen):
    """What an install left on the node: the engine, the host paths it (or gpuhook) created,
    and whether the engine still needs a restart to see the registration."""

    engine: str
    created: tuple[str, ...]
    restart_pending: bool

    def with_pending(self, pending: bool) -> Record:
        return Record(self.engine, self.created, pending)


def read_record(host_root: str) -> Record | None:
    try:
        with open(host.host_path(host_root, RECORD), "rb") as fh:
            doc: dict[str, Any] = json.loads(fh.read())
        return Record(doc["engine"], tuple(doc["created"]), bool(doc["restart_pending"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NodeInstallError(f"{RECORD} on the node is unreadable ({exc}); remove it") from None


def write_record(host_root: str, record: Record) -> None:
    doc = {
        "engine": record.engine,
        "created": list(record.created),
        "restart_pending": record.restart_pending,
    }
    path = host.host_path(host_root, RECORD)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode(), 0o644)


def validated_config(config_file: str | None) -> tuple[bytes, dict[str, Any]]:
    """The config's bytes and its normalized data; raises ConfigError with one line. An unset
    ``hook.path`` is the ``gpuhook`` beside the node's ``gpuhook-runtime``: /opt/gpuhook/bin."""
    if config_file is None:
        name, raw = "(the installer's default config)", DEFAULT_CONFIG
    else:
        name = config_file
        try:
            with open(config_file, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise ConfigError(config_file, exc.strerror or "cannot read") from None
    data = config_loading.validate_data(name, config_loading.parse_yaml(name, raw))
    if data["hook"]["path"] not in (None, HOOK_PATH):
        raise ConfigError(
            name, f"must be {HOOK_PATH} on a node installed by the DaemonSet", "hook.path"
        )
    return raw, data


def footprint(data: dict[str, Any], engine_config: str) -> tuple[str, ...]:
    """The host paths gpuhook may create on the node (its folders, config, state, log, cache,
    CDI spec)."""
    paths = [bundle.PREFIX, os.path.dirname(CONFIG), CONFIG, data["state_dir"]]
    paths += [os.path.dirname(config_cache.CACHE_ROOT), engine_config]
    if data["inventory"]["path"]:
        paths.append(data["inventory"]["path"])
    if data["log"]["file"]:
        paths.append(os.path.dirname(data["log"]["file"]))
    if data["cdi"]["output"]:  # the inventory refresh writes the CDI spec there
        paths += [os.path.dirname(data["cdi"]["output"]), data["cdi"]["output"]]
    return tuple(dict.fromkeys(os.path.normpath(p) for p in paths))


def engine_plan(host_root: str, engine: str, action: str) -> configure.Plan:
    return configure.plan(
        engine,
        action,
        config_path=host.host_path(host_root, readers.DEFAULT_PATHS[engine]),
        runtime_path=RUNTIME_PATH,
        set_default=action == configure.CONFIGURE,
        new_version=lambda: host.containerd_major(host_root),
        # the containerd on this PATH may be another than the host's, and would read the
        # host's imports at this root's paths: check with it only on the host itself
        dump=os.path.realpath(host_root) == "/",
    )


def copy_file(src: str, dest: str) -> bool:
    """Replace ``dest`` by a copy of ``src`` (mode and times kept) unless it already is one by
    size and modification time; True when copied."""
    st = os.stat(src)
    try:
        old = os.stat(dest)
        if old.st_size == st.st_size and old.st_mtime_ns == st.st_mtime_ns:
            return False
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
    tmp = temp_name(dest)
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return True


def copy_runtime(host_root: str, source: bundle.Source) -> str:
    """Copy the runtime to the host's /opt/gpuhook (dispatchers last), drop files an older
    install left there; the line to log."""
    prefix = host.host_path(host_root, bundle.PREFIX)
    entries, loader_name = bundle.files(source)
    copied = sum(copy_file(src, os.path.join(prefix, rel)) for src, rel in entries)
    wanted = {rel for _, rel in entries} | {os.path.relpath(RECORD, bundle.PREFIX)}
    for name in bundle.DISPATCHERS:
        with open(os.path.join(source.bin_dir, name), "rb") as fh:
            data = bundle.dispatcher(name, fh.read(), source, loader_name)
        atomic_write(os.path.join(prefix, "bin", name), data, 0o755)
        wanted.add(f"bin/{name}")
    stale = 0
    for folder, _, names in os.walk(prefix):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.relpath(path, prefix) not in wanted:
                os.unlink(path)
                stale += 1
    return (
        f"{bundle.PREFIX}: {len(entries) + len(bundle.DISPATCHERS)} files "
        f"({copied} copied, {stale} stale removed)"
    )


def write_config(host_root: str, raw: bytes, record: Record) -> str:
    path = host.host_path(host_root, CONFIG)
    before = configure.read_text(path)
    if before is not None and before.encode() == raw:
        return f"{CONFIG}: unchanged"
    saved = ""
    if before is not None and CONFIG not in record.created:
        saved = configure.backup_path(path)
        atomic_write(saved, before.encode(), 0o644)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    atomic_write(path, raw, 0o644)
    return f"wrote {CONFIG}" + (f" (previous file saved as {saved})" if saved else "")


def install(
    host_root: str, config_file: str | None, engine: str, restart: bool, source: bundle.Source
) -> list[str]:
    """Install or re-install (idempotent); one line per step done."""
    raw, data = validated_config(config_file)
    plan = engine_plan(host_root, engine, configure.CONFIGURE)
    record = read_record(host_root) or Record(engine, (), False)
    if record.engine != engine:
        raise NodeInstallError(f"gpuhook is installed for {record.engine} here; uninstall first")
    paths = footprint(data, readers.DEFAULT_PATHS[engine])
    new = (p for p in paths if not os.path.lexists(host.host_path(host_root, p)))
    record = Record(engine, tuple(dict.fromkeys((*record.created, *new))), record.restart_pending)
    write_record(host_root, record)
    lines = [copy_runtime(host_root, source), write_config(host_root, raw, record)]
    argv = [HOOK_PATH, "--config", CONFIG, "inventory", "refresh"]
    lines.append(host.chroot_run(host_root, argv, "gpuhook inventory refresh").strip())
    if plan.changed:
        write_record(host_root, record.with_pending(True))
        lines += configure.apply(plan)
    else:
        lines.append(f"{readers.DEFAULT_PATHS[engine]}: gpuhook is already registered")
    return lines + settle(host_root, engine, restart)


def settle(host_root: str, engine: str, restart: bool) -> list[str]:
    """Restart the engine when a registration change is pending, unless told not to."""
    record = read_record(host_root)
    if record is None or not record.restart_pending:
        return []
    if not restart:
        service = readers.SERVICE[engine]
        return [f"not restarted (--no-restart): restart {service} on the node to apply"]
    line = host.restart(engine)
    write_record(host_root, record.with_pending(False))
    return [line]


def containers_through(host_root: str, runtime_path: str) -> list[str]:
    """Ids of the containers whose runc shim calls ``runtime_path`` (``binary_name`` in the
    ``options.json`` of their task folder): created through gpuhook, still there."""
    found = []
    for state in TASK_STATES:
        pattern = host.host_path(host_root, f"{state}/{TASKS}/*/*/options.json")
        for options in sorted(glob.glob(pattern)):
            try:
                with open(options, "rb") as fh:
                    doc = json.loads(fh.read())
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and doc.get("binary_name") == runtime_path:
                found.append(os.path.basename(os.path.dirname(options)))
    return found


def low_level_runtime(host_root: str) -> str:
    """The host path of the runtime gpuhook wrapped: the config's runtime.path when absolute,
    else runc or crun in the host's system folders."""
    try:
        compiled = config_loading.compile_file(host.host_path(host_root, CONFIG))
        configured = compiled["runtime"]["path"]
    except ConfigError:
        configured = ""
    if configured.startswith("/"):
        return str(configured)
    for name in (configured,) if configured else ("runc", "crun"):
        for folder in host.BIN_DIRS:
            if os.access(host.host_path(host_root, f"/{folder}/{name}"), os.X_OK):
                return f"/{folder}/{name}"
    return "/usr/sbin/runc"


def keep_pass_through(host_root: str, ids: list[str]) -> str:
    """Leave ``gpuhook-runtime`` as a plain pass-through to the low-level runtime, for the shims
    of containers created through gpuhook (they call it for kill, delete, exec); the line."""
    runtime = low_level_runtime(host_root)
    text = STUB_RUNTIME.format(runtime=runtime)
    path = host.host_path(host_root, RUNTIME_PATH)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    atomic_write(path, text.encode(), 0o755)
    return (
        f"kept {RUNTIME_PATH} as a pass-through to {runtime}: {len(ids)} containers created "
        f"through gpuhook still call it (e.g. {ids[0]}); remove {bundle.PREFIX} once they are gone"
    )


def uninstall(host_root: str, restart: bool) -> list[str]:
    """Unregister, restart the engine, remove what the install created; one line per step."""
    record = read_record(host_root)
    if record is None:
        return [f"{RECORD}: not found; gpuhook was not installed here by `gpuhook node install`"]
    plan = engine_plan(host_root, record.engine, configure.UNCONFIGURE)
    lines = []
    if plan.changed:  # owed until done: a failed restart is retried by the next uninstall
        write_record(host_root, record.with_pending(True))
        lines += configure.apply(plan)
    lines += settle(host_root, record.engine, restart)
    live = containers_through(host_root, RUNTIME_PATH)
    keep = held_driver_folders(host_root, record)  # running containers' library folders
    if live:  # replaced in place first: the path never goes missing under those shims
        lines.append(keep_pass_through(host_root, live))
        keep.append(RUNTIME_PATH)
    return lines + remove(host_root, record, keep)


def held_driver_folders(host_root: str, record: Record) -> list[str]:
    """The prepared driver folders (:mod:`gpuhook.runtime.prepared`) under the recorded paths
    that a container on the node still has mounted (host paths): kept, as its per-file mounts
    of the driver's own files would have been."""
    held = []
    for path in sorted(record.created):
        root = os.path.join(path, prepared.FOLDER)
        full = host.host_path(host_root, root)
        if os.path.isdir(full) and not os.path.islink(full):
            held += [os.path.join(root, name) for name in sorted(prepared.in_use(full))]
    return held


def remove(host_root: str, record: Record, keep: Sequence[str] = ()) -> list[str]:
    """Remove /opt/gpuhook and the recorded paths, all but those in ``keep`` (host paths)."""
    lines = []
    for path in sorted({bundle.PREFIX, *record.created}, reverse=True):
        full = host.host_path(host_root, path)
        kept = [k for k in keep if k.startswith(path + "/")]
        if kept:
            prune(full, [host.host_path(host_root, k) for k in kept])
            lines.append(f"removed {path}, all but {', '.join(kept)}")
        elif os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
            lines.append(f"removed {path}")
        elif os.path.lexists(full):
            os.unlink(full)
            lines.append(f"removed {path}")
    return lines


def prune(folder: str, keep: Sequence[str]) -> None:
    """Remove everything under ``folder`` but ``keep`` and the folders that lead to them."""
    for entry in os.scandir(folder):
        if entry.path in keep:
            continue
        if any(k.startswith(entry.path + "/") for k in keep):
            prune(entry.path, keep)
        elif entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def serve(
    host_root: str,
    config_file: str | None,
    engine: str,
    restart: bool,
    ready_file: str,
    emit: Callable[[str], None],
    metrics_listen: str = "",
) -> None:
    """The DaemonSet's entrypoint: install, report ready, wait for SIGTERM (or SIGINT), then
    uninstall. With ``metrics_listen``, the installed ``gpuhook metrics serve`` runs meanwhile
    (:mod:`gpuhook.node.metrics`). The signals are held from the start, so one that arrives
    during the install is acted on right after it."""
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    if os.path.lexists(ready_file):  # a container restarted in place keeps its files
        os.unlink(ready_file)
    for line in install(host_root, config_file, engine, restart, bundle.image_source()):
        emit(line)
    os.makedirs(os.path.dirname(ready_file) or ".", mode=0o755, exist_ok=True)
    atomic_write(ready_file, b"ready\n", 0o644)
    emit(f"ready ({ready_file}); uninstalls on SIGTERM")
    child = MetricsChild(host_root, HOOK_PATH, CONFIG, metrics_listen)
    info = None
    while info is None:
        line = child.ensure()
        if line:
            emit(line)
        info = signal.sigtimedwait(signals, METRICS_CHECK_S)
    child.stop()
    got = info.si_signo
    os.unlink(ready_file)
    emit(f"{signal.Signals(got).name}: uninstalling")
    for line in uninstall(host_root, restart):
        emit(line)

"""The file side of ``gpuhook runtime configure|unconfigure``: read, plan, diff, back up, write.

The edits themselves are pure (:mod:`gpuhook.engines.registration`).
Here: the engine's config file is
read (a missing or empty file is a new one), the change is planned for every file involved (the
main config and, for a containerd drop-in, the drop-in), and then either shown as a unified diff
(``--dry-run``) or applied: each previous file is copied to ``<file>.gpuhook-backup-<UTC time>``,
each new text is written atomically with the old file's mode, and the command names the service
to restart. Nothing is written when nothing changes, and a malformed file is refused before
anything is written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import tomllib
from typing import TYPE_CHECKING

from gpuhook import log
from gpuhook.engines import containerd_dump, readers, registration
from gpuhook.errors import RegistrationError, UsageError
from gpuhook.fsutil import atomic_write
from gpuhook.model.frozen import Frozen, _init

if TYPE_CHECKING:
    from collections.abc import Callable

CONFIGURE = "configure"
UNCONFIGURE = "unconfigure"
BACKUP_MARK = ".gpuhook-backup-"


class FileChange(Frozen):
    """One file's planned change. ``after`` None: remove the file."""

    path: str
    before: str | None
    after: str | None

    @property
    def changed(self) -> bool:
        return self.before != self.after


class DumpCheck(Frozen):
    """What ``containerd config dump`` must show once the files are written: gpuhook's runtime
    (and the default, ``set_default``) with runc's ``options``; for an undo, only that the
    config still loads (``name`` "")."""

    containerd: str
    config: str
    name: str
    runtime_path: str
    set_default: bool
    options: tuple[tuple[str, object], ...]


class Plan(Frozen):
    engine: str
    action: str
    changes: tuple[FileChange, ...]
    notes: tuple[str, ...]
    service: str
    check: DumpCheck | None = None

    @property
    def changed(self) -> bool:
        return any(c.changed for c in self.changes)


def read_text(path: str) -> str | None:
    """The file's text, None when it does not exist. Raises OSError or RegistrationError."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise RegistrationError(f"{path}: is a directory, not a config file") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RegistrationError(
            f"{path}: not UTF-8 text (byte {exc.start}); nothing written"
        ) from None


def major_of(version_output: str) -> int:
    """The major version in ``containerd --version`` output (``containerd <repository> v1.7.12
    <commit>``); 1 when it names none."""
    fields = version_output.split()
    major = fields[2].lstrip("v").split(".", 1)[0] if len(fields) >= 3 else ""
    return int(major) if major.isdigit() else 1


def containerd_major(binary: str = readers.DAEMON[readers.CONTAINERD]) -> int:
    """The major version of the installed containerd (``containerd --version``), 1 if unknown."""
    path = shutil.which(binary)
    if not path:
        return 1
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 1
    return major_of(out)


class _Request(Frozen):
    """What one ``runtime configure|unconfigure`` asks for, paths made absolute."""

    engine: str
    action: str
    path: str
    name: str
    runtime_path: str
    set_default: bool
    drop_in: str | None
    base_options: tuple[tuple[str, object], ...] = ()

    def __init__(
        self,
        *,
        engine: str,
        action: str,
        path: str,
        name: str,
        runtime_path: str,
        set_default: bool,
        drop_in: str | None,
        base_options: tuple[tuple[str, object], ...] = (),
    ) -> None:
        _init(
            self,
            engine=engine,
            action=action,
            path=path,
            name=name,
            runtime_path=runtime_path,
            set_default=set_default,
            drop_in=drop_in,
            base_options=base_options,
        )


def plan(
    engine: str,
    action: str,
    *,
    config_path: str | None = None,
    name: str = registration.DEFAULT_NAME,
    runtime_path: str = registration.DEFAULT_RUNTIME_PATH,
    set_default: bool = False,
    drop_in: str | None = None,
    new_version: Callable[[], int] | None = None,
    containerd: str | None = None,
    dump: bool = True,
) -> Plan:
    """The change to every file involved. containerd: with ``dump``, ``containerd config dump``
    (of ``containerd``, else the one on PATH) gives runc's merged options and checks the edit
    once written (:func:`apply`); without, or with no containerd, the edit goes unchecked."""
    if engine not in readers.ENGINES:
        *others, last = readers.ENGINES
        raise UsageError(f"unknown runtime {engine!r} ({', '.join(others)} or {last})")
    path = os.path.abspath(config_path or readers.DEFAULT_PATHS[engine])
    if action == CONFIGURE and not runtime_path.startswith("/"):
        raise UsageError(f"--runtime-path {runtime_path!r}: give an absolute path")
    if drop_in is not None:
        if engine != readers.CONTAINERD:
            raise UsageError("--drop-in: only containerd imports drop-in files")
        drop_in = os.path.abspath(drop_in)
        if drop_in == path:
            raise UsageError("--drop-in: must be another file than --config")
    req = _Request(
        engine=engine,
        action=action,
        path=path,
        name=name,
        runtime_path=runtime_path,
        set_default=set_default,
        drop_in=drop_in,
    )
    before = read_text(path)
    if engine in (readers.DOCKER, readers.PODMAN):
        return _single(req, before, _file_edit(req, before))
    exe = containerd_dump.binary(containerd) if dump else None
    if containerd and exe is None:
        raise UsageError(f"--containerd {containerd!r}: not an executable file")
    version = _version(before, new_version or (lambda: containerd_major(exe or "containerd")))
    return _containerd_plan(req, before, version, exe)


def _containerd_plan(req: _Request, before: str | None, version: int, exe: str | None) -> Plan:
    """containerd's plan, with runc's merged options and the check of :func:`apply` when
    ``exe`` (a containerd) is given."""
    configured = req.action == CONFIGURE
    if exe is not None and before is not None and configured and _is_toml(before):
        req = req.replace(base_options=tuple(_merged_runc_options(exe, req.path).items()))
    if req.drop_in is None:
        p = _single(req, before, _containerd_edit(req, before, version))
    elif configured:
        p = _dropin_configure(req, req.drop_in, before, version)
    else:
        p = _dropin_unconfigure(req, req.drop_in, before)
    if not p.changed:
        return p
    if exe is None:
        unchecked = (
            "containerd not found (--containerd PATH): the edit is not checked with "
            "`containerd config dump`"
        )
        return p.replace(notes=(*p.notes, unchecked))
    name = req.name if configured else ""
    check = DumpCheck(exe, req.path, name, req.runtime_path, req.set_default, req.base_options)
    return p.replace(check=check)


def _is_toml(text: str) -> bool:
    """Whether ``text`` parses (else the edit refuses it with its own line, before any dump)."""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return False
    return True


def _merged_runc_options(containerd: str, path: str) -> dict[str, object]:
    """runc's options as containerd reads the current config (root file and drop-ins)."""
    try:
        merged = containerd_dump.dump(containerd, path)
    except containerd_dump.DumpError as exc:
        raise RegistrationError(
            f"{path}: {exc}: containerd cannot load the config as it is; nothing written"
        ) from None
    return containerd_dump.runc_options(merged)


def _version(before: str | None, new_version: Callable[[], int] | None) -> int:
    """The config version of a new containerd file: 3 for containerd 2.x, else 2."""
    if (before or "").strip():
        return 2
    return 3 if (new_version or containerd_major)() >= 2 else 2


def _single(req: _Request, before: str | None, edit: registration.Edit) -> Plan:
    service = readers.SERVICE[req.engine]
    return Plan(req.engine, req.action, (_change(req.path, before, edit),), edit.notes, service)


def _file_edit(req: _Request, before: str | None) -> registration.Edit:
    """docker's daemon.json or podman's containers.conf: one file, the engine's own pair of
    pure edits."""
    configure, unconfigure = {
        readers.DOCKER: (registration.docker_configure, registration.docker_unconfigure),
        readers.PODMAN: (registration.podman_configure, registration.podman_unconfigure),
    }[req.engine]
    if req.action == CONFIGURE:
        return configure(
            before,
            name=req.name,
            runtime_path=req.runtime_path,
            set_default=req.set_default,
            source=req.path,
        )
    return unconfigure(before, name=req.name, source=req.path)


def _containerd_edit(req: _Request, before: str | None, version: int) -> registration.Edit:
    if req.action == CONFIGURE:
        return registration.containerd_configure(
            before,
            name=req.name,
            runtime_path=req.runtime_path,
            set_default=req.set_default,
            source=req.path,
            new_version=version,
            base_options=dict(req.base_options),
        )
    return registration.containerd_unconfigure(before, name=req.name, source=req.path)


def _dropin_configure(req: _Request, drop_in: str, before: str | None, version: int) -> Plan:
    dropin_before = read_text(drop_in)
    main_edit, dropin_edit = registration.containerd_dropin(
        before,
        dropin_before,
        name=req.name,
        runtime_path=req.runtime_path,
        set_default=req.set_default,
        source=req.path,
        dropin_source=drop_in,
        new_version=version,
        base_options=dict(req.base_options),
    )
    changes = (_change(req.path, before, main_edit), _change(drop_in, dropin_before, dropin_edit))
    notes = tuple(f"{req.path}: {n}" for n in main_edit.notes) + tuple(
        f"{drop_in}: {n}" for n in dropin_edit.notes
    )
    return Plan(req.engine, req.action, changes, notes, readers.SERVICE[req.engine])


def _dropin_unconfigure(req: _Request, drop_in: str, before: str | None) -> Plan:
    dropin_before = read_text(drop_in)
    main_notes: tuple[str, ...] = ()
    main_change = FileChange(req.path, before, before)
    if before is not None and before.strip():
        main_edit = registration.containerd_remove_import(before, drop_in, source=req.path)
        main_change = _change(req.path, before, main_edit)
        main_notes = tuple(f"{req.path}: {n}" for n in main_edit.notes)
    dropin_notes = (f"removed {drop_in}",) if dropin_before is not None else ()
    return Plan(
        req.engine,
        req.action,
        (main_change, FileChange(drop_in, dropin_before, None)),
        main_notes + dropin_notes,
        readers.SERVICE[req.engine],
    )


def _change(path: str, before: str | None, edit: registration.Edit) -> FileChange:
    return FileChange(path, before, edit.text if edit.changed else before)


def render_diff(p: Plan) -> str:
    out = []
    for change in p.changes:
        if change.changed:
            out.append(
                registration.unified_diff(change.before or "", change.after or "", change.path)
            )
    return "".join(out)


def backup_path(path: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    candidate = f"{path}{BACKUP_MARK}{stamp}"
    n = 1
    while os.path.lexists(candidate):
        candidate = f"{path}{BACKUP_MARK}{stamp}.{n}"
        n += 1
    return candidate


def apply(p: Plan) -> list[str]:
    """Back up and write every changed file; then, for containerd, check the result with
    ``containerd config dump`` and restore every file (backups removed) when containerd would
    not read what was meant. Returns one line per file written or removed (and the check)."""
    written: list[_Written] = []
    try:
        lines = _write(p, written)
        if p.check is not None:
            lines.append(_check(p.check))
    except (RegistrationError, OSError) as exc:
        _restore(written)
        if not isinstance(exc, RegistrationError):
            raise
        raise RegistrationError(f"{exc}; every file restored as it was, nothing changed") from None
    return lines


def _check(check: DumpCheck) -> str:
    try:
        merged = containerd_dump.dump(check.containerd, check.config)
    except containerd_dump.DumpError as exc:
        raise RegistrationError(f"{check.config}: after the edit, {exc}") from None
    if not check.name:
        return f"checked: {check.containerd} config dump loads {check.config}"
    found = containerd_dump.problems(
        merged, check.name, check.runtime_path, check.set_default, dict(check.options)
    )
    if found:
        raise RegistrationError(
            f"{check.config}: after the edit, containerd config dump shows {found[0]}"
        )
    default = " as the default runtime" if check.set_default else ""
    return (
        f"checked: {check.containerd} config dump reads runtime {check.name} -> "
        f"{check.runtime_path}{default}"
    )


# What _write did to one file: the change, its backup ("" when none), the folders it created.
_Written = tuple[FileChange, str, tuple[str, ...]]


def _restore(written: list[_Written]) -> None:
    """Put back every file :func:`_write` changed; remove the backups and folders it made."""
    for change, saved, folders in reversed(written):
        if change.before is None:
            if os.path.lexists(change.path):
                os.unlink(change.path)
        else:
            mode = os.stat(saved).st_mode & 0o7777
            atomic_write(change.path, change.before.encode("utf-8"), mode)
        if saved:
            os.unlink(saved)
        for folder in folders:  # deepest first
            try:
                os.rmdir(folder)
            except OSError:
                break


def _new_folders(folder: str) -> tuple[str, ...]:
    """The folders that making ``folder`` creates, deepest first."""
    out: list[str] = []
    while folder and not os.path.isdir(folder):
        out.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return tuple(out)


def _write(p: Plan, written: list[_Written]) -> list[str]:
    lines: list[str] = []
    logger = log.get_logger(engine=p.engine, action=p.action)
    for change in p.changes:
        if not change.changed:
            continue
        saved = ""
        mode: int | None = None
        if change.before is not None:
            mode = os.stat(change.path).st_mode & 0o7777
            saved = backup_path(change.path)
            atomic_write(saved, change.before.encode("utf-8"), mode)
        if change.after is None:
            os.unlink(change.path)
            written.append((change, saved, ()))
            lines.append(f"removed {change.path} (saved as {saved})")
        else:
            folder = os.path.dirname(change.path) or "."
            folders = _new_folders(folder)
            os.makedirs(folder, mode=0o755, exist_ok=True)
            atomic_write(change.path, change.after.encode("utf-8"), mode)
            written.append((change, saved, folders))
            lines.append(
                f"wrote {change.path}"
                + (f" (previous file saved as {saved})" if saved else " (new file)")
            )
        logger.info("runtime registration written", path=change.path, backup=saved or None)
    return lines

"""The driver's library folders prepared on the host, once per driver: a GPU container then gets
each library folder as ONE read-only bind mount instead of a tmpfs and a bind mount per library
and soname (~28 mounts at ~0.16 ms each in runc).

At ``inventory refresh`` (the path unit runs it on every driver change) this makes, for the
capability sets containers ask for most (:func:`capability_sets`), what
:func:`gpuhook.pipeline.driverfiles.per_file` gives a container, as it would look inside it:

    <state_dir>/driverfiles/<generation>/<caps>/lib/         the 64-bit library folder
    <state_dir>/driverfiles/<generation>/<caps>/lib32/       the 32-bit one (compat32)
    <state_dir>/driverfiles/<generation>/<caps>/lib.ldcache/ ldconfig's entries of lib/

(``<caps>``: the set's capabilities, sorted, joined by ``+``.)

Every library and soname is a hard link to the driver's file (the same inode a bind mount of it
shows; a read-only copy where the state folder is on another filesystem), the development, GLX
and GBM links are the links the ldcache hook makes today, and ldconfig has listed the folder
already (the hook reads those entries instead of running ldconfig; :mod:`gpuhook.runtime.hooks`).

``<generation>`` is a digest of the files (paths, inodes, sizes, times) and of what is made of
them: a new driver gets a new folder, built beside the old one under a temporary name and renamed
into place when complete, so a create sees a whole folder or none; the inventory naming it is
written after it (atomically). Running containers keep the folders they mounted: an old
generation is removed (:func:`collect`) only when no mount namespace of the host holds it and it
is not the one before the current (a create may still hold the inventory that named it). Nothing
here comes from an image; nothing of the driver root is followed but the driver's own links to
its files, as the bind mounts did.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat

from gpuhook.pipeline import driverfiles

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuhook.config.types import Config
    from gpuhook.model.inventory import Inventory
    from gpuhook.pipeline.driverfiles import DriverFiles

FOLDER = "driverfiles"
TEMP_PREFIX = ".tmp-"
LAYOUT = 1  # in every generation's digest: a new layout is a new generation
LDCONFIG_TIMEOUT_S = 30.0


class PrepareError(Exception):
    """The folders could not be prepared; ``str()`` is one line (creates use per-file mounts)."""


def capability_sets(config: Config) -> list[frozenset[str]]:
    """The sets prepared: the configured default, the CDI spec's, compute+utility and all."""
    from gpuhook.inventory.catalog import CAPABILITIES

    wanted = [
        frozenset(config.default_capabilities),
        frozenset(config.cdi_capabilities),
        frozenset({"compute", "utility"}),
        frozenset(CAPABILITIES),
    ]
    return list(dict.fromkeys(s for s in wanted if s))


def key(caps: frozenset[str]) -> str:
    """The set's key in the inventory (``Inventory.prepared_folder``)."""
    return ",".join(sorted(caps))


def folder_name(set_key: str) -> str:
    """The set's folder: its capabilities joined by ``+`` (no comma in a mount source)."""
    return set_key.replace(",", "+")


def finish(config: Config, inventory: Inventory) -> Inventory:
    """``inventory`` naming its driver's prepared folders (:func:`prepare`); where they cannot be
    made, with a warning saying why (creates then get a bind mount per file, as before)."""
    try:
        return prepare(config, inventory)
    except PrepareError as exc:
        return inventory.replace(warnings=(*inventory.warnings, str(exc)))


def prepare(config: Config, inventory: Inventory) -> Inventory:
    """``inventory`` naming the prepared folders of its driver (made here unless they exist).
    Raises :class:`PrepareError`."""
    plans = {key(c): driverfiles.per_file(inventory, config, c) for c in capability_sets(config)}
    plans = {k: p for k, p in plans.items() if p.folders}
    if not plans:
        return inventory
    root = os.path.join(config.state_dir, FOLDER)
    try:
        os.makedirs(root, 0o755, exist_ok=True)
        final = os.path.join(root, generation(plans))
        if not os.path.isdir(final):
            _build(config, plans, root, final)
        collect(root, os.path.basename(final))
    except OSError as exc:
        raise PrepareError(f"cannot prepare the driver files in {root}: {_why(exc)}") from None
    folders = tuple((k, os.path.join(final, folder_name(k))) for k in sorted(plans))
    return inventory.replace(prepared=folders)


def generation(plans: dict[str, DriverFiles]) -> str:
    """The digest of what the folders are made of: each set's mounts and links, and each
    source file's identity (a driver file replaced in place is a new generation)."""
    digest = hashlib.sha256(f"layout {LAYOUT}".encode())
    sources = set()
    for name in sorted(plans):
        plan = plans[name]
        digest.update(repr((name, plan.folders, plan.mounts, plan.links)).encode())
        sources |= {m.host_path for m in plan.mounts if m.type == "bind"}
    for path in sorted(sources):
        try:
            st = os.stat(path)
            digest.update(repr((path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)).encode())
        except OSError:
            digest.update(repr((path, None)).encode())
    return digest.hexdigest()[:16]


def _build(config: Config, plans: dict[str, DriverFiles], root: str, final: str) -> None:
    temp = os.path.join(root, f"{TEMP_PREFIX}{os.getpid()}-{os.urandom(4).hex()}")
    umask = os.umask(0o022)  # folders 0755 whatever the caller's umask: containers read them
    try:
        os.mkdir(temp, 0o755)
        for name, plan in plans.items():
            materialize(plan, config, os.path.join(temp, folder_name(name)))
        try:
            os.rename(temp, final)
        except OSError:
            if not os.path.isdir(final):  # else another refresh made the same one first
                raise
    finally:
        os.umask(umask)
        if os.path.lexists(temp):
            shutil.rmtree(temp, ignore_errors=True)


def materialize(plan: DriverFiles, config: Config, dest: str) -> None:
    """Make the library folders of ``plan`` in ``dest`` (a new folder) as the container sees
    them, and each folder's ldconfig entries beside it. Raises OSError, PrepareError."""
    lib_dir = config.lib_dir.rstrip("/") or "/"
    os.mkdir(dest, 0o755)
    subs = {f: driverfiles.prepared_subfolder(lib_dir, f) for f in plan.folders}
    for sub in subs.values():
        os.mkdir(os.path.join(dest, sub), 0o755)
    for mount in plan.mounts:
        where = _inside(mount.container_path, subs, dest)
        if where is None or where in (os.path.join(dest, s) for s in subs.values()):
            continue
        if mount.type == "tmpfs":
            os.mkdir(where, 0o755)
        else:
            _place(mount.host_path, where)
    for link in plan.links:
        path, _, target = link.partition("=")
        where = _inside(path, subs, dest)
        if where is None:
            raise PrepareError(f"link {path} is outside the library folders")
        os.symlink(target, where)
    for sub in subs.values():
        folder = os.path.join(dest, sub)
        _entries(config.ldconfig, folder, folder + driverfiles.PREPARED_CACHE_SUFFIX)


def _inside(path: str, subs: dict[str, str], dest: str) -> str | None:
    """Where the container path ``path`` (in one of the library folders) lies in ``dest``."""
    for folder, sub in subs.items():
        if path == folder:
            return os.path.join(dest, sub)
        if path.startswith(folder + "/"):
            rest = path[len(folder) + 1 :]
            if any(p in ("", ".", "..") for p in rest.split("/")):
                raise PrepareError(f"invalid path {path}")
            return os.path.join(dest, sub, rest)
    return None


def _place(source: str, where: str) -> None:
    """``where``: a hard link to the regular file ``source`` is (the driver's own links to it
    followed, as a bind mount of it does), else a read-only copy of it."""
    real = os.path.realpath(source)
    st = os.stat(real, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        raise PrepareError(f"{source} is not a regular file")
    try:
        os.link(real, where, follow_symlinks=False)
        return
    except OSError:
        pass  # another filesystem, or hard links refused: a copy
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(os.open(real, flags), "rb") as src:
        out = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
            os.fchmod(dst.fileno(), st.st_mode & 0o555)


def _entries(ldconfig: str, folder: str, keep: str) -> None:
    """ldconfig's entries of ``folder`` (the hook's own run: ldmerge.folder_command) moved into
    the new folder ``keep``. Raises PrepareError."""
    from gpuhook.runtime import ldmerge, ldrun

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        code = ldrun.run_bounded(ldmerge.folder_command(ldconfig), LDCONFIG_TIMEOUT_S, fd)
    finally:
        os.close(fd)
    made = os.path.join(folder, ldmerge.FOLDER_CACHE)
    if code != 0 or not os.path.isfile(made):
        raise PrepareError(f"{ldconfig} on {folder} failed ({code})")
    os.mkdir(keep, 0o755)
    os.rename(made, os.path.join(keep, ldmerge.FOLDER_CACHE))
    os.chmod(os.path.join(keep, ldmerge.FOLDER_CACHE), 0o644)


def collect(root: str, current: str) -> list[str]:
    """Remove the generations under ``root`` that no container holds, except ``current`` and the
    newest other one; and temporary folders whose builder is gone. Returns what was removed."""
    names = sorted(os.listdir(root))
    temps = [n for n in names if n.startswith(TEMP_PREFIX) and not _builder_alive(n)]
    olds = [n for n in names if not n.startswith(".") and n != current]
    olds.sort(key=lambda n: _mtime(os.path.join(root, n)))
    used = in_use(root) if olds[:-1] else set()
    removed = [n for n in olds[:-1] if n not in used] + temps
    for name in removed:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return removed


def in_use(root: str) -> set[str]:
    """The generations under ``root`` that a mount of any mount namespace of the host holds."""
    marker = "/" + os.path.basename(root.rstrip("/")) + "/"
    held: set[str] = set()
    seen: set[int] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            ns = os.stat(f"/proc/{pid}/ns/mnt").st_ino
            if ns in seen:
                continue
            seen.add(ns)
            with open(f"/proc/{pid}/mountinfo", "rb") as fh:
                text = fh.read().decode(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split(" ")
            mount_root = fields[3] if len(fields) > 4 else ""
            if marker in mount_root:
                held.add(mount_root.split(marker, 1)[1].split("/", 1)[0])
    return held


def _builder_alive(name: str) -> bool:
    pid = name[len(TEMP_PREFIX) :].partition("-")[0]
    return pid.isdigit() and os.path.exists(f"/proc/{pid}")


def _mtime(path: str) -> float:
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _why(exc: OSError) -> str:
    return f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror or exc)

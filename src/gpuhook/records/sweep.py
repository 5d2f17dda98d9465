"""The record folder's upkeep, with no operator action: ``<state_dir>/containers/`` stays bounded
by the containers that exist, however many a node has run.

* **delete**: once the runtime's ``delete`` of an id succeeds, the dispatcher (and the shim, on
  its Python path) removes the id's record link and exec-env marker (:func:`forget`).
* **sweep**: a container deleted without a ``delete`` through gpuhook-runtime (a crash, an engine
  that calls runc itself, a node that ran an older gpuhook) leaves a dangling link once its
  engine removes the bundle. A create that wrote a record sweeps the folder (:func:`maybe`) when
  the last sweep started :data:`INTERVAL_S` ago or more (one ``stat`` of the stamp otherwise):
  dangling links, with the exec-env marker of the same id, temporary links an interrupted write
  left, and exec-env markers older than :data:`GRACE_S` whose id has no link. One sweep looks
  at no more than :data:`BUDGET` entries, so its cost is bounded whatever the folder holds;
  while a backlog remains, the next sweep comes :data:`BACKLOG_S` after. Only one create sweeps
  at a time (a lock on the stamp); the others do not wait.
* ``gpuhook gc`` (:mod:`.gc`) removes, on demand, what needs the runtime to judge: links whose
  bundle remains but whose container the runtime no longer has.

A link is removed only when it still names the record it named when it was found dangling, and
put back when that record exists again once removed (a create reusing the id and its bundle path
at that moment keeps its link), so a sweep never hides a live container from MPS admission or
``gpuhook inspect``. Hot path: stdlib only; never fails the create that runs it.
"""

from __future__ import annotations

import os
import time

from gpuhook.fsutil import temp_base
from gpuhook.model.frozen import Frozen
from gpuhook.records.ids import SUFFIX, link_id, link_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuhook.config.types import Config

INTERVAL_S = 60.0  # between two sweeps of a folder without backlog
BACKLOG_S = 0.25  # between two sweeps while the last one stopped at its budget
BUDGET = 2048  # folder entries one sweep looks at
GRACE_S = 60.0  # a temporary link or marker younger than this may be a create's under way
STAMP = "containers.swept"  # in state_dir, beside the records folder: its mtime is when the
# last sweep started


class Swept(Frozen):
    """What one sweep did: entries looked at, links removed, whether it stopped at its budget."""

    examined: int
    removed: int
    more: bool


def forget(config: Config, container_id: str) -> None:
    """Remove the record link of ``container_id`` (its runtime deleted it); best effort."""
    try:
        os.unlink(link_path(config.records_dir, container_id))
    except (OSError, ValueError):
        pass


def maybe(config: Config, now: float | None = None) -> Swept | None:
    """Sweep the records folder when a sweep is due and no other create sweeps it; None when
    none ran."""
    import fcntl

    now = time.time() if now is None else now
    stamp = os.path.join(config.state_dir, STAMP)
    due = _due(stamp, now)
    if not due:
        return None
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if due < 0 else 0)
    try:
        fd = os.open(stamp, flags, 0o644)
    except OSError:
        return None  # made or removed by another create meanwhile
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if due > 0 and not _due(stamp, now):
            return None  # another create swept it meanwhile
        os.utime(fd, (now, now))
        swept = run(config, now)
        if swept.more:
            soon = now - INTERVAL_S + BACKLOG_S
            os.utime(fd, (soon, soon))
        return swept
    except OSError:
        return None  # another create sweeps it now, or the stamp cannot be set
    finally:
        os.close(fd)


def _due(stamp: str, now: float) -> int:
    """1 when the last sweep is :data:`INTERVAL_S` old (or in the future: the clock was set
    back), -1 when there was none, 0 when no sweep is due."""
    try:
        last = os.stat(stamp).st_mtime
    except FileNotFoundError:
        return -1
    except OSError:
        return 0
    return 0 if 0 <= now - last < INTERVAL_S else 1


def run(config: Config, now: float, budget: int = BUDGET) -> Swept:
    """One bounded pass over the records folder (see the module docstring)."""
    folder = config.records_dir
    examined = removed = 0
    more = False
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if examined >= budget:
                    more = True
                    break
                examined += 1
                if link_id(entry.name):
                    removed += _dangling(config, entry.path, link_id(entry.name), now)
                elif temp_base(entry.name).endswith(SUFFIX):
                    removed += _stale(entry.path, now)
    except OSError:
        pass
    if not more:
        examined, removed, more = _markers(config, now, budget, examined, removed)
    return Swept(examined, removed, more)


def _markers(
    config: Config, now: float, budget: int, examined: int, removed: int
) -> tuple[int, int, bool]:
    """Exec-env markers older than :data:`GRACE_S` whose container has no record link (its
    link was swept before the marker was old enough to go with it); within the same budget."""
    from gpuhook.records import execenv

    folder = os.path.join(config.state_dir, execenv.DIR)
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if examined >= budget:
                    return examined, removed, True
                examined += 1
                link = link_path(config.records_dir, entry.name)
                if not os.path.lexists(link) and _age(entry.path, now) >= GRACE_S:
                    removed += _stale(entry.path, now)
    except OSError:
        pass
    return examined, removed, False


def _dangling(config: Config, link: str, container_id: str, now: float) -> int:
    """Remove ``link`` when its record is gone (the bundle was deleted); 1 when removed."""
    try:
        target = os.readlink(link)
    except OSError:
        return 0  # a plain file: not a link gpuhook-runtime wrote
    try:
        os.stat(link)
        return 0  # the record is there: a container that exists, or gc's to judge
    except FileNotFoundError:
        pass
    except OSError:
        return 0
    try:
        if os.readlink(link) != target:
            return 0  # replaced by a create meanwhile
        os.unlink(link)
    except OSError:
        return 0
    if os.path.lexists(target):  # a create reused the id and bundle path meanwhile: its link
        try:
            os.symlink(target, link)
        except OSError:
            pass
        return 0
    from gpuhook.records import execenv

    marker = execenv.marker_path(config.state_dir, container_id)
    if marker and _age(marker, now) >= GRACE_S:
        execenv.forget(config.state_dir, container_id)
    return 1


def _stale(path: str, now: float) -> int:
    if _age(path, now) < GRACE_S:
        return 0
    try:
        os.unlink(path)
    except OSError:
        return 0
    return 1


def _age(path: str, now: float) -> float:
    try:
        return now - os.lstat(path).st_mtime
    except OSError:
        return -1.0

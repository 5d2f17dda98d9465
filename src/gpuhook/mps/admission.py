"""MPS admission: what is reserved on each MPS-shared GPU now, and whether a container fits.

The one owner of the rule and of the state it reads. The create path admits through a
:class:`Ledger` that holds the accounting lock (``<state_dir>/mps-usage.lock``) from the read of
the live containers until the caller has written its decision record (:meth:`Ledger.release`),
so two creates cannot both take the last share; ``gpuhook inspect spec`` uses the same code
read-only (no lock, leaving out the bundle it looks at).

**What a container reserves.** On each GPU of its group, the group's share: the control daemon's
default pinned memory limit (:mod:`gpuhook.pipeline.sharing`). An annotation only lowers the
limit a container's processes start with (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``); an MPS client
process may raise its own limit back up to the daemon's default, so the reservation is the
share whatever the annotation. A group without a share has no default: nothing is enforced and
nothing reserved. MPS applies limits per client *process*; a container is counted once.

**Which containers count.** Those whose decision record can be read (the bundle exists) and that
its runtime has not finished with: while the process that ran the runtime's ``create`` is alive
(the record's ``runtime.creator``, pid and start time: the runtime may not know the container
yet), then while the configured ``<runtime> [--root R] state <id>`` says anything but
``stopped``. A container that exited (podman and CRI-O keep its bundle until it is removed) or
that the runtime no longer has stops counting; one whose state cannot be told counts.

**Who may join a group.** A control daemon runs one MPS server at a time, as the uid of its
clients; a client of another uid waits until every client of the running server has exited.
So a container whose process (as the host sees it) has another uid than the live clients of its
group is refused, and a non-root client is refused when the server started as its uid could not
reach the group's pipe folder (a folder above it not searchable by that uid) or create files in
the shm folder.

Hot path: stdlib only, imported by an MPS create alone.
"""

from __future__ import annotations

import os

from gpuhook.errors import MpsError, RequestError
from gpuhook.model.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:

    from gpuhook.config.types import Config
    from gpuhook.fsutil import FileLock
    from gpuhook.model.record import Record
    from gpuhook.pipeline.sharing import MpsPlan

LOCK_NAME = "mps-usage.lock"
LOCK_TIMEOUT_S = 30.0
CREATING = "creating"
STOPPED = "stopped"


class Reservation(Frozen):
    """One live MPS client container: its group, its process's uid on the host (None: not
    known), what it reserves per GPU, and its state (``creating``, the runtime's status, or
    ``unknown: ...``)."""

    container_id: str
    group: str
    uid: int | None
    reserved: tuple[tuple[str, int], ...]  # (GPU uuid, bytes)
    state: str

    def on(self, uuid: str) -> int:
        return sum(size for u, size in self.reserved if u == uuid)


# --- the rule (pure) ------------------------------------------------------------------------------


def check(plan: MpsPlan, live: list[Reservation], oversubscription: str) -> None:
    """Refuse (:class:`RequestError`, one line) a container whose uid differs from that of the
    live clients of its group, or, under ``reject``, whose reservation on a GPU plus those of
    the live containers exceed its memory."""
    _check_uid(plan, live)
    if oversubscription == "reject":
        _check_memory(plan, live)


def _check_uid(plan: MpsPlan, live: list[Reservation]) -> None:
    uid = plan.client.uid
    others = sorted({r.uid for r in live if r.group == plan.group and r.uid not in (None, uid)})
    if uid is None or not others:
        return
    count = sum(1 for r in live if r.group == plan.group and r.uid == others[0])
    raise RequestError(
        f"MPS group {plan.group} serves uid {others[0]} ({count} live container(s)) and its "
        f"control daemon runs one MPS server at a time, as its clients' uid: the CUDA processes "
        f"of this container (uid {uid}) would wait until those exit; run the containers of a "
        "group as one uid, or give this one other GPUs"
    )


def _check_memory(plan: MpsPlan, live: list[Reservation]) -> None:
    from gpuhook.pipeline.sharing import format_size

    for d in plan.devices:
        if not d.reserved:
            continue
        holders = [r for r in live if r.on(d.uuid)]
        used = sum(r.on(d.uuid) for r in holders)
        if used + d.reserved <= d.memory_total:
            continue
        lowered = (
            f" (the group's share: its processes may raise their {format_size(d.pinned)} "
            "limit up to it)"
            if d.pinned < d.reserved
            else ""
        )
        raise RequestError(
            f"MPS pinned memory reservations on GPU {d.gpu_index} would add up to "
            f"{format_size(used + d.reserved)} of its {format_size(d.memory_total)} "
            f"({format_size(d.reserved)} for this container{lowered}, {format_size(used)} for "
            f"{len(holders)} live container(s)); mps.oversubscription is reject"
        )


# --- the non-root client's way to its server ------------------------------------------------------


def check_reachable(plan: MpsPlan) -> None:
    """A non-root client: the MPS server the daemon starts as its uid (on the host) must search
    every folder down to the pipe folder (and the log folder, when mounted) and create files in
    the shm folder. Raises :class:`MpsError` (one line) naming the folder that stops it."""
    uid, gids = plan.client.uid, frozenset(plan.client.gids)
    if not uid:  # root, or not known
        return
    for folder in (plan.pipe_dir, plan.log_dir):
        if folder:
            blocked = unsearchable(folder, uid, gids)
            if blocked:
                raise MpsError(
                    f"the MPS server for uid {uid} (this container's process; the control "
                    f"daemon starts one as each client's uid) cannot reach {folder}: {blocked} "
                    f"is not searchable by it; make it so (chmod o+x), or set mps.root to a "
                    "folder every uid can search"
                )
    if plan.shm and not _may(plan.shm, uid, gids, 0o3):
        raise MpsError(
            f"uid {uid} (this container's process) cannot create files in the MPS shm folder "
            f"{plan.shm}, where MPS clients share memory with their server: make it writable "
            "by every client (as /dev/shm, mode 1777), or set mps.shm"
        )


def unsearchable(folder: str, uid: int = -1, gids: frozenset[int] = frozenset()) -> str:
    """The first folder from / down to ``folder`` that ``uid`` cannot search ("" for none);
    by default, that every other user cannot."""
    parts = [p for p in folder.split("/") if p]
    for i in range(len(parts) + 1):
        path = "/" + "/".join(parts[:i])
        if not _may(path, uid, gids, 0o1):
            return path
    return ""


def non_root_warning(group: str, blocked: str) -> str:
    return (
        f"group {group}: {blocked} is not searchable by other users, so containers whose "
        "process runs as a non-root uid are refused (the control daemon starts an MPS server "
        "as each client's uid, which must reach the pipe folder): chmod o+x it, or set mps.root"
    )


def _may(path: str, uid: int, gids: frozenset[int], bits: int) -> bool:
    """Whether ``uid`` (with ``gids``) has the permission ``bits`` (rwx, 0..7) on ``path``."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if st.st_uid == uid:
        return (st.st_mode >> 6) & bits == bits
    if st.st_gid in gids:
        return (st.st_mode >> 3) & bits == bits
    return st.st_mode & bits == bits


# --- the live containers --------------------------------------------------------------------------


def live(
    config: Config,
    plan: MpsPlan | None = None,
    *,
    exclude_id: str = "",
    exclude_bundle: str = "",
) -> list[Reservation]:
    """The live MPS client containers (of ``plan``'s group or on its GPUs; all when None),
    oldest record name first, leaving out the container ``exclude_id`` and the record in
    ``exclude_bundle`` (a dry run over a live container's bundle)."""
    from gpuhook.records.ids import link_id
    from gpuhook.records.lookup import entry_of

    folder = config.records_dir
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    uuids = {d.uuid for d in plan.devices} if plan is not None else set()
    out = []
    for name in names:
        container_id = link_id(name)
        if not container_id or container_id == exclude_id:
            continue
        entry = entry_of(folder, name)
        if entry.record is None or (
            exclude_bundle and os.path.dirname(entry.target) == exclude_bundle
        ):
            continue  # deleted (a dangling link), unreadable, or the dry run's own
        found = reservation_of(entry.record, container_id)
        if found is None or (
            plan is not None
            and found.group != plan.group
            and not uuids.intersection(u for u, _ in found.reserved)
        ):
            continue
        state = liveness(entry.record, container_id, config.runtime)
        if state:
            out.append(
                Reservation(found.container_id, found.group, found.uid, found.reserved, state)
            )
    return out


def reservation_of(record: Record, container_id: str) -> Reservation | None:
    """What a decision record reserves (None: not an MPS client). Records written before
    reservations existed count their ``counted`` limits
    (:attr:`gpuhook.model.record.MpsLimit.reservation`)."""
    mps = record.view.mps
    if mps is None:
        return None
    reserved = tuple((x.uuid, x.reservation) for x in mps.limits if x.reservation > 0)
    return Reservation(container_id, mps.group, mps.client_uid, reserved, "")


def liveness(record: Record, container_id: str, runtime: str) -> str:
    """Whether the runtime is not finished with a recorded container: its state (``creating``
    while the process that ran the runtime's create lives), "" when it exited or is gone.
    ``runtime``: the configured one, never a path read from the record (in the bundle), which
    only says which state folder (``--root``) the container was created in. Gone takes two
    witnesses, as for ``gpuhook gc``: ``state`` fails and the state folder has no entry."""
    from gpuhook.records.lookup import DEFAULT_ROOTS, query_state

    creator = record.runtime.creator
    if creator is not None and _alive(creator.pid, creator.start):
        return CREATING
    if not runtime:
        return "unknown: no runtime configured"
    root = record.runtime.root
    try:
        code, out = query_state(runtime, root, container_id)
    except OSError as exc:
        return f"unknown: {exc}"
    if code == 0:
        status = _status(out)
        return "" if status == STOPPED else status or "unknown: no status in the runtime's state"
    state_root = root or DEFAULT_ROOTS.get(os.path.basename(runtime), "")
    if state_root and not os.path.lexists(os.path.join(state_root, container_id)):
        return ""
    return f"unknown: {os.path.basename(runtime)} state {container_id} exited {code}"


def _status(out: bytes) -> str:
    """The ``status`` of a runtime's state JSON ("" when there is none)."""
    from gpuhook import _fastjson

    try:
        state = _fastjson.loads(out)
    except ValueError:
        return ""
    status = state.get("status") if isinstance(state, dict) else None
    return status if isinstance(status, str) else ""


def start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, /proc/PID/stat field 22); None when it
    is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rpartition(b")")[2].split()
    except OSError:
        return None
    if len(fields) < 20 or fields[0] == b"Z":
        return None
    return int(fields[19])


def creator(pid: int) -> dict[str, int] | None:
    """The record's ``runtime.creator`` for the process that will run the runtime's create."""
    start = start_time(pid)
    return {"pid": pid, "start": start} if start is not None else None


def _alive(pid: int, start: int) -> bool:
    return pid > 0 and start_time(pid) == start


# --- admission ------------------------------------------------------------------------------------


class Ledger:
    """The create path's ``mps_admit``: checks that a non-root client reaches its server, then
    reads the live containers of the plan's group (under the accounting lock when ``locked``,
    held until :meth:`release`) and applies :func:`check`. ``exclude_id``: the container being
    created; ``exclude_bundle``: the bundle of a dry run."""

    def __init__(
        self,
        config: Config,
        exclude_id: str = "",
        *,
        exclude_bundle: str = "",
        locked: bool = True,
    ) -> None:
        self.config = config
        self.exclude_id = exclude_id
        self.exclude_bundle = exclude_bundle
        self.locked = locked
        self.lock: FileLock | None = None
        self.seen: list[Reservation] | None = None

    def __call__(self, plan: MpsPlan) -> None:
        check_reachable(plan)
        reject = self.config.mps.oversubscription == "reject"
        if plan.client.uid is None and not (reject and any(d.reserved for d in plan.devices)):
            return  # nothing to compare: no uid, and no reservation to add up
        if self.locked:
            self._acquire()
        self.seen = live(
            self.config, plan, exclude_id=self.exclude_id, exclude_bundle=self.exclude_bundle
        )
        check(plan, self.seen, self.config.mps.oversubscription)

    def _acquire(self) -> None:
        from gpuhook.fsutil import FileLock

        if self.lock is not None:
            return
        lock = FileLock(os.path.join(self.config.state_dir, LOCK_NAME), timeout=LOCK_TIMEOUT_S)
        try:
            lock.__enter__()
        except TimeoutError:
            raise MpsError(f"timed out waiting for the MPS accounting lock {lock.path}") from None
        except OSError as exc:
            raise MpsError(f"cannot lock {lock.path}: {exc.strerror}") from None
        self.lock = lock

    def release(self) -> None:
        """Let the next MPS create read the live containers (after this one's record)."""
        lock = self.lock
        if lock is not None:
            self.lock = None
            lock.__exit__(None, None, None)

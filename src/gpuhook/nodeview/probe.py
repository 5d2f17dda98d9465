"""The node view's I/O: the inventory's devices, the live containers' records, NVML's running
processes and each process's owner from /proc. The join itself is :mod:`gpuhook.nodeview.join`.

Reads only: it never writes, never takes the MPS accounting lock, and runs in the CLI or the
metrics process, never on a container's create path.
"""

from __future__ import annotations

import os

from gpuhook.model.frozen import Frozen
from gpuhook.nodeview import join

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuhook.config.types import Config
    from gpuhook.model.inventory import Inventory
    from gpuhook.model.record import Record

PROC = "/proc"
MAX_CMDLINE = 4096


class Snapshot(Frozen):
    """What one look at the node saw: the joined view, the live grants (each record's
    decision, refused ones included), the share groups' GPUs, and why NVML could not be read
    ("" when it was)."""

    usage: join.NodeUsage
    grants: tuple[join.Grant, ...]
    mps_groups: tuple[tuple[str, tuple[str, ...]], ...]
    nvml_error: str = ""


def devices(inventory: Inventory) -> list[join.Device]:
    """Each GPU, or each MIG device of a GPU in MIG mode (processes run on those)."""
    out: list[join.Device] = []
    for gpu in inventory.gpus:
        if gpu.mig_enabled and gpu.mig_devices:
            out.extend(
                join.Device(
                    f"{gpu.index}:{m.index}", m.uuid, "mig", m.name, m.memory_total, gpu.uuid
                )
                for m in gpu.mig_devices
            )
        else:
            out.append(join.Device(str(gpu.index), gpu.uuid, "gpu", gpu.name, gpu.memory_total))
    return out


def grant_of(record: Record, state: str) -> join.Grant:
    """A record's decision as the view shows it."""
    kube = record.kubernetes
    decision = record.decision
    mps = record.view.mps
    return join.Grant(
        record.container_id,
        kube.namespace if kube else "",
        kube.pod_name if kube else "",
        kube.container_name if kube else "",
        kube.pod_uid if kube else "",
        decision.channel or "none",
        tuple(d.uuid for d in decision.devices),
        decision.refused,
        decision.reasons[0].why if decision.reasons else "",
        record.timestamp,
        state,
        mps.group if mps else "",
        mps.percentage if mps else None,
        tuple((x.uuid, x.pinned) for x in mps.limits) if mps else (),
        tuple((x.uuid, x.reservation) for x in mps.limits if x.reservation) if mps else (),
    )


def live_grants(config: Config) -> list[join.Grant]:
    """The records of the containers the runtime has not finished with (a stopped or deleted
    container is left out: it holds nothing and runs nothing)."""
    from gpuhook.mps.admission import liveness
    from gpuhook.records import lookup

    out = []
    for entry in lookup.scan(config.records_dir):
        if entry.record is None:
            continue
        state = liveness(entry.record, entry.container_id, config.runtime)
        if state:
            out.append(grant_of(entry.record, state))
    return out


def mps_groups(config: Config, inventory: Inventory) -> dict[str, tuple[str, ...]]:
    """Each MPS share group's GPU UUIDs (none when MPS is off or the config does not fit)."""
    from gpuhook.errors import GpuhookError
    from gpuhook.pipeline import sharing

    if not config.mps.enabled:
        return {}
    try:
        groups = sharing.resolve_groups(config.mps, inventory, config.source)
    except GpuhookError:
        return {}
    return {g.name: tuple(x.uuid for x in g.gpus) for g in groups}


def mps_daemons(config: Config, inventory: Inventory) -> dict[int, str]:
    """The pid of each share group's control daemon, and the group's name."""
    from gpuhook.errors import GpuhookError
    from gpuhook.mps import daemons
    from gpuhook.pipeline import sharing

    if not config.mps.enabled:
        return {}
    try:
        groups = sharing.resolve_groups(config.mps, inventory, config.source)
    except GpuhookError:
        return {}
    out = {}
    for group in groups:
        pid = daemons.control_pid(group.pipe_dir(config.mps.root))
        if pid is not None:
            out[pid] = group.name
    return out


def processes(config: Config, uuids: list[str]) -> list[join.Process]:
    """NVML's running processes on the devices ``uuids``. Raises InventoryError."""
    from gpuhook.inventory import nvml, store

    found = nvml.running_processes(config.nvml_library, store.nvml_candidates(config), uuids)
    return [join.Process(p.uuid, p.kind, p.pid, p.used_memory) for p in found]


def _read(path: str, limit: int = 65536) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _ppid(pid: int) -> int:
    stat = _read(f"{PROC}/{pid}/stat") or b""
    fields = stat.rpartition(b")")[2].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def owner(pid: int, daemon_groups: dict[int, str], host_mnt: str) -> join.Owner | None:
    """Who ``pid`` is (None when /proc does not show it)."""
    cgroup = _read(f"{PROC}/{pid}/cgroup")
    if cgroup is None:
        return None
    text = cgroup.decode("utf-8", "replace")
    raw = _read(f"{PROC}/{pid}/cmdline", MAX_CMDLINE) or b""
    command = " ".join(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)
    try:
        mnt = os.readlink(f"{PROC}/{pid}/ns/mnt")
    except OSError:
        mnt = host_mnt
    group = daemon_groups.get(pid) or daemon_groups.get(_ppid(pid), "")
    return join.Owner(
        pid,
        join.cgroup_ids(text),
        bool(host_mnt) and mnt != host_mnt,
        join.pod_uid_of(text),
        command,
        group,
    )


def host_mount_namespace() -> str:
    """The host's mount namespace: pid 1's (the view runs in the host's pid namespace)."""
    for pid in ("1", "self"):
        try:
            return os.readlink(f"{PROC}/{pid}/ns/mnt")
        except OSError:
            continue
    return ""


def snapshot(config: Config, inventory: Inventory) -> Snapshot:
    """One look at the node. NVML failing is no error: the view then has no processes and
    says why in ``nvml_error``."""
    from gpuhook.errors import GpuhookError

    devs = devices(inventory)
    grants = live_grants(config)
    groups = mps_groups(config, inventory)
    nvml_error = ""
    try:
        procs = processes(config, [d.uuid for d in devs])
    except GpuhookError as exc:
        procs, nvml_error = [], str(exc)
    daemon_groups = mps_daemons(config, inventory)
    host_mnt = host_mount_namespace()
    owners = {}
    for pid in sorted({p.pid for p in procs}):
        found = owner(pid, daemon_groups, host_mnt)
        if found is not None:
            owners[pid] = found
    usage = join.join(devs, grants, procs, owners, groups)
    return Snapshot(usage, tuple(grants), tuple(sorted(groups.items())), nvml_error)

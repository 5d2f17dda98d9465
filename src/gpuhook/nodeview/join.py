"""The node view's join, pure: the decision records' grants, NVML's processes per device and
each process's owner (its cgroup, mount namespace and command line, read by
:mod:`gpuhook.nodeview.probe`) become, per GPU and MIG device, who holds it, who uses it, the
MPS clients of each share group, and every unexpected user.

A process on a device is expected when it belongs to a container whose record grants that
device (or the MIG device's whole GPU), or is the MPS server of a share group the device is in.
Every other one is an unexpected user: a process of a container whose create was refused, of a
container granted other devices, of a container gpuhook has no record of (created by another
runtime, or with no GPU marker in its spec: a privileged pod, a misused CDI spec), a host
process, or a pid this view cannot see.
"""

from __future__ import annotations

import re

from gpuhook.model.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

# How a process stands to the device it uses.
CONTAINER = "container"  # a container with a gpuhook record
UNRECORDED = "unrecorded-container"  # a container without one
HOST = "host"
MPS_SERVER = "mps-server"
UNSEEN = "unseen"  # NVML lists it, /proc does not show it (another pid namespace)

# What runtimes and engines put around a container id in a cgroup path's components:
# "docker-<id>.scope", "cri-containerd-<id>.scope", "crio-<id>.scope", "libpod-<id>.scope"
# (systemd driver), or the bare id (cgroupfs driver, runc's default "/<id>").
_CGROUP_PREFIXES = ("docker-", "cri-containerd-", "crio-", "libpod-", "containerd-")
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


class Device(Frozen):
    """One GPU or MIG device of the node (``id``: the GPU index, or ``<gpu>:<mig>``)."""

    id: str
    uuid: str
    kind: str  # "gpu" | "mig"
    name: str
    memory_total: int
    parent_uuid: str = ""  # a MIG device's GPU


class Grant(Frozen):
    """A live container's decision, from its record: what it was granted, through which
    channel, its MPS share and limits, and since when (the record's timestamp)."""

    container_id: str
    namespace: str
    pod_name: str
    container_name: str
    pod_uid: str
    channel: str
    devices: tuple[str, ...]  # granted UUIDs
    refused: bool
    why: str  # the deciding reason
    since: float
    state: str  # the runtime's status: running, created, paused, creating
    mps_group: str = ""
    mps_percentage: int | None = None
    mps_limits: tuple[tuple[str, int], ...] = ()  # (uuid, pinned bytes)
    mps_reserved: tuple[tuple[str, int], ...] = ()  # (uuid, bytes held for admission)

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.pod_name}" if self.pod_name else ""


class Owner(Frozen):
    """Who a pid is, as /proc shows it: the container ids its cgroup path names (leaf first),
    whether it runs in another mount namespace than the host's (a container), the pod UID its
    cgroup names, its command line, and the MPS share group whose daemon or server it is."""

    pid: int
    cgroup_ids: tuple[str, ...]
    in_container: bool
    pod_uid: str = ""
    command: str = ""
    mps_group: str = ""


class Process(Frozen):
    """One process NVML lists on one device."""

    uuid: str
    kind: str  # compute | graphics | mps
    pid: int
    used_memory: int


class Use(Frozen):
    """One process on one device and whose it is: ``owner`` is one of CONTAINER, UNRECORDED,
    HOST, MPS_SERVER, UNSEEN; ``expected`` False makes it an unexpected user, ``why`` says
    why either way."""

    pid: int
    kind: str
    used_memory: int
    owner: str
    expected: bool
    why: str
    container_id: str = ""
    pod: str = ""
    pod_uid: str = ""
    container_name: str = ""
    command: str = ""
    mps_group: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields}


class DeviceUsage(Frozen):
    device: Device
    grants: tuple[Grant, ...]
    uses: tuple[Use, ...]
    mps_groups: tuple[str, ...]  # the share groups the device is in


class NodeUsage(Frozen):
    devices: tuple[DeviceUsage, ...]

    @property
    def unexpected(self) -> list[tuple[Device, Use]]:
        return [(d.device, u) for d in self.devices for u in d.uses if not u.expected]

    def mps_clients(self) -> dict[str, list[tuple[Device, Use]]]:
        """Per MPS share group, the processes of its client containers, device by device."""
        out: dict[str, list[tuple[Device, Use]]] = {}
        for d in self.devices:
            for u in d.uses:
                if u.owner == CONTAINER and u.mps_group:
                    out.setdefault(u.mps_group, []).append((d.device, u))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": [_device_dict(d) for d in self.devices],
            "mps_clients": {
                group: [{"device": dev.id, **use.to_dict()} for dev, use in uses]
                for group, uses in sorted(self.mps_clients().items())
            },
            "unexpected": [
                {"device": dev.id, "uuid": dev.uuid, **u.to_dict()} for dev, u in self.unexpected
            ],
        }


def _device_dict(d: DeviceUsage) -> dict[str, Any]:
    return {
        "id": d.device.id,
        "uuid": d.device.uuid,
        "kind": d.device.kind,
        "name": d.device.name,
        "memory_total": d.device.memory_total,
        "mps_groups": list(d.mps_groups),
        "granted": [grant_dict(g, d.device) for g in d.grants],
        "processes": [u.to_dict() for u in d.uses],
        "used_memory": sum(u.used_memory for u in d.uses),
    }


def grant_dict(g: Grant, device: Device) -> dict[str, Any]:
    limit = dict(g.mps_limits).get(device.uuid) or dict(g.mps_limits).get(device.parent_uuid)
    return {
        "container_id": g.container_id,
        "pod": g.pod,
        "pod_uid": g.pod_uid,
        "container": g.container_name,
        "channel": g.channel,
        "state": g.state,
        "since": g.since,
        "mps": None
        if not g.mps_group
        else {
            "group": g.mps_group,
            "active_thread_percentage": g.mps_percentage,
            "pinned_memory_limit": limit,
            "reserved": dict(g.mps_reserved).get(device.uuid, 0),
        },
    }


# --- reading a cgroup -----------------------------------------------------------------------------


def cgroup_ids(cgroup_text: str) -> tuple[str, ...]:
    """The names a process's cgroup paths (``/proc/PID/cgroup``) could give its container by,
    leaf first, each path's components with an engine's prefix and ``.scope`` taken off."""
    out: list[str] = []
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        for part in reversed([p for p in path.split("/") if p]):
            name = part.removesuffix(".scope")
            for prefix in _CGROUP_PREFIXES:
                name = name.removeprefix(prefix)
            if name and name not in out:
                out.append(name)
    return tuple(out)


def pod_uid_of(cgroup_text: str) -> str:
    """The pod UID a kubelet's cgroup path names (``pod<uid>``, ``_`` for ``-`` under systemd)."""
    found = _POD_UID.search(cgroup_text)
    return found.group(1).replace("_", "-") if found else ""


# --- the join ------------------------------------------------------------------------------------


def join(
    devices: Iterable[Device],
    grants: Iterable[Grant],
    processes: Iterable[Process],
    owners: Mapping[int, Owner],
    mps_groups: Mapping[str, tuple[str, ...]],
) -> NodeUsage:
    """The view. ``grants``: the live containers' records (refused ones too: their processes
    are unexpected); ``owners`` by pid (a pid missing is UNSEEN); ``mps_groups``: each share
    group's GPU UUIDs."""
    by_id = {g.container_id: g for g in grants}
    by_device: dict[str, list[Process]] = {}
    for p in processes:
        by_device.setdefault(p.uuid, []).append(p)
    out = []
    for dev in devices:
        groups = tuple(
            sorted(n for n, uuids in mps_groups.items() if {dev.uuid, dev.parent_uuid} & set(uuids))
        )
        holders = tuple(g for g in by_id.values() if _holds(g, dev))
        uses = tuple(
            sorted(
                (
                    _use(p, dev, owners.get(p.pid), by_id, groups)
                    for p in by_device.get(dev.uuid, [])
                ),
                key=lambda u: (u.pid, u.kind),
            )
        )
        out.append(DeviceUsage(dev, holders, uses, groups))
    return NodeUsage(tuple(out))


def _holds(grant: Grant, dev: Device) -> bool:
    return not grant.refused and bool({dev.uuid, dev.parent_uuid} & set(grant.devices) - {""})


def _use(
    p: Process,
    dev: Device,
    owner: Owner | None,
    by_id: Mapping[str, Grant],
    groups: tuple[str, ...],
) -> Use:
    if owner is None:
        why = "no such process in this view's pid namespace (is it run with the host's?)"
        return Use(p.pid, p.kind, p.used_memory, UNSEEN, False, why)
    if owner.mps_group and owner.mps_group in groups:
        why = f"the MPS server of share group {owner.mps_group}"
        return Use(p.pid, p.kind, p.used_memory, MPS_SERVER, True, why, command=owner.command,
                   mps_group=owner.mps_group)  # fmt: skip
    grant = next((by_id[i] for i in owner.cgroup_ids if i in by_id), None)
    if grant is not None:
        return _container_use(p, dev, owner, grant)
    if owner.in_container:
        leaf = owner.cgroup_ids[0] if owner.cgroup_ids else ""
        why = (
            f"container {leaf or '(unknown)'} has no gpuhook decision record: created by another "
            "runtime, or with no GPU marker in its spec, so gpuhook never granted it a GPU"
        )
        return Use(p.pid, p.kind, p.used_memory, UNRECORDED, False, why, container_id=leaf,
                   pod_uid=owner.pod_uid, command=owner.command)  # fmt: skip
    why = "a host process (in no container)"
    return Use(p.pid, p.kind, p.used_memory, HOST, False, why, command=owner.command)


def _container_use(p: Process, dev: Device, owner: Owner, grant: Grant) -> Use:
    expected, why = _judge(grant, dev)
    return Use(
        p.pid,
        p.kind,
        p.used_memory,
        CONTAINER,
        expected,
        why,
        container_id=grant.container_id,
        pod=grant.pod,
        pod_uid=grant.pod_uid,
        container_name=grant.container_name,
        command=owner.command,
        mps_group=grant.mps_group,
    )


def _judge(grant: Grant, dev: Device) -> tuple[bool, str]:
    """Whether a container's grant covers the device it uses, and why."""
    if grant.refused:
        return False, f"its create was refused a GPU: {grant.why}"
    if _holds(grant, dev):
        return True, f"granted through {grant.channel}"
    if not grant.devices:
        return False, "its record grants it no device"
    return False, "not granted this device (its record grants others)"

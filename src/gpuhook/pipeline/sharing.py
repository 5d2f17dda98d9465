"""CUDA MPS sharing, the pure part: share groups, and the limits a container gets (pure).

Config (``mps.*``) x inventory -> :class:`Group` s: the GPUs each MPS control daemon serves.
A CUDA process talks to exactly one control daemon (one ``CUDA_MPS_PIPE_DIRECTORY``), and an
MPS client sees every GPU of its daemon, so a container granted shared GPUs must be granted
exactly the GPUs of one group: by default every shared GPU is its own group (``gpu<index>``);
``mps.groups`` puts several GPUs behind one daemon.

Decision x groups x request annotations -> :class:`MpsPlan`: the pipe directory to mount, and
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` with the source
of each value (an annotation, or the configured share). The index in ``<index>=<size>`` is the
device's position in the container's view: granted devices are sorted by GPU index, which is also
the order of the group's ``CUDA_VISIBLE_DEVICES`` and so of the devices the MPS server exposes.

Annotations may lower the configured share, never raise it. They lower only the limits a
container's processes start with (its env): an MPS client process may raise its own limits back
up to the control daemon's defaults, which are the group's share, so each device's
``reserved`` is the share (what the container's processes can actually take), whatever the
annotation; a group without a share reserves nothing (no limit is enforced). MPS applies the
limits per client *process*: ``reserved`` counts one per container. What is reserved on a GPU
now, and the admission rule over it, is :mod:`gpuhook.mps.reservations`. Every refusal is one
line.
"""

from __future__ import annotations

from gpuhook.config.units import GIB, MIB, parse_size
from gpuhook.errors import ConfigError, RequestError
from gpuhook.model.decision import KIND_GPU
from gpuhook.model.edits import Mount
from gpuhook.model.frozen import Frozen
from gpuhook.pipeline.identity import ROOT_CLIENT, Client

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config.types import MpsConfig
    from gpuhook.model.decision import Decision, Request
    from gpuhook.model.inventory import Gpu, Inventory

ANN_PERCENTAGE = "gpuhook.io/mps-active-thread-percentage"
ANN_PINNED = "gpuhook.io/mps-pinned-memory-limit"
ENV_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
ENV_LOG = "CUDA_MPS_LOG_DIRECTORY"
ENV_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_PINNED = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
# Fixed paths inside the container (the host paths come from mps.root and the group).
PIPE_IN_CONTAINER = "/run/gpuhook/mps/pipe"
LOG_IN_CONTAINER = "/run/gpuhook/mps/log"
SHM_IN_CONTAINER = "/dev/shm"  # noqa: S108 - a path inside the container
PIPE_OPTIONS = ("nosuid", "nodev", "noexec", "bind")
LOG_OPTIONS = ("ro", "nosuid", "nodev", "noexec", "bind")
SHM_OPTIONS = ("nosuid", "nodev", "noexec", "bind")


def format_size(n: int) -> str:
    """Bytes -> ``20G``, ``512M``, ``79.6G``: for messages and tables."""
    if n % GIB == 0:
        return f"{n // GIB}G"
    if n >= GIB:
        return f"{n / GIB:.1f}G"
    if n % MIB == 0:
        return f"{n // MIB}M"
    return f"{n}B"


def mps_size(n: int) -> str:
    """The form gpuhook gives MPS (env and control commands): whole MiB, ``20480M``."""
    return f"{n // MIB}M"


# --- groups ---------------------------------------------------------------------------------------


class Share(Frozen):
    """One limit of a group's share: ``value`` (None: not limited) and where it came from."""

    value: int | None
    source: str


class GroupGpu(Frozen):
    index: int
    uuid: str
    memory_total: int


class Group(Frozen):
    """GPUs served by one MPS control daemon, in the order the daemon (and its clients) see
    them, with the share of one client: a thread percentage and a pinned limit per GPU."""

    name: str
    gpus: tuple[GroupGpu, ...]
    percentage: Share
    pinned: tuple[Share, ...]  # aligned with gpus

    def pipe_dir(self, root: str) -> str:
        return f"{root.rstrip('/')}/{self.name}/pipe"

    def log_dir(self, root: str) -> str:
        return f"{root.rstrip('/')}/{self.name}/log"

    def shm_dir(self, root: str) -> str:
        """The group's own shm folder (a tmpfs, :mod:`gpuhook.mps.folders`)."""
        return f"{root.rstrip('/')}/{self.name}/shm"

    @property
    def indices(self) -> str:
        return ",".join(str(g.index) for g in self.gpus)

    def visible_devices(self) -> str:
        """``CUDA_VISIBLE_DEVICES`` of the daemon: UUIDs, never indices (which MPS remaps)."""
        return ",".join(g.uuid for g in self.gpus)

    def default_commands(self) -> list[str]:
        """The control-interface commands that set this group's share as the daemon's defaults
        (device indices as the daemon sees them: positions in ``gpus``)."""
        out = []
        if self.percentage.value is not None:
            out.append(f"set_default_active_thread_percentage {self.percentage.value}")
        for i, share in enumerate(self.pinned):
            if share.value is not None:
                out.append(f"set_default_device_pinned_mem_limit {i} {mps_size(share.value)}")
        return out

    def share_dict(self) -> dict[str, Any]:
        return {
            "active_thread_percentage": {
                "value": self.percentage.value,
                "source": self.percentage.source,
            },
            "pinned_memory_limit": [
                {
                    "index": i,
                    "gpu": g.index,
                    "value": mps_size(s.value) if s.value is not None else None,
                    "source": s.source,
                }
                for i, (g, s) in enumerate(zip(self.gpus, self.pinned, strict=True))
            ],
        }


def _auto_name(index: int) -> str:
    return f"gpu{index}"


def _describe(inventory: Inventory) -> str:
    indices = [g.index for g in inventory.gpus]
    return "GPUs " + ",".join(str(i) for i in indices) if indices else "no GPUs"


def _resolve_id(gpu_id: str, inventory: Inventory, source: str, key: str) -> list[Gpu]:
    lowered = gpu_id.strip().lower()
    if lowered == "all":
        return [g for g in inventory.gpus if not g.mig_enabled]
    found: Gpu | None = None
    if lowered.isdigit():
        found = next((g for g in inventory.gpus if g.index == int(lowered)), None)
    else:
        found = next((g for g in inventory.gpus if g.uuid.lower() == lowered), None)
    if found is None:
        raise ConfigError(source, f"no GPU {gpu_id} on this node ({_describe(inventory)})", key)
    if found.mig_enabled:
        raise ConfigError(
            source,
            f"GPU {found.index} ({found.uuid}) is in MIG mode; MIG devices cannot be MPS-shared",
            key,
        )
    return [found]


class _Level(Frozen):
    """The share keys of one config level (``mps.groups.<name>`` or ``mps``)."""

    key: str
    replicas: int | None
    percentage: int | None
    pinned: str | None


def _share(gpus: list[Gpu], levels: list[_Level], source: str) -> tuple[Share, tuple[Share, ...]]:
    """The share of one client. The first level that sets a value wins (a group before
    ``mps``); within a level an explicit value wins over the one derived from ``replicas``."""
    pct = Share(None, "no share configured")
    for level in levels:
        if level.percentage is not None:
            pct = Share(level.percentage, f"{level.key}.active_thread_percentage")
            break
        if level.replicas is not None:
            pct = Share(
                max(1, 100 // level.replicas), f"100/{level.replicas} from {level.key}.replicas"
            )
            break
    shares = []
    for gpu in gpus:
        share = Share(None, "no share configured")
        for level in levels:
            if level.pinned is not None:
                key = f"{level.key}.pinned_memory_limit"
                try:
                    value = parse_size(level.pinned)
                except ValueError as exc:
                    raise ConfigError(source, str(exc), key) from None
                if value > gpu.memory_total:
                    raise ConfigError(
                        source,
                        f"{level.pinned} is more than the memory of GPU {gpu.index} "
                        f"({format_size(gpu.memory_total)})",
                        key,
                    )
                share = Share(value // MIB * MIB, key)
                break
            if level.replicas is not None:
                value = gpu.memory_total // level.replicas // MIB * MIB
                share = Share(
                    value,
                    f"1/{level.replicas} of {format_size(gpu.memory_total)} "
                    f"from {level.key}.replicas",
                )
                break
        shares.append(share)
    return pct, tuple(shares)


def resolve_groups(mps: MpsConfig, inventory: Inventory, source: str) -> tuple[Group, ...]:
    """The share groups of this node, sorted by their first GPU. Raises :class:`ConfigError`
    (naming ``source`` and the key) for a GPU id this node does not have, a GPU in MIG mode
    named explicitly (``all`` skips them), or a GPU in two groups."""
    owner: dict[str, str] = {}
    groups: list[Group] = []
    top = _Level("mps", mps.replicas, mps.active_thread_percentage, mps.pinned_memory_limit)
    for gc in mps.groups:
        key = f"mps.groups.{gc.name}"
        members: dict[str, Gpu] = {}
        for i, gpu_id in enumerate(gc.gpus):
            for gpu in _resolve_id(gpu_id, inventory, source, f"{key}.gpus[{i}]"):
                if gpu.uuid in owner and owner[gpu.uuid] != gc.name:
                    raise ConfigError(
                        source,
                        f"GPU {gpu.index} is already in group {owner[gpu.uuid]}",
                        f"{key}.gpus[{i}]",
                    )
                owner[gpu.uuid] = gc.name
                members[gpu.uuid] = gpu
        ordered = sorted(members.values(), key=lambda g: g.index)
        if not ordered:
            continue  # "all" on a node where every GPU is in MIG mode
        own = _Level(key, gc.replicas, gc.active_thread_percentage, gc.pinned_memory_limit)
        pct, pinned = _share(ordered, [own, top], source)
        groups.append(
            Group(
                gc.name,
                tuple(GroupGpu(g.index, g.uuid, g.memory_total) for g in ordered),
                pct,
                pinned,
            )
        )
    singles: dict[str, Gpu] = {}
    for i, gpu_id in enumerate(mps.gpus):
        for gpu in _resolve_id(gpu_id, inventory, source, f"mps.gpus[{i}]"):
            if gpu.uuid not in owner:
                singles[gpu.uuid] = gpu
    for gpu in singles.values():
        pct, pinned = _share([gpu], [top], source)
        groups.append(
            Group(
                _auto_name(gpu.index),
                (GroupGpu(gpu.index, gpu.uuid, gpu.memory_total),),
                pct,
                pinned,
            )
        )
    return tuple(sorted(groups, key=lambda g: g.gpus[0].index))


# --- what one container gets -------------------------------------------------------------------


class MpsDevice(Frozen):
    """One shared GPU of a container: its index in the container's view, the pinned limit its
    processes start with (``pinned``, the env), and what the container is admitted with
    (``reserved``: the group's share, the daemon's default that a process may raise its own
    limit up to; 0 when the group has no share: nothing is enforced, nothing reserved)."""

    container_index: int
    gpu_index: int
    uuid: str
    memory_total: int
    pinned: int
    source: str
    reserved: int


class MpsPlan(Frozen):
    """What an MPS client container gets: the group's pipe directory, and its limits; and who
    its process is (``client``: MPS starts a server per uid)."""

    group: str
    pipe_dir: str  # host
    log_dir: str  # host; "" when not exposed
    shm: str  # host; "" when not mounted
    percentage: int
    percentage_source: str
    devices: tuple[MpsDevice, ...]
    client: Client = ROOT_CLIENT

    @property
    def pinned_value(self) -> str:
        return ",".join(f"{d.container_index}={mps_size(d.pinned)}" for d in self.devices)

    def env(self) -> tuple[str, ...]:
        out = [f"{ENV_PIPE}={PIPE_IN_CONTAINER}"]
        if self.log_dir:
            out.append(f"{ENV_LOG}={LOG_IN_CONTAINER}")
        out.append(f"{ENV_PERCENTAGE}={self.percentage}")
        out.append(f"{ENV_PINNED}={self.pinned_value}")
        return tuple(out)

    def mounts(self) -> tuple[Mount, ...]:
        out = [Mount(self.pipe_dir, PIPE_IN_CONTAINER, "bind", PIPE_OPTIONS)]
        if self.log_dir:
            out.append(Mount(self.log_dir, LOG_IN_CONTAINER, "bind", LOG_OPTIONS))
        if self.shm:
            out.append(Mount(self.shm, SHM_IN_CONTAINER, "bind", SHM_OPTIONS))
        return tuple(out)

    def replace_mounts(self) -> tuple[str, ...]:
        """The container's own mounts to drop: its /dev/shm when the MPS shm replaces it."""
        return (SHM_IN_CONTAINER,) if self.shm else ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "pipe_dir": self.pipe_dir,
            "container_pipe_dir": PIPE_IN_CONTAINER,
            "log_dir": self.log_dir or None,
            "shm": self.shm or None,
            "active_thread_percentage": {
                "value": self.percentage,
                "source": self.percentage_source,
            },
            "pinned_memory_limits": [
                {
                    "index": d.container_index,
                    "gpu": d.gpu_index,
                    "uuid": d.uuid,
                    "bytes": d.pinned,
                    "limit": mps_size(d.pinned),
                    "source": d.source,
                    "reserved": d.reserved,
                }
                for d in self.devices
            ],
            "client_uid": self.client.uid,
            "per_process": PER_PROCESS,
            "env": list(self.env()),
        }


PER_PROCESS = (
    "MPS applies these limits to each CUDA process of the container (each is an MPS client): "
    "two processes can each use them, and a process may raise its own limits up to the "
    "daemon's defaults (the group's share); the container is reserved the share once"
)


def plan(
    decision: Decision,
    inventory: Inventory,
    mps: MpsConfig,
    source: str,
    request: Request,
    client: Client = ROOT_CLIENT,
) -> MpsPlan | None:
    """The MPS plan for a decision; None when it grants no MPS-shared GPU or no ``compute``
    capability (a utility-only container, such as a GPU monitor, runs no CUDA). Raises
    :class:`RequestError` (one line) when the grant cannot be served by one daemon or an
    annotation is malformed or wider than the share, :class:`ConfigError` for a config that does
    not fit the node."""
    if not decision.devices or "compute" not in decision.capabilities:
        return None  # no CUDA without the compute libraries: not an MPS client (e.g. monitoring)
    group = _served_group(decision, resolve_groups(mps, inventory, source))
    if group is None:
        return None
    percentage, percentage_source = _percentage(group, request.annotation(ANN_PERCENTAGE))
    asked = _pinned_annotation(request.annotation(ANN_PINNED), len(group.gpus))
    devices = [
        _device(i, gpu, share, asked.get(i))
        for i, (gpu, share) in enumerate(zip(group.gpus, group.pinned, strict=True))
    ]
    return MpsPlan(
        group.name,
        group.pipe_dir(mps.root),
        group.log_dir(mps.root) if mps.log_dir else "",
        group.shm_dir(mps.root) if mps.shm else "",
        percentage if percentage is not None else 100,
        percentage_source if percentage is not None else "no share configured",
        tuple(devices),
        client,
    )


def _served_group(decision: Decision, groups: tuple[Group, ...]) -> Group | None:
    """The one group whose daemon serves every granted device; None when none is shared.
    Raises :class:`RequestError` when one daemon cannot serve exactly the grant."""
    group_of = {gpu.uuid: g for g in groups for gpu in g.gpus}
    shared = [d for d in decision.devices if d.kind == KIND_GPU and d.uuid in group_of]
    if not shared:
        return None
    unshared = [d for d in decision.devices if d not in shared]
    if unshared:
        raise RequestError(
            f"GPU {shared[0].display_id} is MPS-shared (group {group_of[shared[0].uuid].name}) "
            f"but {_kind(unshared[0].display_id, unshared[0].kind)} is not; an MPS client "
            "reaches only its daemon's GPUs: request them in separate containers, or share "
            "them all in one group (mps.groups)"
        )
    names = sorted({group_of[d.uuid].name for d in shared})
    if len(names) > 1:
        raise RequestError(
            f"GPUs {','.join(d.display_id for d in shared)} are MPS-shared by different control "
            f"daemons (groups {', '.join(names)}) and a CUDA process talks to one: put them in "
            "one group (mps.groups) or request one of them"
        )
    group = group_of[shared[0].uuid]
    if {d.uuid for d in shared} != {g.uuid for g in group.gpus}:
        raise RequestError(
            f"GPU {shared[0].display_id} is MPS-shared in group {group.name} with GPUs "
            f"{group.indices}, and an MPS client reaches every GPU of its daemon: request all "
            f"of GPUs {group.indices}, or give GPU {shared[0].display_id} its own group"
        )
    return group


def _percentage(group: Group, raw: str | None) -> tuple[int | None, str]:
    """The active thread percentage and its source: the annotation's, which may only lower
    the group's share, else the share."""
    percentage, percentage_source = group.percentage.value, group.percentage.source
    if raw is None:
        return percentage, percentage_source
    text = raw.strip()
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise RequestError(
            f"annotation {ANN_PERCENTAGE}: {raw!r} is not a percentage from 1 to 100"
        )
    if percentage is not None and int(text) > percentage:
        raise RequestError(
            f"annotation {ANN_PERCENTAGE}: {int(text)} is more than the share of MPS group "
            f"{group.name} ({percentage}, {percentage_source}); an annotation may only "
            "lower it"
        )
    return int(text), f"annotation {ANN_PERCENTAGE}"


def _device(i: int, gpu: GroupGpu, share: Share, asked: int | None) -> MpsDevice:
    """The pinned memory limit of the container's device ``i``: the annotation's (at most the
    share and the GPU's memory), else the share, else the whole GPU. Reserved: the share
    (0 without one), whatever the annotation."""
    reserved = share.value or 0
    if asked is None:
        if share.value is not None:
            return MpsDevice(
                i, gpu.index, gpu.uuid, gpu.memory_total, share.value, share.source, reserved
            )
        whole = gpu.memory_total // MIB * MIB
        why = "no share configured (the whole GPU)"
        return MpsDevice(i, gpu.index, gpu.uuid, gpu.memory_total, whole, why, 0)
    value = asked // MIB * MIB
    if value > gpu.memory_total:
        raise RequestError(
            f"annotation {ANN_PINNED}: {format_size(value)} for device {i} is more than "
            f"the memory of GPU {gpu.index} ({format_size(gpu.memory_total)})"
        )
    if share.value is not None and value > share.value:
        raise RequestError(
            f"annotation {ANN_PINNED}: {format_size(value)} for device {i} is more than "
            f"the share of GPU {gpu.index} ({format_size(share.value)}, {share.source}); "
            "an annotation may only lower it"
        )
    source = f"annotation {ANN_PINNED}"
    return MpsDevice(i, gpu.index, gpu.uuid, gpu.memory_total, value, source, reserved)


def _kind(display_id: str, kind: str) -> str:
    return f"MIG device {display_id}" if kind != KIND_GPU else f"GPU {display_id}"


def _pinned_annotation(raw: str | None, count: int) -> dict[int, int]:
    """``20G`` (every device) or ``0=20G,1=10G`` (container device indices) -> {index: bytes}."""
    if raw is None:
        return {}
    text = raw.strip()
    try:
        if "=" not in text:
            size = parse_size(text)
            return dict.fromkeys(range(count), size)
        out: dict[int, int] = {}
        for entry in text.split(","):
            index_text, eq, size_text = entry.strip().partition("=")
            index_text = index_text.strip()
            if not eq or not index_text.isdigit():
                raise ValueError(f"{entry.strip()!r} is not <device index>=<size>")
            index = int(index_text)
            if index >= count:
                raise ValueError(
                    f"device index {index} is not one of the container's MPS devices "
                    f"(0..{count - 1})"
                )
            if index in out:
                raise ValueError(f"device index {index} is given twice")
            out[index] = parse_size(size_text)
        return out
    except ValueError as exc:
        raise RequestError(f"annotation {ANN_PINNED}: {exc}") from None

"""Decision x Inventory -> :class:`ContainerEdits` (pure): what exactly to inject.

A granted container gets: the control device nodes of its capabilities and the nodes of its GPUs
(a MIG device also its parent GPU's node and its nvidia-caps nodes), each with a cgroup allow
rule; the driver files of its capabilities (:mod:`gpuhook.pipeline.driverfiles`: libraries in
``inject.lib_dir`` with the driver's development links, binaries, firmware, IPC sockets, graphics
loader files); a createContainer hook that makes those links and refreshes the container's
ld.so.cache, with the image's CUDA forward compatibility folder first when it is used
(:mod:`gpuhook.pipeline.compat`); ``NVIDIA_VISIBLE_DEVICES`` set to what was granted; and, for
MPS-shared GPUs, the edits of the :class:`gpuhook.pipeline.sharing.MpsPlan` (pipe directory
mount, MPS env, shm mount). A refused request gets ``NVIDIA_VISIBLE_DEVICES=void`` so that no
other NVIDIA component acts on it.
"""

from __future__ import annotations

from gpuhook.model.decision import CHANNEL_ENGINE, KIND_MIG
from gpuhook.model.edits import ContainerEdits, Hook
from gpuhook.pipeline import driverfiles
from gpuhook.pipeline.request import ENV_CAPS, ENV_VISIBLE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.decision import Decision, DeviceRef
    from gpuhook.model.inventory import DeviceNode, Gpu, Inventory
    from gpuhook.pipeline.compat import CompatChoice
    from gpuhook.pipeline.sharing import MpsPlan

HOOK_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)
HOOK_TIMEOUT_S = 30
HOOK_COMMAND = "hook"  # `gpuhook hook VERB`, `gpuhook-runtime hook VERB`
LDCACHE_VERB = "update-ldcache"
# The hook's programs: the gpuhook CLI (hook.path), and the static dispatcher installed beside
# it, which runs the hook's --rootfs form itself (no shell, no Python).
CLI_PROGRAM = "gpuhook"
RUNTIME_PROGRAM = "gpuhook-runtime"


class MissingDevice(Exception):
    """A granted device whose node is missing on the host; ``str()`` is one line."""


def visible_value(decision: Decision) -> str | None:
    """The NVIDIA_VISIBLE_DEVICES the container gets, None to leave the spec's value alone."""
    if not decision.gpu_container:
        return None
    if decision.devices:
        return ",".join(d.uuid for d in decision.devices)
    if decision.driver_only:
        return "none"
    return "void"


def edits_for(
    decision: Decision,
    inventory: Inventory | None,
    config: Config,
    nvidia_hooks: tuple[str, ...] = (),
    mps: MpsPlan | None = None,
    rootfs: str = "",
    spec: Mapping[str, Any] | None = None,
    compat: CompatChoice | None = None,
) -> ContainerEdits:
    """The edits for a decision. ``inventory`` may be None when nothing is injected. ``mps``:
    the MPS plan of a container granted MPS-shared GPUs (pipe directory, env, shm). ``rootfs``:
    the container's absolute rootfs, given to the ld.so.cache hook when known. ``spec``: the
    container's spec; what the engine already put there (from a CDI spec: a device node at its
    path or with its device number) is not added a second time, and the granted devices whose
    nodes it holds are named in ``engine_injected``.
    ``nvidia_hooks``: NVIDIA's prestart hooks in the spec, removed whatever the decision.
    ``compat``: the CUDA forward compatibility decision for the image (its folder goes first)."""
    visible = visible_value(decision)
    env = [f"{ENV_VISIBLE}={visible}"] if visible is not None else []
    remove = nvidia_hooks
    if decision.channel == CHANNEL_ENGINE:  # the engine's GPUs alone: it injected what they need
        return _engine_only(decision, env, remove, spec, mps)
    if not decision.injects or inventory is None:
        return ContainerEdits(env=tuple(env), remove_hooks=remove)
    env.append(f"{ENV_CAPS}={','.join(decision.capabilities)}")
    caps = frozenset(decision.capabilities)
    nodes = _unique_nodes(
        [*driverfiles.control_nodes(inventory, caps), *granted_nodes(decision, inventory, config)]
    )
    files = driverfiles.driver_files(inventory, config, caps, _env_of(spec))
    folders = list(files.folders)
    notes = files.notes
    if compat is not None:
        folders = ([compat.folder] if compat.folder and folders else []) + folders
        notes += (compat.note,)
    hook = ldcache_hook(config, folders, rootfs, files.links, caches=files.caches)
    hooks = [hook] if folders else []
    edits = ContainerEdits(
        env=tuple(env) + files.env + (mps.env() if mps is not None else ()),
        device_nodes=tuple(nodes),
        mounts=files.mounts + (mps.mounts() if mps is not None else ()),
        hooks=tuple(hooks),
        remove_hooks=remove,
        replace_mounts=mps.replace_mounts() if mps is not None else (),
        notes=notes,
    )
    return edits if spec is None else without_present(edits, decision, inventory, config, spec)


def _engine_only(
    decision: Decision,
    env: list[str],
    remove: tuple[str, ...],
    spec: Mapping[str, Any] | None,
    mps: MpsPlan | None,
) -> ContainerEdits:
    """No device node, driver file or hook: only ``NVIDIA_VISIBLE_DEVICES``, set to the engine's
    GPUs where the spec names any (the image's ``all``, a CDI spec's ``void``), NVIDIA's
    prestart hooks removed, and for an MPS-shared GPU (a shared DRA claim's) what no CDI spec
    gives: the MPS client's pipe folder, env and limits."""
    named = any(e.startswith(f"{ENV_VISIBLE}=") for e in _env_of(spec))
    return ContainerEdits(
        env=(tuple(env) if named else ()) + (mps.env() if mps is not None else ()),
        mounts=mps.mounts() if mps is not None else (),
        remove_hooks=remove,
        replace_mounts=mps.replace_mounts() if mps is not None else (),
        engine_injected=tuple(d.uuid for d in decision.devices),
    )


def _env_of(spec: Mapping[str, Any] | None) -> list[str]:
    process = spec.get("process") if spec is not None else None
    env = process.get("env") if isinstance(process, dict) else None
    return [e for e in env if isinstance(e, str)] if isinstance(env, list) else []


def granted_nodes(decision: Decision, inventory: Inventory, config: Config) -> list[DeviceNode]:
    """The device nodes of the granted devices (a MIG device: its GPU's node and caps nodes).
    Raises :class:`MissingDevice`."""
    by_index = {g.index: g for g in inventory.gpus}
    return [n for ref in decision.devices for n in _ref_nodes(ref, by_index, config)]


def _ref_nodes(ref: DeviceRef, by_index: Mapping[int, Gpu], config: Config) -> list[DeviceNode]:
    """The device nodes of one granted device. Raises :class:`MissingDevice`."""
    gpu = by_index.get(ref.gpu_index)
    if gpu is None or gpu.node is None:
        raise MissingDevice(
            f"device node /dev/nvidia for GPU {ref.gpu_index} ({ref.uuid}) "
            f"is missing under {config.dev_root}"
        )
    if ref.kind != KIND_MIG:
        return [gpu.node]
    mig = gpu.mig_by_uuid(ref.uuid)
    if mig is None or len(mig.caps) < 2:
        raise MissingDevice(
            f"the nvidia-caps device nodes of MIG device {ref.display_id} ({ref.uuid}) are missing"
        )
    return [gpu.node, *mig.caps]


def ldcache_hook(
    config: Config,
    folders: Sequence[str],
    rootfs: str = "",
    links: Sequence[str] = (),
    cuda_compat: str = "",
    caches: Sequence[str] = (),
) -> Hook:
    """gpuhook's createContainer hook that makes the driver's ``links`` (``LINK=TARGET``) and
    refreshes the container's ld.so.cache over ``folders`` (in that order: the first wins).
    ``cuda_compat`` (``DRIVER_VERSION:BRANDS``): the hook decides about the image's forward
    compatibility libraries itself (the CDI spec, written before any image is known).
    ``caches`` (``FOLDER=DIR``): the prepared ldconfig entries of a folder, read instead of
    running ldconfig there (:mod:`gpuhook.pipeline.driverfiles`).

    With the container's ``rootfs`` (except at log level debug, where the hook runs in Python,
    which logs every refresh) the hook's program is the static gpuhook-runtime installed beside
    ``hook.path``'s gpuhook: it runs that form without a shell or Python."""
    with_rootfs = bool(rootfs) and config.log_level != "debug"
    path = ldcache_program(config, with_rootfs)
    args = [path.rsplit("/", 1)[-1], HOOK_COMMAND, LDCACHE_VERB, "--ldconfig", config.ldconfig]
    if with_rootfs:
        args += ["--rootfs", rootfs]
    for folder in folders:
        args += ["--folder", folder]
    for link in links:
        args += ["--link", link]
    for cache in caches:
        args += ["--cache", cache]
    if cuda_compat:
        args += ["--cuda-compat", cuda_compat]
    env = HOOK_ENV + config.propagated_env
    return Hook("createContainer", path, tuple(args), env, HOOK_TIMEOUT_S)


def ldcache_program(config: Config, with_rootfs: bool) -> str:
    """The ldcache hook's program: for the form with ``--rootfs``, the gpuhook-runtime beside
    ``hook.path`` when that is gpuhook's CLI (the static dispatcher runs that form itself; a pip
    install's gpuhook-runtime hands it to Python); else ``hook.path``."""
    path = config.hook_path
    folder, _, name = path.rpartition("/")
    return f"{folder}/{RUNTIME_PROGRAM}" if with_rootfs and name == CLI_PROGRAM else path


def without_present(
    edits: ContainerEdits,
    decision: Decision,
    inventory: Inventory,
    config: Config,
    spec: Mapping[str, Any],
) -> ContainerEdits:
    """``edits`` less what the spec already holds, by apply's own rules (a device node path, a
    mount destination; gpuhook's ld.so.cache hook; a device node's number), with
    ``engine_injected``: the granted devices whose nodes' numbers are all there. Raises
    :class:`MissingDevice` as :func:`granted_nodes` does."""
    from gpuhook.pipeline.apply import device_paths, taken_destinations

    present = _spec_nodes(spec)
    numbers = {(major, minor) for _, major, minor in present}
    linux = spec.get("linux")
    paths = device_paths(linux.get("devices") if isinstance(linux, dict) else None)
    taken = taken_destinations(spec.get("mounts"), edits)
    has_hook = _has_ldcache_hook(spec)
    by_index = {g.index: g for g in inventory.gpus}
    injected = tuple(
        ref.uuid
        for ref in decision.devices
        if all((n.major, n.minor) in numbers for n in _ref_nodes(ref, by_index, config))
    )
    return ContainerEdits(
        env=edits.env,
        device_nodes=tuple(  # a node the engine put at another path is not injected twice
            n
            for n in edits.device_nodes
            if n.path not in paths and (n.major, n.minor) not in numbers
        ),
        mounts=tuple(m for m in edits.mounts if m.container_path not in taken),
        hooks=tuple(h for h in edits.hooks if not (has_hook and _is_ldcache_hook(h.args))),
        remove_hooks=edits.remove_hooks,
        replace_mounts=edits.replace_mounts,
        engine_injected=injected,
        notes=edits.notes,
    )


def _spec_nodes(spec: Mapping[str, Any]) -> set[tuple[Any, Any, Any]]:
    linux = spec.get("linux")
    devices = linux.get("devices") if isinstance(linux, dict) else None
    return {
        (d["path"], d.get("major"), d.get("minor"))
        for d in (devices if isinstance(devices, list) else ())
        if isinstance(d, dict)
        and isinstance(d.get("path"), str)
        and isinstance(d.get("major"), int)
        and isinstance(d.get("minor"), int)
    }


def _is_ldcache_hook(args: Any) -> bool:
    return isinstance(args, (list, tuple)) and tuple(args[1:3]) == (HOOK_COMMAND, LDCACHE_VERB)


def _has_ldcache_hook(spec: Mapping[str, Any]) -> bool:
    hooks = spec.get("hooks")
    entries = hooks.get("createContainer") if isinstance(hooks, dict) else None
    return any(
        isinstance(h, dict) and _is_ldcache_hook(h.get("args"))
        for h in (entries if isinstance(entries, list) else ())
    )


def _unique_nodes(nodes: list[DeviceNode]) -> list[DeviceNode]:
    seen: set[str] = set()
    out = []
    for node in nodes:
        if node.path not in seen:
            seen.add(node.path)
            out.append(node)
    return out

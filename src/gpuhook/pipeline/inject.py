"""Decision x Inventory -> :class:`ContainerEdits` (pure): what exactly to inject.

A granted container gets: the control device nodes and the nodes of its GPUs (a MIG device also
its parent GPU's node and its nvidia-caps nodes), each with a cgroup allow rule; the driver
libraries of its capabilities, bind-mounted read-only under their real names and their sonames
into ``inject.lib_dir`` (a tmpfs, so nothing is written into the image's layer); the driver
binaries of its capabilities; the firmware and IPC sockets; a createContainer hook that refreshes
the container's ld.so.cache; ``NVIDIA_VISIBLE_DEVICES`` set to what was granted; and, for
MPS-shared GPUs, the edits of the :class:`gpuhook.pipeline.sharing.MpsPlan` (pipe directory mount,
MPS
env, shm mount). A refused request gets ``NVIDIA_VISIBLE_DEVICES=void`` so that no other NVIDIA
component acts on it.
"""

from __future__ import annotations

from gpuhook.model.decision import KIND_MIG
from gpuhook.model.edits import ContainerEdits, Hook, Mount
from gpuhook.pipeline.request import DOCKER_HOOK, ENV_CAPS, ENV_VISIBLE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuhook.config import Config
    from gpuhook.model.decision import Decision
    from gpuhook.model.inventory import DeviceNode, Inventory
    from gpuhook.pipeline.sharing import MpsPlan

RO_BIND = ("ro", "nosuid", "nodev", "bind")
HOOK_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)
HOOK_TIMEOUT_S = 30


class MissingDevice(Exception):
    """A granted device whose node is missing on the host; ``str()`` is one line."""


def compat32_dir(lib_dir: str) -> str:
    return lib_dir.rstrip("/") + "32"


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
    docker_hook: bool = False,
    mps: MpsPlan | None = None,
    rootfs: str = "",
) -> ContainerEdits:
    """The edits for a decision. ``inventory`` may be None when nothing is injected. ``mps``:
    the MPS plan of a container granted MPS-shared GPUs (pipe directory, env, shm). ``rootfs``:
    the container's absolute rootfs, given to the ld.so.cache hook when known."""
    visible = visible_value(decision)
    env = [f"{ENV_VISIBLE}={visible}"] if visible is not None else []
    remove = (DOCKER_HOOK,) if docker_hook else ()
    if not decision.injects or inventory is None:
        return ContainerEdits(env=tuple(env), remove_hooks=remove)
    env.append(f"{ENV_CAPS}={','.join(decision.capabilities)}")
    caps = set(decision.capabilities)

    nodes: list[DeviceNode] = list(inventory.control_nodes)
    by_index = {g.index: g for g in inventory.gpus}
    for ref in decision.devices:
        gpu = by_index.get(ref.gpu_index)
        if gpu is None or gpu.node is None:
            raise MissingDevice(
                f"device node /dev/nvidia for GPU {ref.gpu_index} ({ref.uuid}) "
                f"is missing under {config.dev_root}"
            )
        nodes.append(gpu.node)
        if ref.kind == KIND_MIG:
            mig = gpu.mig_by_uuid(ref.uuid)
            if mig is None or len(mig.caps) < 2:
                raise MissingDevice(
                    f"the nvidia-caps device nodes of MIG device "
                    f"{ref.display_id} ({ref.uuid}) are missing"
                )
            nodes.extend(mig.caps)
    nodes = _unique_nodes(nodes)

    mounts: list[Mount] = []
    lib_dir = config.lib_dir.rstrip("/") or "/"
    libs64 = [
        lib
        for lib in inventory.libraries
        if lib.capability in caps and lib.capability != "compat32"
    ]
    libs32 = (
        [lib for lib in inventory.libraries if lib.capability == "compat32"]
        if "compat32" in caps
        else []
    )
    folders = []
    for folder, libs in ((lib_dir, libs64), (compat32_dir(lib_dir), libs32)):
        if not libs:
            continue
        folders.append(folder)
        mounts.append(Mount("tmpfs", folder, "tmpfs", ("nosuid", "nodev", "mode=755")))
        for lib in sorted(libs, key=lambda x: x.name):
            names = [lib.name] if lib.soname == lib.name else [lib.name, lib.soname]
            for name in names:
                mounts.append(Mount(lib.path, f"{folder}/{name}", "bind", RO_BIND))
    bin_dir = config.bin_dir.rstrip("/") or "/"
    for f in inventory.files:
        if f.capability not in caps and not (
            f.kind == "firmware" and caps & {"compute", "utility"}
        ):
            continue
        if f.kind == "binary":
            mounts.append(Mount(f.path, f"{bin_dir}/{f.name}", "bind", RO_BIND))
        elif f.kind == "firmware":
            mounts.append(Mount(f.path, f.container_path, "bind", RO_BIND))
        elif f.kind == "socket":
            mounts.append(
                Mount(f.path, f.container_path, "bind", ("nosuid", "nodev", "noexec", "bind"))
            )

    hooks: list[Hook] = []
    if folders:
        args = [
            config.hook_path.rsplit("/", 1)[-1],
            "hook",
            "update-ldcache",
            "--ldconfig",
            config.ldconfig,
        ]
        if rootfs and config.log_level != "debug":
            # The installed `gpuhook` dispatcher runs this form without Python; at debug level
            # the hook runs in Python, which logs every refresh.
            args += ["--rootfs", rootfs]
        for folder in folders:
            args += ["--folder", folder]
        hooks.append(
            Hook(
                "createContainer",
                config.hook_path,
                tuple(args),
                HOOK_ENV + config.propagated_env,
                HOOK_TIMEOUT_S,
            )
        )
    replace: tuple[str, ...] = ()
    if mps is not None:
        env.extend(mps.env())
        mounts.extend(mps.mounts())
        replace = mps.replace_mounts()
    return ContainerEdits(
        env=tuple(env),
        device_nodes=tuple(nodes),
        mounts=tuple(mounts),
        hooks=tuple(hooks),
        remove_hooks=remove,
        replace_mounts=replace,
    )


def _unique_nodes(nodes: list[DeviceNode]) -> list[DeviceNode]:
    seen: set[str] = set()
    out = []
    for node in nodes:
        if node.path not in seen:
            seen.add(node.path)
            out.append(node)
    return out

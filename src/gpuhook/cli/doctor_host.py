"""doctor's checks of the node's shared state: CUDA MPS, the state and log folders, the kubelet
checkpoint."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gpuhook import _fastjson
from gpuhook.cli.doctor_check import FAIL, PASS, SKIP, WARN, Node, Result, section
from gpuhook.errors import CheckpointError, GpuhookError
from gpuhook.mps import admission, daemons
from gpuhook.pipeline import kubelet, sharing

if TYPE_CHECKING:
    from gpuhook.config.types import Config

register = section()


@register("mps")
def check_mps(node: Node) -> list[Result]:
    """The control daemon of every MPS share group (a container granted a GPU of a group whose
    daemon is down fails to start), and the compute mode of its GPUs."""
    config = node.need_config()
    if not config.mps.enabled:
        return [Result("mps", SKIP, "MPS not configured (no mps.gpus or mps.groups)")]
    inventory = node.inventory()
    if inventory is None:
        return [Result("mps", SKIP, "no inventory: the MPS share groups cannot be resolved")]
    try:
        groups = sharing.resolve_groups(config.mps, inventory, config.source)
    except GpuhookError as exc:
        return [Result("mps", FAIL, str(exc), f"fix mps.* in {config.source}")]
    results = [r for group in groups for r in _mps_group(config, group)]
    if not config.mps.exclusive_process:
        results.append(
            Result(
                "mps",
                WARN,
                "mps.exclusive_process is false: the MPS-shared GPUs stay in DEFAULT compute "
                "mode, so a tenant that unsets CUDA_MPS_PIPE_DIRECTORY leaves MPS and gets the "
                "whole GPU (all its SMs and memory, outside its limits)",
                f"set mps.exclusive_process: true in {config.source}, then: gpuhook mps start",
            )
        )
    return results


def _mps_group(config: Config, group: Any) -> list[Result]:
    pipe = group.pipe_dir(config.mps.root)
    pid = daemons.control_pid(pipe)
    what = f"MPS control daemon of group {group.name} (GPU {group.indices})"
    if pid is None:
        result = Result(
            "mps",
            FAIL,
            f"{what} is down ({pipe}); containers granted these GPUs are refused",
            f"gpuhook mps start {group.name} (or: systemctl start gpuhook-mps@{group.name})",
        )
    else:
        result = Result("mps", PASS, f"{what} running, pid {pid}")
    results = [result]
    blocked = admission.unsearchable(pipe)
    if blocked:
        results.append(Result("mps", WARN, admission.non_root_warning(group.name, blocked)))
    try:
        modes = daemons.compute_modes(config, group)
    except GpuhookError as exc:
        return [*results, Result("mps", WARN, f"compute mode of group {group.name}: {exc}")]
    problem = daemons.mode_problem(group.name, pid is not None, config.mps.exclusive_process, modes)
    if problem is not None:
        results.append(Result("mps", WARN, problem[0], problem[1]))
    return results


def _writable(folder: str) -> str:
    """Why files cannot be created in ``folder`` (nor it be created); "" when they can."""
    if os.path.isdir(folder):
        probe = os.path.join(folder, f".gpuhook-doctor-{os.getpid()}")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            return f"cannot create files in {folder}: {exc.strerror}"
        return ""
    parent = folder
    while True:
        parent = os.path.dirname(parent)
        if os.path.lexists(parent) or parent in ("/", ""):
            break
    if not os.path.isdir(parent):
        return f"{folder} cannot be created: {parent} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{folder} does not exist and {parent} is not writable"
    return ""


@register("state dir")
def check_state_dir(node: Node) -> Result:
    config = node.need_config()
    for folder in (config.state_dir, config.records_dir):
        problem = _writable(folder)
        if problem:
            return Result(
                "state dir",
                FAIL,
                f"{problem}: no decision records are written (containers still start)",
                f"make {config.state_dir} a writable folder, or set state_dir in {config.source}",
            )
    return Result("state dir", PASS, f"{config.state_dir} is writable (inventory, containers/)")


@register("log dir")
def check_log_dir(node: Node) -> Result:
    config = node.need_config()
    if not config.log_file:
        return Result("log dir", SKIP, "log.file is empty: gpuhook writes no log file")
    folder = os.path.dirname(config.log_file)
    fix = f"make {folder} writable, or set log.file in {config.source}"
    problem = _writable(folder)
    if not problem and os.path.lexists(config.log_file):
        try:
            fd = os.open(config.log_file, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
            os.close(fd)
        except OSError as exc:
            problem = f"cannot append to {config.log_file}: {exc.strerror}"
    if problem:
        return Result("log dir", FAIL, f"{problem}: log events are lost", fix)
    return Result("log dir", PASS, f"{config.log_file} is writable")


@register("kubelet checkpoint")
def check_kubelet(node: Node) -> Result:
    config = node.need_config()
    name = "kubelet checkpoint"
    path = config.policy.checkpoint
    kubelet_dir = os.path.dirname(os.path.dirname(path))
    if not (os.path.lexists(path) or os.path.isdir(kubelet_dir)):
        return Result(name, SKIP, f"Kubernetes not detected ({kubelet_dir} not found)")
    mode = config.policy.kubernetes_env_requests
    if mode != "verify":
        return Result(name, SKIP, f"not used: policy.kubernetes.env_requests is {mode}")
    fix = (
        f"check policy.kubernetes.checkpoint in {config.source} and that the kubelet's device "
        "manager runs; until then Kubernetes env requests are refused"
    )
    try:
        with open(path, "rb") as fh:
            raw = fh.read(kubelet.MAX_CHECKPOINT_BYTES + 1)
        kubelet.allocation_from_bytes(raw, path, "", "")
    except FileNotFoundError:
        return Result(name, FAIL, f"{path} not found (Kubernetes detected: {kubelet_dir})", fix)
    except OSError as exc:
        return Result(name, FAIL, f"{path} unreadable: {exc.strerror}", fix)
    except CheckpointError as exc:
        return Result(name, FAIL, str(exc), fix)
    doc: Any = _fastjson.loads(raw)
    entries = doc["Data"].get("PodDeviceEntries") or []
    gpu = sum(
        1
        for e in entries
        if str(e.get("ResourceName", "")).startswith(kubelet.NVIDIA_RESOURCE_PREFIX)
    )
    return Result(name, PASS, f"{path} is readable ({gpu} nvidia.com/* allocations)")


# The DRA state check follows this module's (imported here so that it is last whatever the order).
from gpuhook.cli import doctor_dra  # noqa: E402, F401

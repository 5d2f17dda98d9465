"""The validated configuration as values: :class:`Config` and its parts (frozen), and the
names every executable shares: the default file, ``GPUHOOK_CONFIG``, ``GPUHOOK_DEBUG`` and
``GPUHOOK_CACHE_DIR`` (where the compiled config is cached: :mod:`gpuhook.config.cache`).

Pure: reading the file is :mod:`gpuhook.config.loading`'s. The pipeline imports this module.
"""

from __future__ import annotations

import os

from gpuhook.model.frozen import Frozen, _init

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DEFAULT_PATH = "/etc/gpuhook/config.yaml"
ENV_CONFIG = "GPUHOOK_CONFIG"
ENV_DEBUG = "GPUHOOK_DEBUG"
ENV_CACHE_DIR = "GPUHOOK_CACHE_DIR"
KUBELET_DIR_DEFAULT = "/var/lib/kubelet"
CHECKPOINT_IN_KUBELET_DIR = "device-plugins/kubelet_internal_checkpoint"
# The device plugin's GPU resources: whole GPUs, their shared (time-slicing, MPS) renames and MIG
# profiles. A name ending in "*" matches every name it begins. Other resources of the checkpoint
# (nvidia.com/rdma_shared_device_a, say) are never GPUs.
GPU_RESOURCES_DEFAULT = ("nvidia.com/gpu", "nvidia.com/gpu.*", "nvidia.com/mig-*")
# The CDI kinds (vendor/class) whose devices are GPUs: gpuhook's and NVIDIA's toolkit's
# (nvidia.com), and NVIDIA's device plugin's (k8s.device-plugin.nvidia.com, its cdi-annotations
# and cdi-cri strategies), each with its MIG class. Other kinds are left to their CDI handler.
CDI_KINDS_DEFAULT = (
    "nvidia.com/gpu",
    "nvidia.com/mig",
    "k8s.device-plugin.nvidia.com/gpu",
    "k8s.device-plugin.nvidia.com/mig",
)
# GPU device nodes the engine injected (from a CDI spec) into an unprivileged Kubernetes
# container that no allocation covers: refuse the create (verify) or record them (allow).
ENGINE_DEVICES = ("verify", "allow")


class PolicyConfig(Frozen):
    """``policy.*``. ``checkpoint`` is the kubelet checkpoint's path: the configured one, or
    ``<kubelet_dir>/device-plugins/kubelet_internal_checkpoint`` when the key is empty."""

    kubernetes_env_requests: str
    checkpoint: str
    standalone_env_requests: str
    kubelet_dir: str
    gpu_resources: tuple[str, ...]
    cdi_kinds: tuple[str, ...]
    engine_devices: str

    def __init__(
        self,
        kubernetes_env_requests: str,
        checkpoint: str,
        standalone_env_requests: str,
        kubelet_dir: str = KUBELET_DIR_DEFAULT,
        gpu_resources: tuple[str, ...] = GPU_RESOURCES_DEFAULT,
        cdi_kinds: tuple[str, ...] = CDI_KINDS_DEFAULT,
        engine_devices: str = "verify",
    ) -> None:
        _init(
            self,
            kubernetes_env_requests=kubernetes_env_requests,
            checkpoint=checkpoint or os.path.join(kubelet_dir, CHECKPOINT_IN_KUBELET_DIR),
            standalone_env_requests=standalone_env_requests,
            kubelet_dir=kubelet_dir,
            gpu_resources=tuple(gpu_resources),
            cdi_kinds=tuple(cdi_kinds),
            engine_devices=engine_devices,
        )

    def is_gpu_resource(self, name: str) -> bool:
        """Whether a device plugin resource of the checkpoint names GPUs (``gpu_resources``)."""
        return any(
            name.startswith(p[:-1]) if p.endswith("*") else name == p for p in self.gpu_resources
        )


class MpsGroupConfig(Frozen):
    """One ``mps.groups.<name>`` entry: GPUs served by one control daemon, with share overrides."""

    name: str
    gpus: tuple[str, ...]
    replicas: int | None
    active_thread_percentage: int | None
    pinned_memory_limit: str | None


class MpsConfig(Frozen):
    """``mps.*``: which GPUs are MPS-shared, their share, and how containers reach the daemons.

    GPU ids are kept as written (strings); :mod:`gpuhook.pipeline.sharing` resolves them against the
    inventory. ``enabled`` is False when no GPU is shared (the create path then never imports
    the sharing code).
    """

    root: str
    gpus: tuple[str, ...]
    groups: tuple[MpsGroupConfig, ...]
    replicas: int | None
    active_thread_percentage: int | None
    pinned_memory_limit: str | None
    oversubscription: str
    exclusive_process: bool
    log_dir: bool
    shm: str

    def __init__(self, data: Mapping[str, Any]) -> None:
        groups = data.get("groups") or {}
        _init(
            self,
            root=data["root"],
            gpus=tuple(str(g) for g in data["gpus"]),
            groups=tuple(
                MpsGroupConfig(
                    name,
                    tuple(str(g) for g in group["gpus"]),
                    group.get("replicas"),
                    group.get("active_thread_percentage"),
                    group.get("pinned_memory_limit"),
                )
                for name, group in groups.items()
            ),
            replicas=data["replicas"],
            active_thread_percentage=data["active_thread_percentage"],
            pinned_memory_limit=data["pinned_memory_limit"],
            oversubscription=data["oversubscription"],
            exclusive_process=data["exclusive_process"],
            log_dir=data["log_dir"],
            shm=data["shm"],
        )

    @property
    def enabled(self) -> bool:
        return bool(self.gpus or self.groups)


class Config(Frozen):
    """The validated configuration. ``data`` is the normalized nested form (defaults filled in)."""

    source: str
    data: dict[str, Any]
    driver_root: str
    dev_root: str
    state_dir: str
    runtime: str  # resolved absolute path, "" when not found
    service_socket: str  # the runtime service's socket, "" for none
    log_level: str
    log_file: str
    nvml_library: str
    inventory_path: str
    auto_refresh: bool
    lib_dir: str
    bin_dir: str
    default_capabilities: tuple[str, ...]
    ldconfig: str
    cdi_output: str  # "" when the inventory refresh writes no CDI spec
    cdi_capabilities: tuple[str, ...]
    policy: PolicyConfig
    mps: MpsConfig
    cache_dir_env: str  # GPUHOOK_CACHE_DIR as this process had it ("": the default folder)

    def __init__(self, source: str, data: dict[str, Any], runtime: str) -> None:
        inv = data["inventory"]
        pol = data["policy"]
        _init(
            self,
            source=source,
            data=data,
            driver_root=data["driver_root"],
            dev_root=data["dev_root"],
            state_dir=data["state_dir"],
            runtime=runtime,
            service_socket=data["runtime"]["service"],
            log_level="debug"
            if os.environ.get(ENV_DEBUG, "") not in ("", "0")
            else data["log"]["level"],
            log_file=data["log"]["file"],
            nvml_library=data["nvml"]["library"],
            inventory_path=inv["path"] or os.path.join(data["state_dir"], "inventory.json"),
            auto_refresh=inv["auto_refresh"],
            lib_dir=data["inject"]["lib_dir"],
            bin_dir=data["inject"]["bin_dir"],
            default_capabilities=tuple(data["inject"]["default_capabilities"]),
            ldconfig=data["hook"]["ldconfig"],
            cdi_output=data["cdi"]["output"],
            cdi_capabilities=tuple(data["cdi"]["capabilities"])
            or tuple(data["inject"]["default_capabilities"]),
            policy=PolicyConfig(
                pol["kubernetes"]["env_requests"],
                pol["kubernetes"]["checkpoint"],
                pol["standalone"]["env_requests"],
                pol["kubernetes"]["kubelet_dir"],
                tuple(pol["kubernetes"]["gpu_resources"]),
                tuple(pol["cdi_kinds"]),
                pol["kubernetes"]["engine_devices"],
            ),
            mps=MpsConfig(data["mps"]),
            cache_dir_env=os.environ.get(ENV_CACHE_DIR, ""),
        )

    @property
    def cuda_compat(self) -> bool:
        """``inject.cuda_compat``: use an image's CUDA forward compatibility libraries when they
        are newer than the host driver and support its branch and GPUs."""
        return bool(self.data["inject"]["cuda_compat"])

    @property
    def hook_path(self) -> str:
        """The hook's program (resolved when a hook is added, not at every load): ``hook.path``,
        else the ``gpuhook`` beside the running program (:mod:`gpuhook.runtime.locate`)."""
        if self.data["hook"]["path"]:
            return str(self.data["hook"]["path"])
        from gpuhook.runtime import locate

        return locate.default_hook_path()[0]

    @property
    def hook_path_source(self) -> str:
        """Why :attr:`hook_path` is what it is, for doctor."""
        if self.data["hook"]["path"]:
            return f"hook.path in {self.source}"
        from gpuhook.runtime import locate

        return locate.default_hook_path()[1]

    @property
    def cdi_spec_dirs(self) -> tuple[str, ...]:
        """The CDI spec folders the node's engines read, lowest priority first (cold code)."""
        return tuple(self.data["cdi"]["spec_dirs"])

    @property
    def records_dir(self) -> str:
        return os.path.join(self.state_dir, "containers")

    @property
    def propagated_env(self) -> tuple[str, ...]:
        """gpuhook's own variables for the hooks it adds to a container, whose env is otherwise
        PATH alone: the config file when it is not the default one, the cache folder when it is
        not (so that the hook reads the runtime's cache), and ``GPUHOOK_DEBUG=1`` when the
        environment (not the file) turned debug on. Never anything from the container."""
        out: list[str] = []
        if self.source.startswith("/") and self.source != DEFAULT_PATH:
            out.append(f"{ENV_CONFIG}={self.source}")
        if self.cache_dir_env:
            out.append(f"{ENV_CACHE_DIR}={self.cache_dir_env}")
        if self.log_level == "debug" and self.data["log"]["level"] != "debug":
            out.append(f"{ENV_DEBUG}=1")
        return tuple(out)

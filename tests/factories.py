"""Plain-data builders for unit tests of the pure core (no files, no NVML)."""

from __future__ import annotations

import os
from typing import Any

from gpuhook.config import loading as config_loading
from gpuhook.config.types import Config
from gpuhook.model.inventory import DeviceNode, Gpu, HostFile, Inventory, Library, MigDevice
from gpuhook.pipeline.request import PRIVILEGED_CAPS

HOOK_PATH_ENV = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"


def hook_env() -> list[str]:
    """The env of a hook gpuhook adds, for a config of :func:`config`: PATH, and the session's
    config cache folder (tests/hostguard.py), as a runtime with GPUHOOK_CACHE_DIR passes it on."""
    return [HOOK_PATH_ENV, f"GPUHOOK_CACHE_DIR={os.environ['GPUHOOK_CACHE_DIR']}"]


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-{i:012x}"


def mig_uuid(g: int, m: int) -> str:
    return f"MIG-{g:04x}{m:04x}-aaaa-bbbb-cccc-{g * 100 + m:012x}"


def _lib(name: str, soname: str, capability: str, dev_link: str = "") -> Library:
    return Library(
        f"{name}.550.54.15",
        f"/d/usr/lib/{name}.550.54.15",
        soname,
        "550.54.15",
        capability,
        dev_link,
    )


def inventory(
    gpus: int = 8, mig: dict[int, int] | None = None, brand: int = 14, graphics: bool = True
) -> Inventory:
    """``gpus`` GPUs of NVML ``brand`` (MIG devices per ``mig``); compute, utility and video
    libraries (libcuda and libnvidia-ml with their development links) and, with ``graphics``,
    the graphics libraries and loader files, libnvidia-allocator and /dev/nvidia-modeset."""
    mig = mig or {}
    out = []
    cap = 10
    for i in range(gpus):
        migs = []
        for m in range(mig.get(i, 0)):
            caps = (
                DeviceNode(
                    f"/dev/nvidia-caps/nvidia-cap{cap}",
                    f"/x/dev/nvidia-caps/nvidia-cap{cap}",
                    511,
                    cap,
                    0o444,
                ),
                DeviceNode(
                    f"/dev/nvidia-caps/nvidia-cap{cap + 1}",
                    f"/x/dev/nvidia-caps/nvidia-cap{cap + 1}",
                    511,
                    cap + 1,
                    0o444,
                ),
            )
            cap += 2
            migs.append(MigDevice(m, mig_uuid(i, m), i, m + 1, 0, "1g.10gb", 10 << 30, caps))
        out.append(
            Gpu(
                i,
                gpu_uuid(i),
                i,
                "NVIDIA H100",
                80 << 30,
                f"00000000:{16 + i:02x}:00.0",
                "9.0",
                i in mig,
                tuple(migs),
                DeviceNode(f"/dev/nvidia{i}", f"/x/dev/nvidia{i}", 195, i, 0o666),
                brand,
            )
        )
    control = [
        DeviceNode("/dev/nvidiactl", "/x/dev/nvidiactl", 195, 255),
        DeviceNode("/dev/nvidia-uvm", "/x/dev/nvidia-uvm", 510, 0),
    ]
    libs = [
        _lib("libcuda.so", "libcuda.so.1", "compute", "libcuda.so"),
        _lib("libnvidia-ml.so", "libnvidia-ml.so.1", "utility", "libnvidia-ml.so"),
        _lib("libnvcuvid.so", "libnvcuvid.so.1", "video"),
    ]
    files = [
        HostFile("binary", "nvidia-smi", "/d/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi", "utility")
    ]
    if graphics:
        control.append(DeviceNode("/dev/nvidia-modeset", "/x/dev/nvidia-modeset", 195, 254))
        libs += [
            _lib("libnvidia-allocator.so", "libnvidia-allocator.so.1", "compute"),
            _lib("libGLX_nvidia.so", "libGLX_nvidia.so.0", "graphics"),
            _lib("libEGL_nvidia.so", "libEGL_nvidia.so.0", "graphics"),
        ]
        files += [
            HostFile(
                "loader",
                "10_nvidia.json",
                "/d/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
                "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
                "graphics",
            ),
            HostFile(
                "loader",
                "nvidia_icd.json",
                "/d/etc/vulkan/icd.d/nvidia_icd.json",
                "/etc/vulkan/icd.d/nvidia_icd.json",
                "graphics",
            ),
        ]
    return Inventory(
        1.0,
        "/d",
        "/x",
        "550.54.15",
        "12.4",
        "/d/usr/lib/libnvidia-ml.so.1",
        out,
        control,
        libs,
        files,
        [],
        "key",
    )


def config(**overrides: Any) -> Config:
    data = config_loading._merge(config_loading.DEFAULTS, {})
    data["cdi"]["spec_dirs"] = []  # never the host's CDI folders (cdi__spec_dirs to set some)
    for dotted, value in overrides.items():
        node = data
        parts = dotted.split("__")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
    return Config("(test)", data, "/usr/sbin/runc")


def spec(
    env: list[str] | None = None,
    annotations: dict[str, str] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    privileged: bool = False,
    hooks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    caps = ["CAP_CHOWN", "CAP_KILL"] + (list(PRIVILEGED_CAPS) if privileged else [])
    # what engines write: a privileged container's device cgroup is open to every device
    rule = {"allow": True, "access": "rwm"} if privileged else {"allow": False, "access": "rwm"}
    out: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "args": ["sh"],
            "env": ["PATH=/bin", *(env or [])],
            "capabilities": {"bounding": caps, "effective": caps},
        },
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}, *(mounts or [])],
        "linux": {"resources": {"devices": [rule]}},
        "x-unknown-key": {"kept": [1, 2, 3]},
    }
    if annotations:
        out["annotations"] = annotations
    if hooks:
        out["hooks"] = hooks
    return out


def k8s(
    uid: str = "pod-uid-1",
    name: str = "trainer",
    namespace: str = "ml",
    container: str = "main",
    ctype: str = "container",
) -> dict[str, str]:
    return {
        "io.kubernetes.cri.container-type": ctype,
        "io.kubernetes.cri.sandbox-uid": uid,
        "io.kubernetes.cri.sandbox-name": name,
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.container-name": container,
    }


def crio(
    uid: str = "pod-uid-1",
    name: str = "trainer",
    namespace: str = "ml",
    container: str = "main",
    ctype: str = "container",
    copied: dict[str, str] | None = None,
) -> dict[str, str]:
    """The identity annotations CRI-O writes: its container type, the kubelet's labels, and the
    JSON lists of the annotations (``copied``, also copied into the spec) and labels it got."""
    import json

    labels = {
        "io.kubernetes.pod.uid": uid,
        "io.kubernetes.pod.name": name,
        "io.kubernetes.pod.namespace": namespace,
        "io.kubernetes.container.name": container,
    }
    return {
        "io.kubernetes.cri-o.ContainerType": ctype,
        "io.kubernetes.cri-o.Labels": json.dumps(labels),
        "io.kubernetes.cri-o.Annotations": json.dumps(copied or {}),
        **labels,
        **(copied or {}),
    }


# the name of a container's termination-log file in its pod folder, pods/<uid>/containers/<name>/
# (the kubelet picks 8 random hex digits), bind-mounted at /dev/termination-log
TERMINATION_LOG_NAME = "5d1c2a9e"


def kubelet_mounts(
    uid: str = "pod-uid-1", container: str = "main", kubelet_dir: str = "/var/lib/kubelet"
) -> list[dict[str, Any]]:
    """The kubelet's per-pod mounts of an app container: /etc/hosts and the termination log."""
    pod = f"{kubelet_dir}/pods/{uid}"
    return [
        {
            "destination": "/etc/hosts",
            "type": "bind",
            "source": f"{pod}/etc-hosts",
            "options": ["rbind", "rw"],
        },
        {
            "destination": "/dev/termination-log",
            "type": "bind",
            "source": f"{pod}/containers/{container}/{TERMINATION_LOG_NAME}",
            "options": ["rbind", "rw"],
        },
    ]

"""NVIDIA's own device plugin (k8s-device-plugin v0.20.0, ../shared/k8s/nvidia-device-plugin.xz)
on the fake GPU node, for the real kubelet of this suite.

It loads ``libnvidia-ml.so.1`` from its container driver root (``CONTAINER_DRIVER_ROOT``): here a
folder of links to the fake node's driver root, with ``dev`` linked to the node's dev root (its
dev root is the driver root when that has a ``dev/``), so it sees the fake NVML (with
tools/fakenode/fake_nvml_plugin.c: event sets, topology; fake_nvml_mig.c: the MIG instance API)
and the node's device nodes. It serves
``nvidia.com/gpu`` on the hard-coded ``/var/lib/kubelet/device-plugins/nvidia-gpu.sock`` (one
plugin at a time) and, in the CDI strategies, writes its CDI spec to the hard-coded
``/var/run/cdi``: it runs in a private mount namespace whose ``/run`` is a private tmpfs, so that
spec never reaches the host. Started and stopped by its pid (SIGTERM removes its socket).
"""

from __future__ import annotations

import json
import lzma
import os
import signal
import subprocess
import time
from pathlib import Path

import yaml

from tests.integration.kubelet import deviceplugin

RESOURCE = "nvidia.com/gpu"
REGISTERED = f"Registered device plugin for '{RESOURCE}' with Kubelet"  # its log line
SOCKET = deviceplugin.PLUGIN_DIR / "nvidia-gpu.sock"
DRIVER_LINKS = ("usr", "etc", "lib", "proc", "sys")
# The plugin's own mount namespace: /run (and so /var/run/cdi) a private tmpfs; the node's
# /proc/driver (nvidia-caps/mig-minors, nvidia/capabilities: MIG devices' caps minors) and
# /proc/devices (the nvidia-caps major), which it reads at hard-coded host paths; then the plugin.
# $1: the node's driver root.
PRIVATE_RUN = (
    "mount -t tmpfs -o mode=755 tmpfs /run && mkdir /run/cdi"
    ' && mount --bind "$1/proc/driver" /proc/driver'
    ' && mount --bind "$1/proc/devices" /proc/devices'
    ' && shift && exec "$0" "$@"'
)


def binary(repo: Path, folder: Path) -> Path:
    """NVIDIA's plugin, decompressed from ../shared/k8s into ``folder``."""
    out = folder / "nvidia-device-plugin"
    if not out.exists():
        source = repo.parent / "shared" / "k8s" / "nvidia-device-plugin.xz"
        out.write_bytes(lzma.decompress(source.read_bytes()))
        out.chmod(0o755)
    return out


def driver_root(node_root: Path, folder: Path) -> Path:
    """The plugin's container driver root: the node's driver files and its dev root."""
    root = folder / "driver-root"
    root.mkdir(exist_ok=True)
    for name in DRIVER_LINKS:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(node_root / "driver" / name)
    if not (root / "dev").is_symlink():
        (root / "dev").symlink_to(node_root / "dev" / "dev")  # the dev root's /dev
    return root


class NvidiaPlugin:
    """One run of NVIDIA's plugin with a device list strategy, an id strategy and, for
    time-slicing, ``replicas`` of each GPU."""

    def __init__(
        self,
        program: Path,
        node_root: Path,
        folder: Path,
        strategy: str,
        id_strategy: str = "uuid",
        replicas: int = 0,
        mig_strategy: str = "none",
    ) -> None:
        self.program = program
        self.node_root = node_root
        self.folder = folder
        self.strategy = strategy
        self.id_strategy = id_strategy
        self.replicas = replicas
        self.mig_strategy = mig_strategy
        self.log = folder / f"nvidia-plugin-{strategy}-{id_strategy}-{replicas}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def config(self) -> Path:
        doc: dict[str, object] = {"version": "v1", "flags": {"migStrategy": self.mig_strategy}}
        if self.replicas:
            resources = [{"name": RESOURCE, "replicas": self.replicas}]
            doc["sharing"] = {"timeSlicing": {"resources": resources}}
        path = self.folder / "nvidia-plugin.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def start(self) -> None:
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "NODE_NAME": "gpuhook-node",
            "CONTAINER_DRIVER_ROOT": str(driver_root(self.node_root, self.folder)),
            "NVIDIA_DRIVER_ROOT": str(self.node_root / "driver"),
            "DEVICE_LIST_STRATEGY": self.strategy,
            "DEVICE_ID_STRATEGY": self.id_strategy,
            "CONFIG_FILE": str(self.config()),
            "FAIL_ON_INIT_ERROR": "true",
        }
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private",
                 "sh", "-c", PRIVATE_RUN, str(self.program), str(self.node_root / "driver")],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip

    def wait_registered(self, checkpoint: Path, device_ids: int, timeout: float = 60) -> None:
        """Until the plugin says the kubelet took its registration and the kubelet's checkpoint
        lists ``device_ids`` devices of the resource."""
        deadline = time.monotonic() + timeout
        while REGISTERED not in self.tail() or len(registered(checkpoint)) != device_ids:
            if time.monotonic() > deadline or (self.proc and self.proc.poll() is not None):
                raise AssertionError(f"NVIDIA's plugin did not register:\n{self.tail()}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(20)
        self.proc = None
        deadline = time.monotonic() + 20
        while SOCKET.exists() and time.monotonic() < deadline:
            time.sleep(0.2)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def registered(checkpoint: Path) -> list[str]:
    """The devices the kubelet's checkpoint lists for NVIDIA's resource."""
    try:
        doc = json.loads(checkpoint.read_text())
    except (OSError, ValueError):
        return []
    devices: list[str] = (doc["Data"].get("RegisteredDevices") or {}).get(RESOURCE) or []
    return devices

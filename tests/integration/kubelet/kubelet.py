"""The real kubelet of ../shared/k8s, standalone: static pods, no API server.

Its KubeletConfiguration keeps it inside the suite's folder where it can (root dir, cert dir, pod
logs, static pod folder, its own ``cgroupRoot``) and off what it need not touch (no iptables
chains, no server, image GC off); host.py puts back what it changes anyway. Static pods are
written atomically (a pod admitted before its device plugin registered is rejected for good, so
the suite registers its plugins first). Each container's command runs testbed's probe (its
``/dev/nvidia*`` nodes, its NVIDIA/CUDA env, ldconfig, nvidia-smi) and the suite reads what it
printed from the kubelet's container log (CRI log format), as ``kubectl logs`` would.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import testbed

from tests.integration import engines
from tests.integration.cri.daemon import IMAGE_ALL

NODE_NAME = "gpuhook-node"
NAMESPACE = "default"
POD_TIMEOUT = 120.0
PROBE_THEN_SLEEP = testbed.PROBE + "; exec sleep 3600"


def locate(repo: Path) -> Path:
    """Where CI keeps the kubelet: ../shared/k8s/kubelet beside the clone."""
    return repo.parent / "shared" / "k8s" / "kubelet"


@dataclass(frozen=True)
class Container:
    """A container of a static pod: its device plugin resources (limits) and its script."""

    name: str = "main"
    gpus: Mapping[str, int] = field(default_factory=dict)
    image: str = IMAGE_ALL
    script: str = PROBE_THEN_SLEEP
    mounts: Mapping[str, str] = field(default_factory=dict)  # volume name -> container path

    def manifest(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", self.script],
        }
        if self.gpus:
            doc["resources"] = {"limits": {k: str(v) for k, v in self.gpus.items()}}
        if self.mounts:
            doc["volumeMounts"] = [{"name": k, "mountPath": v} for k, v in self.mounts.items()]
        return doc


@dataclass(frozen=True)
class Pod:
    """A static pod on the host network. Its name on the node is ``<name>-<node name>``."""

    name: str
    containers: Sequence[Container] = (Container(),)
    init_containers: Sequence[Container] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    empty_dirs: Sequence[str] = ()

    @property
    def full_name(self) -> str:
        return f"{self.name}-{NODE_NAME}"

    @property
    def ref(self) -> str:
        """NAMESPACE/NAME, as `gpuhook inspect pod` takes it."""
        return f"{NAMESPACE}/{self.full_name}"

    def manifest(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "hostNetwork": True,
            "terminationGracePeriodSeconds": 1,
            "containers": [c.manifest() for c in self.containers],
        }
        if self.init_containers:
            spec["initContainers"] = [c.manifest() for c in self.init_containers]
        if self.empty_dirs:
            spec["volumes"] = [{"name": n, "emptyDir": {}} for n in self.empty_dirs]
        metadata: dict[str, Any] = {"name": self.name, "namespace": NAMESPACE}
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def read_log(path: Path) -> str:
    """The text of a CRI container log (``<time> <stream> <P|F> <text>`` per line; P: partial)."""
    text = ""
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        text += (parts[3] if len(parts) == 4 else "") + ("" if parts[2] == "P" else "\n")
    return text


class Kubelet(engines.Daemon):
    """The kubelet process, its config, static pod folder and logs (``kubelet.log``), under
    ``root``; started, tailed and stopped as the suite's other daemons are."""

    def __init__(self, binary: Path, root: Path, runtime_socket: Path, cgroup: str) -> None:
        super().__init__("kubelet", root)
        self.binary = binary
        self.root_dir = root / "kubelet"
        self.manifests = root / "manifests"
        self.pod_logs = root / "pod-logs"
        self.config_file = root / "kubelet.json"
        self.runtime_socket = runtime_socket
        self.cgroup = cgroup

    def configuration(self) -> dict[str, Any]:
        endpoint = f"unix://{self.runtime_socket}"
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "staticPodPath": str(self.manifests),
            "fileCheckFrequency": "1s",
            "containerRuntimeEndpoint": endpoint,
            "imageServiceEndpoint": endpoint,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup}",
            "failSwapOn": False,
            "failCgroupV1": False,  # this host is cgroup v1
            "enableServer": False,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "makeIPTablesUtilChains": False,
            "podLogsDir": str(self.pod_logs),
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
        }

    def launch(self, ready: Path) -> None:
        """Start it and wait until ``ready`` (its device plugin socket) exists."""
        for folder in (self.root_dir, self.manifests, self.pod_logs):
            folder.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(json.dumps(self.configuration(), indent=1))
        argv = [
            str(self.binary),
            f"--config={self.config_file}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={self.root / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            "--v=2",
        ]
        self.start(argv, os.environ, ready)

    def ready(self) -> bool:
        return True  # its device plugin socket is there (engines.Daemon.start waited for it)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # --- static pods --------------------------------------------------------------------------

    def add(self, pod: Pod) -> None:
        """Write the pod's manifest atomically (the kubelet must never read half of one)."""
        tmp = self.manifests / f".{pod.name}.tmp"  # dot files are ignored
        tmp.write_text(json.dumps(pod.manifest()))
        os.replace(tmp, self.manifests / f"{pod.name}.json")

    def delete(self, pod: Pod) -> None:
        (self.manifests / f"{pod.name}.json").unlink(missing_ok=True)

    def static_pods(self) -> list[str]:
        return sorted(p.stem for p in self.manifests.glob("*.json"))

    def pod_uid(self, pod: Pod) -> str | None:
        """The UID the kubelet gave the static pod (from its log folder's name)."""
        for folder in self.pod_logs.glob(f"{NAMESPACE}_{pod.full_name}_*"):
            return folder.name.rsplit("_", 1)[1]
        return None

    def empty_dir(self, pod: Pod, volume: str) -> Path:
        """Where the kubelet keeps the pod's emptyDir ``volume`` on the host."""
        uid = self.pod_uid(pod)
        assert uid is not None, pod.full_name
        return self.root_dir / "pods" / uid / "volumes" / "kubernetes.io~empty-dir" / volume

    def output(self, pod: Pod, container: str, attempt: int = 0) -> str:
        """What one run of a container printed ('' while it has no log)."""
        uid = self.pod_uid(pod)
        if uid is None:
            return ""
        path = self.pod_logs / f"{NAMESPACE}_{pod.full_name}_{uid}" / container / f"{attempt}.log"
        return read_log(path) if path.exists() else ""

    def probe(self, pod: Pod, container: str = "main", attempt: int = 0) -> dict[str, Any]:
        """testbed's probe as one run of the container printed it, once it has printed it all."""
        deadline = time.monotonic() + POD_TIMEOUT
        while "--- end" not in (text := self.output(pod, container, attempt)):
            if time.monotonic() > deadline or not self.alive():
                raise AssertionError(
                    f"{pod.ref} container {container} (run {attempt}) printed no probe "
                    f"within {POD_TIMEOUT:.0f}s{self.tail()}"
                )
            time.sleep(0.3)
        return testbed.parse_probe(text)

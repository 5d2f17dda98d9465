"""What the kubelet hands the CRI runtime, for the end-to-end suite: pod sandbox and container
configs shaped as the kubelet (1.2x, kuberuntime) builds them, the per-pod files it mounts
(``pods/<uid>/etc-hosts``, the termination-message file), and its device-manager checkpoint
(``device-plugins/kubelet_internal_checkpoint``: Go's encoding/json of the checkpoint structs,
DeviceIDs per NUMA node since 1.20, AllocResp the device plugin's ContainerAllocateResponse in
protobuf bytes, base64 as encoding/json writes []byte)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TERMINATION_LOG = "/dev/termination-log"


@dataclass(frozen=True)
class Pod:
    """A pod as the API server would hand it to the kubelet."""

    name: str = "trainer"
    namespace: str = "ml"
    uid: str = field(default_factory=lambda: str(uuidlib.uuid4()))
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Allocation:
    """What one device plugin's Allocate answered for one container: devices of a resource,
    the env it asks the kubelet to set and the (CDI) annotations it asks for."""

    container: str
    resource: str
    device_ids: tuple[str, ...]
    envs: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def alloc_resp(envs: Mapping[str, str], annotations: Mapping[str, str]) -> bytes:
    """deviceplugin v1beta1 ContainerAllocateResponse: map envs = 1, map annotations = 4
    (map entries: key = 1, value = 2)."""
    out = b""
    for number, pairs in ((1, envs), (4, annotations)):
        for key, value in sorted(pairs.items()):
            out += _field(number, _field(1, key.encode()) + _field(2, value.encode()))
    return out


def write_checkpoint(path: Path, allocations: list[tuple[Pod, Allocation]]) -> None:
    """The device manager's checkpoint, replaced atomically as the kubelet does."""
    entries = [
        {
            "PodUID": pod.uid,
            "ContainerName": a.container,
            "ResourceName": a.resource,
            "DeviceIDs": {"0": list(a.device_ids)},
            "AllocResp": base64.b64encode(alloc_resp(a.envs, a.annotations)).decode(),
        }
        for pod, a in allocations
    ]
    registered: dict[str, list[str]] = {}
    for _, a in allocations:
        registered.setdefault(a.resource, []).extend(a.device_ids)
    doc = {
        "Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered},
        "Checksum": 1,  # the kubelet's spew-based hash; gpuhook does not recompute it
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def namespaces(api: Any) -> Any:
    """Host network (no CNI), a private PID namespace per container, the pod's IPC."""
    return api.NamespaceOption(network=api.NODE, pid=api.CONTAINER, ipc=api.POD)


def sandbox_config(api: Any, pod: Pod, log_root: Path) -> Any:
    """RunPodSandbox's config: the kubelet's labels and its config.* annotations plus the pod's
    own annotations (the kubelet passes them all)."""
    annotations = {
        "kubernetes.io/config.seen": "2026-01-01T00:00:00.000000000Z",
        "kubernetes.io/config.source": "api",
        **pod.annotations,
    }
    log_dir = log_root / f"{pod.namespace}_{pod.name}_{pod.uid}"
    log_dir.mkdir(parents=True, exist_ok=True)
    return api.PodSandboxConfig(
        metadata=api.PodSandboxMetadata(
            name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=0
        ),
        log_directory=str(log_dir),
        labels={
            "io.kubernetes.pod.name": pod.name,
            "io.kubernetes.pod.namespace": pod.namespace,
            "io.kubernetes.pod.uid": pod.uid,
        },
        annotations=annotations,
        linux=api.LinuxPodSandboxConfig(
            security_context=api.LinuxSandboxSecurityContext(namespace_options=namespaces(api))
        ),
    )


def pod_mounts(api: Any, kubelet_dir: Path, pod: Pod, container: str) -> list[Any]:
    """The kubelet's own per-pod mounts, in every container of a pod whatever the engine:
    /etc/hosts from pods/<uid>/etc-hosts and the termination-message file from
    pods/<uid>/containers/<name>/<random>. Creates the host files as the kubelet does."""
    pod_dir = kubelet_dir / "pods" / pod.uid
    hosts = pod_dir / "etc-hosts"
    pod_dir.mkdir(parents=True, exist_ok=True)
    hosts.write_text("127.0.0.1\tlocalhost\n")
    term = pod_dir / "containers" / container / secrets.token_hex(4)
    term.parent.mkdir(parents=True, exist_ok=True)
    term.touch()
    return [
        api.Mount(container_path="/etc/hosts", host_path=str(hosts)),
        api.Mount(container_path=TERMINATION_LOG, host_path=str(term)),
    ]


def container_config(
    api: Any,
    pod: Pod,
    name: str,
    image: str,
    mounts: list[Any],
    allocations: list[Allocation],
    command: list[str],
) -> Any:
    """CreateContainer's config: the kubelet's labels and annotations, the device plugins'
    env and annotations (CDI), the pod's mounts."""
    envs: dict[str, str] = {}
    annotations = {
        "io.kubernetes.container.hash": "1a2b3c4d",
        "io.kubernetes.container.restartCount": "0",
        "io.kubernetes.container.terminationMessagePath": TERMINATION_LOG,
        "io.kubernetes.container.terminationMessagePolicy": "File",
        "io.kubernetes.pod.terminationGracePeriod": "30",
    }
    for a in allocations:
        envs.update(a.envs)
        annotations.update(a.annotations)
    return api.ContainerConfig(
        metadata=api.ContainerMetadata(name=name, attempt=0),
        image=api.ImageSpec(image=image),
        command=command,
        envs=[api.KeyValue(key=k, value=v) for k, v in envs.items()],
        mounts=mounts,
        labels={
            "io.kubernetes.container.name": name,
            "io.kubernetes.pod.name": pod.name,
            "io.kubernetes.pod.namespace": pod.namespace,
            "io.kubernetes.pod.uid": pod.uid,
        },
        annotations=annotations,
        log_path=f"{name}/0.log",
        linux=api.LinuxContainerConfig(
            security_context=api.LinuxContainerSecurityContext(namespace_options=namespaces(api))
        ),
    )

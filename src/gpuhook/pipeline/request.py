"""OCI spec -> :class:`Request` (pure): what a container asks for, and through which channel.

Nothing here decides trust; that is :mod:`gpuhook.pipeline.policy`.
The parser is lenient about parts
of the spec that do not concern GPUs (a malformed spec is runc's to reject) and records
malformed GPU requests as ``problems`` instead of raising, so that the policy can refuse an
untrusted malformed request quietly and fail a trusted one with one line.
"""

from __future__ import annotations

import os

from gpuhook.errors import SpecError
from gpuhook.model.decision import (
    CHANNEL_CDI,
    CHANNEL_DOCKER,
    CHANNEL_ENV,
    CHANNEL_MOUNT,
    ChannelRequest,
    KubeIdentity,
    Request,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ENV_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
ENV_CAPS = "NVIDIA_DRIVER_CAPABILITIES"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
GPUHOOK_ANNOTATION_PREFIX = "gpuhook.io/"
MARKER_ROOTS = ("/var/run/nvidia-container-devices/", "/run/nvidia-container-devices/")
# A marker is a mount of /dev/null, as a device plugin's Allocate response asks the kubelet for.
# Any other source (an emptyDir, a configMap, a PVC: volumes every pod author may use) at the same
# path is the pod author's, not a device plugin's, and is not a request.
MARKER_SOURCE = "/dev/null"
DOCKER_HOOK = "nvidia-container-runtime-hook"
CAP_SYS_ADMIN = "CAP_SYS_ADMIN"
MAX_DEVICE_IDS = 256


# Kubernetes identity annotations: containerd's CRI plugin, then CRI-O.
_K8S_KEYS = (
    {
        "type": "io.kubernetes.cri.container-type",
        "uid": "io.kubernetes.cri.sandbox-uid",
        "namespace": "io.kubernetes.cri.sandbox-namespace",
        "pod": "io.kubernetes.cri.sandbox-name",
        "container": "io.kubernetes.cri.container-name",
    },
    {
        "type": "io.kubernetes.cri-o.ContainerType",
        "uid": "io.kubernetes.pod.uid",
        "namespace": "io.kubernetes.pod.namespace",
        "pod": "io.kubernetes.pod.name",
        "container": "io.kubernetes.container.name",
    },
)


def parse(spec: Any) -> Request:
    if not isinstance(spec, dict):
        raise SpecError("config.json: the top level is not a JSON object")
    annotations = _str_map(spec.get("annotations"))
    process = spec["process"] if isinstance(spec.get("process"), dict) else {}
    env = _env(process.get("env"))
    problems: list[str] = []
    channels: list[ChannelRequest] = []

    for key in sorted(annotations):
        if key.startswith(CDI_ANNOTATION_PREFIX):
            value = annotations[key]
            ids = tuple(_split(value))
            channels.append(ChannelRequest(CHANNEL_CDI, f"annotation {key}", value, ids))

    marker_ids: list[str] = []
    sources: list[str] = []
    mounts = spec.get("mounts")
    for mount in mounts if isinstance(mounts, list) else ():
        if not isinstance(mount, dict):
            continue
        dest = mount.get("destination")
        if not isinstance(dest, str) or not _is_marker_source(mount.get("source")):
            continue
        for root in MARKER_ROOTS:
            if dest.startswith(root):
                device = dest[len(root) :]
                sources.append(dest)
                if not device or "/" in device or device in (".", ".."):
                    problems.append(f"malformed volume-mount marker {dest!r}")
                else:
                    marker_ids.append(device)
    if marker_ids or sources:
        channels.append(
            ChannelRequest(
                CHANNEL_MOUNT,
                "mounts " + ", ".join(sources),
                ",".join(marker_ids),
                tuple(_dedupe(marker_ids)),
            )
        )

    visible = env.get(ENV_VISIBLE)
    docker = _has_docker_hook(spec.get("hooks"))
    if docker or (visible is not None and visible.strip().lower() not in ("", "void")):
        value = visible or ""
        ids, problem = env_ids(value)
        if problem:
            problems.append(f"{ENV_VISIBLE}: {problem}")
        channel = CHANNEL_DOCKER if docker else CHANNEL_ENV
        source = f"docker --gpus ({DOCKER_HOOK} prestart hook)" if docker else f"env {ENV_VISIBLE}"
        channels.append(ChannelRequest(channel, source, value, ids))

    return Request(
        channels=tuple(channels),
        driver_capabilities=env.get(ENV_CAPS),
        privileged=_privileged(process.get("capabilities")),
        kubernetes=_kubernetes(annotations),
        annotations=tuple(
            sorted(
                (k, v) for k, v in annotations.items() if k.startswith(GPUHOOK_ANNOTATION_PREFIX)
            )
        ),
        problems=tuple(problems),
    )


def env_ids(value: str) -> tuple[tuple[str, ...], str]:
    """Split an NVIDIA_VISIBLE_DEVICES value into ids: ``("all",)``, ``("none",)``, a device
    list, or ``()`` for ``void``/empty. Returns ``(ids, problem)``; problem is "" when well-formed.
    """
    tokens = _split(value)
    lowered = [t.lower() for t in tokens]
    if not tokens or lowered == ["void"]:
        return (), ""
    if "all" in lowered:
        return ("all",), ""
    if lowered == ["none"]:
        return ("none",), ""
    if "none" in lowered or "void" in lowered:
        return (), f"'none' or 'void' cannot be combined with device ids in {_clip(value)!r}"
    ids = _dedupe(tokens)
    if len(ids) > MAX_DEVICE_IDS:
        return (), f"too many device ids ({len(ids)} > {MAX_DEVICE_IDS})"
    return tuple(ids), ""


def _split(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()]


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _env(value: Any) -> dict[str, str]:
    """Environment as a map; for a key given twice the last wins (docker appends --gpus last)."""
    out: dict[str, str] = {}
    if not isinstance(value, list):
        return out
    for entry in value:
        if isinstance(entry, str) and "=" in entry:
            key, _, val = entry.partition("=")
            out[key] = val
    return out


def _is_marker_source(source: Any) -> bool:
    return isinstance(source, str) and os.path.normpath(source) == MARKER_SOURCE


def _has_docker_hook(hooks: Any) -> bool:
    if not isinstance(hooks, dict) or not isinstance(hooks.get("prestart"), list):
        return False
    for hook in hooks["prestart"]:
        if (
            isinstance(hook, dict)
            and isinstance(hook.get("path"), str)
            and hook["path"].rsplit("/", 1)[-1] == DOCKER_HOOK
        ):
            return True
    return False


def _privileged(caps: Any) -> bool:
    if not isinstance(caps, dict):
        return False
    bounding = caps.get("bounding")
    return isinstance(bounding, list) and CAP_SYS_ADMIN in bounding


def _kubernetes(annotations: dict[str, str]) -> KubeIdentity | None:
    for keys in _K8S_KEYS:
        if keys["type"] in annotations or keys["uid"] in annotations:
            return KubeIdentity(
                pod_uid=annotations.get(keys["uid"], ""),
                namespace=annotations.get(keys["namespace"], ""),
                pod_name=annotations.get(keys["pod"], ""),
                container_name=annotations.get(keys["container"], ""),
                container_type=annotations.get(keys["type"], "container"),
            )
    return None

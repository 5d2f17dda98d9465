"""OCI spec -> :class:`Request` (pure): what a container asks for, and through which channel.

Nothing here decides trust; that is :mod:`gpuhook.pipeline.policy`. The parser is lenient about
parts of the spec that do not concern GPUs (a malformed spec is runc's to reject) and records
malformed GPU requests as ``problems`` instead of raising, so that the policy can refuse an
untrusted malformed request quietly and fail a trusted one with one line.
"""

from __future__ import annotations

import os

from gpuhook.config import KUBELET_DIR_DEFAULT
from gpuhook.errors import SpecError
from gpuhook.model.decision import (
    CHANNEL_CDI,
    CHANNEL_DOCKER,
    CHANNEL_ENV,
    CHANNEL_MOUNT,
    ChannelRequest,
    Request,
)
from gpuhook.pipeline import identity

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


def parse(spec: Any, kubelet_dir: str = KUBELET_DIR_DEFAULT) -> Request:
    """What ``spec`` asks for. ``kubelet_dir``: where the kubelet's per-pod mounts come from
    (they identify the Kubernetes containers of engines that write no identity annotation)."""
    if not isinstance(spec, dict):
        raise SpecError("config.json: the top level is not a JSON object")
    annotations = _str_map(spec.get("annotations"))
    process = spec["process"] if isinstance(spec.get("process"), dict) else {}
    env = _env(process.get("env"))
    kube = identity.identify(annotations, spec.get("mounts"), kubelet_dir)
    found = (
        _cdi_channel(annotations),
        _marker_channel(spec.get("mounts")),
        _env_channel(env, has_prestart_hook(spec), kube is not None),
    )
    channels = tuple(c for c in found if c is not None)
    return Request(
        channels=channels,
        driver_capabilities=env.get(ENV_CAPS),
        privileged=_privileged(process.get("capabilities")),
        kubernetes=kube,
        annotations=tuple(
            sorted(
                (k, v) for k, v in annotations.items() if k.startswith(GPUHOOK_ANNOTATION_PREFIX)
            )
        ),
        problems=tuple(c.problem for c in channels if c.problem),
    )


def has_prestart_hook(spec: dict[str, Any]) -> bool:
    """Whether the spec carries ``nvidia-container-runtime-hook`` as a prestart hook (docker
    ``--gpus``, or NVIDIA's hooks.d file, which puts it into every container)."""
    return _has_docker_hook(spec.get("hooks"))


def _cdi_channel(annotations: dict[str, str]) -> ChannelRequest | None:
    """All ``cdi.k8s.io/*`` annotations, as one request (one annotation per device-plugin
    Allocate response: a container with two ``nvidia.com/*`` resources has two)."""
    keys = sorted(k for k in annotations if k.startswith(CDI_ANNOTATION_PREFIX))
    if not keys:
        return None
    values = [annotations[k] for k in keys]
    ids = _dedupe([i for value in values for i in _split(value)])
    source = ("annotation " if len(keys) == 1 else "annotations ") + ", ".join(keys)
    return ChannelRequest(CHANNEL_CDI, source, ",".join(values), tuple(ids))


def _marker_channel(mounts: Any) -> ChannelRequest | None:
    marker_ids: list[str] = []
    sources: list[str] = []
    problems: list[str] = []
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
    if not sources:
        return None
    return ChannelRequest(
        CHANNEL_MOUNT,
        "mounts " + ", ".join(sources),
        ",".join(marker_ids),
        tuple(_dedupe(marker_ids)),
        problems[0] if problems else "",
    )


def _env_channel(env: dict[str, str], hook: bool, kubernetes: bool) -> ChannelRequest | None:
    """NVIDIA_VISIBLE_DEVICES, through docker ``--gpus`` when its prestart hook is there. In a
    Kubernetes container that hook is NVIDIA's hooks.d file, not docker: an env request."""
    visible = env.get(ENV_VISIBLE)
    if not hook and (visible is None or visible.strip().lower() in ("", "void")):
        return None
    value = visible or ""
    ids, problem = env_ids(value)
    channel, source = CHANNEL_ENV, f"env {ENV_VISIBLE}"
    if hook and not kubernetes:
        channel, source = CHANNEL_DOCKER, f"docker --gpus ({DOCKER_HOOK} prestart hook)"
    elif hook:
        source += f" ({DOCKER_HOOK} prestart hook of a Kubernetes container: an env request)"
    return ChannelRequest(
        channel, source, value, ids, f"{ENV_VISIBLE}: {problem}" if problem else ""
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

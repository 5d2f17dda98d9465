"""OCI spec -> :class:`Request` (pure): what a container asks for, and through which channel.

Nothing here decides trust; that is :mod:`gpuhook.pipeline.policy`. The parser is lenient about
parts of the spec that do not concern GPUs (a malformed spec is runc's to reject) and records
malformed GPU requests as ``problems`` instead of raising, so that the policy can refuse an
untrusted malformed request quietly and fail a trusted one with one line.
"""

from __future__ import annotations

import os

from gpuhook.config.types import CDI_KINDS_DEFAULT, KUBELET_DIR_DEFAULT
from gpuhook.errors import SpecError
from gpuhook.model.decision import (
    CHANNEL_CDI,
    CHANNEL_DOCKER,
    CHANNEL_ENV,
    CHANNEL_MOUNT,
    VERDICT_IGNORED,
    ChannelRequest,
    Reason,
    Request,
)
from gpuhook.pipeline import engine, gofields, identity

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
# NVIDIA's prestart hooks: docker --gpus and the current hooks.d file run the first; the hooks.d
# file NVIDIA documented for years (oci-nvidia-hook.json) runs `nvidia-container-toolkit prestart`.
NVIDIA_HOOKS = (DOCKER_HOOK, "nvidia-container-toolkit")
# NVIDIA's legacy-image rule: an image with CUDA_VERSION but neither NVIDIA_VISIBLE_DEVICES nor
# NVIDIA_REQUIRE_CUDA asks for every GPU (its hook then acts on it).
ENV_LEGACY_CUDA = "CUDA_VERSION"
ENV_REQUIRE_CUDA = "NVIDIA_REQUIRE_CUDA"
MAX_DEVICE_IDS = 256
# What engines write for a privileged container (docker, containerd's CRI, podman, CRI-O alike):
# every capability they grant, of which these are never in a default set, and a device cgroup
# open to every device. An added capability (capabilities.add: [SYS_ADMIN]) is not privilege.
PRIVILEGED_CAPS = ("CAP_SYS_ADMIN", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_NET_ADMIN")


def parse(
    spec: Any,
    kubelet_dir: str = KUBELET_DIR_DEFAULT,
    cdi_kinds: tuple[str, ...] = CDI_KINDS_DEFAULT,
) -> Request:
    """What ``spec`` asks for. ``kubelet_dir``: where the kubelet's per-pod mounts come from
    (they identify the Kubernetes containers of engines that write no identity annotation);
    ``cdi_kinds``: the CDI kinds whose devices are GPUs (``policy.cdi_kinds``)."""
    if not isinstance(spec, dict):
        raise SpecError("config.json: the top level is not a JSON object")
    gofields.check(spec)
    annotations = _str_map(spec.get("annotations"))
    process = spec["process"] if isinstance(spec.get("process"), dict) else {}
    env = _env(process.get("env"))
    kube = identity.identify(annotations, spec.get("mounts"), kubelet_dir)
    cdi, ignored = _cdi_channel(annotations, cdi_kinds)
    found = (
        cdi,
        _marker_channel(spec.get("mounts")),
        _env_channel(env, bool(nvidia_hooks(spec)), kube is not None),
    )
    channels = tuple(c for c in found if c is not None)
    return Request(
        channels=channels,
        driver_capabilities=env.get(ENV_CAPS),
        privileged=privileged(spec),
        kubernetes=kube,
        annotations=tuple(
            sorted(
                (k, v) for k, v in annotations.items() if k.startswith(GPUHOOK_ANNOTATION_PREFIX)
            )
        ),
        problems=tuple(c.problem for c in channels if c.problem),
        ignored=ignored,
        engine_devices=engine.spec_devices(spec),
    )


def nvidia_hooks(spec: dict[str, Any]) -> tuple[str, ...]:
    """Which of NVIDIA's hooks (:data:`NVIDIA_HOOKS`) the spec carries as prestart hooks
    (docker ``--gpus``, or NVIDIA's hooks.d file, which puts one into every container)."""
    hooks = spec.get("hooks")
    prestart = hooks.get("prestart") if isinstance(hooks, dict) else None
    entries = prestart if isinstance(prestart, list) else []
    found = {
        hook["path"].rsplit("/", 1)[-1]
        for hook in entries
        if isinstance(hook, dict) and isinstance(hook.get("path"), str)
    }
    return tuple(name for name in NVIDIA_HOOKS if name in found)


def _cdi_channel(
    annotations: dict[str, str], kinds: tuple[str, ...]
) -> tuple[ChannelRequest | None, tuple[Reason, ...]]:
    """All ``cdi.k8s.io/*`` annotations naming GPUs (a kind of ``kinds``: ``nvidia.com/gpu``,
    NVIDIA's device plugin's ``k8s.device-plugin.nvidia.com/gpu``, ...), as one request (one
    annotation per device-plugin Allocate response: a container with two GPU resources has two);
    its ids are the device names. CDI devices of other kinds (the RDMA plugin's
    ``nvidia.com/net-rdma=...``, another vendor's) are left to their CDI handler: a reason line
    each, no request, so that the container's other channels decide."""
    keys = sorted(k for k in annotations if k.startswith(CDI_ANNOTATION_PREFIX))
    gpu_keys: list[str] = []
    ids: list[str] = []
    ignored: list[Reason] = []
    for key in keys:
        names = _split(annotations[key])
        gpus = [g for g in (cdi_device(n, kinds) for n in names) if g is not None]
        ignored += [
            Reason(CHANNEL_CDI, n, VERDICT_IGNORED, f"{key}: a CDI device of another kind, not a "
                   "GPU (left to its own CDI handler; GPU kinds: policy.cdi_kinds)")
            for n in names if cdi_device(n, kinds) is None
        ]  # fmt: skip
        if gpus:
            gpu_keys.append(key)
            ids += gpus
    if not gpu_keys:
        return None, tuple(ignored)
    values = ",".join(annotations[k] for k in gpu_keys)
    source = ("annotation " if len(gpu_keys) == 1 else "annotations ") + ", ".join(gpu_keys)
    return ChannelRequest(CHANNEL_CDI, source, values, tuple(_dedupe(ids))), tuple(ignored)


def cdi_device(name: str, kinds: tuple[str, ...]) -> str | None:
    """The device name of a fully-qualified CDI name ``<vendor>/<class>=<device>`` whose kind is
    one of ``kinds``, None for another kind; a name without a kind is taken as it is."""
    kind, equals, device = name.partition("=")
    if not equals:
        return name
    return device if kind in kinds else None


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
    value, source = visible or "", f"env {ENV_VISIBLE}"
    if hook and visible is None and env.get(ENV_LEGACY_CUDA) and not env.get(ENV_REQUIRE_CUDA):
        value = "all"
        source = f"env {ENV_LEGACY_CUDA} without {ENV_VISIBLE} (NVIDIA's legacy-image rule: all)"
    ids, problem = env_ids(value)
    channel = CHANNEL_ENV
    if hook and not kubernetes:
        channel, source = CHANNEL_DOCKER, f"docker --gpus (NVIDIA's prestart hook); {source}"
    elif hook:
        source += " (NVIDIA's prestart hook in a Kubernetes container: an env request)"
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


def privileged(spec: dict[str, Any]) -> bool:
    """Whether the spec is what engines write for a privileged container: the capabilities of
    :data:`PRIVILEGED_CAPS` in the bounding set and the device cgroup open to every device."""
    process = spec.get("process")
    caps = process.get("capabilities") if isinstance(process, dict) else None
    bounding = caps.get("bounding") if isinstance(caps, dict) else None
    if not isinstance(bounding, list) or not all(c in bounding for c in PRIVILEGED_CAPS):
        return False
    linux = spec.get("linux")
    resources = linux.get("resources") if isinstance(linux, dict) else None
    rules = resources.get("devices") if isinstance(resources, dict) else None
    return _devices_open(rules)


def _devices_open(rules: Any) -> bool:
    """Whether device cgroup rules, applied in order as runc does, leave every device open for
    read, write and mknod: a last rule for all devices allows ``rwm`` and no rule denies after."""
    open_all = False
    for rule in rules if isinstance(rules, list) else ():
        if not isinstance(rule, dict):
            return False
        every = rule.get("type") in (None, "", "a") and all(
            rule.get(k) in (None, -1) for k in ("major", "minor")
        )
        if rule.get("allow") is True:
            if every and set("rwm") <= set(str(rule.get("access") or "rwm")):
                open_all = True
        elif rule.get("allow") is False or not every:
            open_all = False
    return open_all

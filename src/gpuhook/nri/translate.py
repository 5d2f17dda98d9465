"""NRI's pod and container <-> the spec the core decides on (pure).

One direction builds, from what the engine hands a plugin (the container's env, mounts, devices,
hooks, user and annotations, and the pod's identity), the raw spec dict that the runtime shim
parses from ``config.json``, so that :func:`gpuhook.pipeline.flow.run` decides it with every
rule written once. The other turns the core's answer into an NRI container adjustment: the
difference between that spec and the core's new spec (:func:`gpuhook.pipeline.apply.apply` is
the one interpreter of edits), in NRI's terms: env set and removed, device nodes (NRI adds
each one's cgroup rule), mounts added or removed, hooks added. This module is the NRI
front end's one translation point (docs/architecture.md, "Layers and front ends").

What NRI cannot express is refused with one line (:class:`Unadjustable`) rather than left
half done: removing an OCI hook (NRI only adds hooks), or an env variable set more than once in
the spec whose last value an NRI env adjustment would not replace.

The pod's identity comes from the engine (NRI's pod uid, namespace and name, and the
container's name): for containerd it is written as containerd's own identity annotations
(``io.kubernetes.cri.*``, which containerd also writes into the spec), over any value there.
The pod's ``gpuhook.io/*`` annotations (MPS limits) are added as containerd adds them in
runtime mode (``pod_annotations``, written by ``gpuhook runtime configure``); a container's own
annotation of the same key wins, as there.
NRI shows no capabilities, so a container never counts as privileged here (it gets at most what
the kubelet allocated to it).
"""

from __future__ import annotations

from gpuhook.pipeline.identity import CONTAINER, CONTAINERD, ENGINE_KEYS
from gpuhook.pipeline.request import GPUHOOK_ANNOTATION_PREFIX

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.nri import nri_api_pb2 as api

HOOK_PHASES = (
    ("prestart", "prestart"),
    ("createRuntime", "create_runtime"),
    ("createContainer", "create_container"),
    ("startContainer", "start_container"),
    ("poststart", "poststart"),
    ("poststop", "poststop"),
)


class Unadjustable(Exception):
    """An edit NRI cannot make; ``str()`` is one line."""


# --- NRI -> spec ------------------------------------------------------------------------------


def spec_of(pod: api.PodSandbox, ctr: api.Container, runtime: str = CONTAINERD) -> dict[str, Any]:
    """The raw OCI spec dict of the container, as far as NRI shows it (the shape the shim
    parses). ``runtime``: the engine (its identity annotations are written from NRI's pod)."""
    process: dict[str, Any] = {"args": list(ctr.args), "env": list(ctr.env)}
    if ctr.HasField("user"):
        process["user"] = {
            "uid": ctr.user.uid,
            "gid": ctr.user.gid,
            "additionalGids": list(ctr.user.additional_gids),
        }
    annotations = {
        k: v for k, v in pod.annotations.items() if k.startswith(GPUHOOK_ANNOTATION_PREFIX)
    }
    annotations.update(ctr.annotations)
    if runtime == CONTAINERD:
        keys = ENGINE_KEYS[CONTAINERD]
        annotations.update(
            {
                keys["type"]: CONTAINER,
                keys["uid"]: pod.uid,
                keys["namespace"]: pod.namespace,
                keys["pod"]: pod.name,
                keys["container"]: ctr.name,
            }
        )
    linux = ctr.linux
    return {
        "ociVersion": "1.0.2",
        "process": process,
        "mounts": [_mount(m) for m in ctr.mounts],
        "annotations": annotations,
        "hooks": {
            oci: [_hook(h) for h in getattr(ctr.hooks, field)]
            for oci, field in HOOK_PHASES
            if getattr(ctr.hooks, field)
        },
        "linux": {
            "namespaces": [{"type": n.type, "path": n.path} for n in linux.namespaces],
            "devices": [_device(d) for d in linux.devices],
            "resources": {"devices": [_rule(r) for r in linux.resources.devices]},
        },
    }


def _mount(m: api.Mount) -> dict[str, Any]:
    return {
        "destination": m.destination,
        "type": m.type,
        "source": m.source,
        "options": list(m.options),
    }


def _hook(h: api.Hook) -> dict[str, Any]:
    out: dict[str, Any] = {"path": h.path, "args": list(h.args), "env": list(h.env)}
    if h.HasField("timeout"):
        out["timeout"] = h.timeout.value
    return out


def _device(d: api.LinuxDevice) -> dict[str, Any]:
    out: dict[str, Any] = {"path": d.path, "type": d.type, "major": d.major, "minor": d.minor}
    for key, field in (("fileMode", "file_mode"), ("uid", "uid"), ("gid", "gid")):
        if d.HasField(field):
            out[key] = getattr(d, field).value
    return out


def _rule(r: api.LinuxDeviceCgroup) -> dict[str, Any]:
    out: dict[str, Any] = {"allow": r.allow, "type": r.type, "access": r.access}
    if r.HasField("major"):
        out["major"] = r.major.value
    if r.HasField("minor"):
        out["minor"] = r.minor.value
    return out


# --- spec difference -> NRI adjustment --------------------------------------------------------


def adjustment(old: dict[str, Any], new: dict[str, Any]) -> api.ContainerAdjustment:
    """The NRI adjustment that turns ``old`` (from :func:`spec_of`) into the core's ``new``.
    Raises :class:`Unadjustable`."""
    from gpuhook.nri import nri_api_pb2 as api

    adjust = api.ContainerAdjustment()
    adjust.env.extend(_env_edits(_list(old, "process", "env"), _list(new, "process", "env")))
    old_paths = {d.get("path") for d in _list(old, "linux", "devices")}
    for dev in _list(new, "linux", "devices"):
        if dev.get("path") not in old_paths:
            adjust.linux.devices.append(_nri_device(dev))
    _mount_edits(adjust, _list(old, "mounts"), _list(new, "mounts"))
    _hook_edits(adjust, old.get("hooks") or {}, new.get("hooks") or {})
    return adjust


def _list(spec: dict[str, Any], *keys: str) -> list[Any]:
    value: Any = spec
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, list) else []


def effective_env(env: list[Any]) -> dict[str, str]:
    """What the process sees: the last value of each variable (as runc passes it on)."""
    out: dict[str, str] = {}
    for entry in env:
        if isinstance(entry, str) and "=" in entry:
            key, _, value = entry.partition("=")
            out[key] = value
    return out


def _env_edits(old: list[Any], new: list[Any]) -> list[api.KeyValue]:
    """Env set or removed, checked against how the engine applies them
    (:func:`nri_env_result`). Raises :class:`Unadjustable`."""
    from gpuhook.nri import nri_api_pb2 as api

    before, after = effective_env(old), effective_env(new)
    edits = [api.KeyValue(key=k, value=v) for k, v in after.items() if before.get(k) != v]
    edits += [api.KeyValue(key="-" + k) for k in before if k not in after]
    if edits and effective_env(nri_env_result(old, edits)) != after:
        names = sorted({e.key.lstrip("-") for e in edits})
        raise Unadjustable(
            f"the container's env holds {', '.join(names)} more than once and an NRI env "
            "adjustment cannot replace the last value; refusing rather than leaving it"
        )
    return edits


def nri_env_result(env: list[Any], edits: list[api.KeyValue]) -> list[str]:
    """The env an engine makes of ``env`` and NRI env ``edits`` (NRI's runtime-tools generator,
    v0.12.0: each entry re-added by key, so that a repeated key keeps one place and its last
    value; the first entry of an edited key takes the edit; unseen keys are appended)."""
    mod = {e.key.lstrip("-"): e for e in edits}
    out: list[str] = []

    def add(key: str, value: str) -> None:
        for i, entry in enumerate(out):
            if entry.partition("=")[0] == key:
                out[i] = f"{key}={value}"
                return
        out.append(f"{key}={value}")

    for entry in env:
        if not isinstance(entry, str) or "=" not in entry:
            continue
        key, _, value = entry.partition("=")
        edit = mod.pop(key, None)
        if edit is None:
            add(key, value)
        elif not edit.key.startswith("-"):
            add(key, edit.value)
    for edit in edits:
        if not edit.key.startswith("-") and edit.key in mod:
            add(edit.key, edit.value)
    return out


def _nri_device(dev: dict[str, Any]) -> api.LinuxDevice:
    from gpuhook.nri import nri_api_pb2 as api

    out = api.LinuxDevice(
        path=dev["path"], type=dev["type"], major=dev["major"], minor=dev["minor"]
    )
    if "fileMode" in dev:
        out.file_mode.value = dev["fileMode"]
    if "uid" in dev:
        out.uid.value = dev["uid"]
    if "gid" in dev:
        out.gid.value = dev["gid"]
    return out


def _mount_edits(adjust: api.ContainerAdjustment, old: list[Any], new: list[Any]) -> None:
    """Mounts the core added (or put in place of the spec's) and destinations it freed."""
    before = {m.get("destination"): m for m in old if isinstance(m, dict)}
    after = {m.get("destination"): m for m in new if isinstance(m, dict)}
    for dest in before:
        if dest not in after:
            adjust.mounts.add(destination="-" + str(dest))
    for dest, mount in after.items():
        if before.get(dest) != mount:
            adjust.mounts.add(
                destination=dest,
                type=mount.get("type", ""),
                source=mount.get("source", ""),
                options=mount.get("options") or [],
            )


def _hook_edits(adjust: api.ContainerAdjustment, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Hooks the core added. Raises :class:`Unadjustable` for one it removed."""
    for oci, field in HOOK_PHASES:
        before, after = old.get(oci) or [], new.get(oci) or []
        gone = [h for h in before if h not in after]
        if gone:
            path = gone[0].get("path", "?") if isinstance(gone[0], dict) else "?"
            raise Unadjustable(
                f"the {oci} hook {path} must be removed from this container and NRI cannot "
                "remove an OCI hook; refusing"
            )
        for hook in after:
            if hook not in before:
                entry = getattr(adjust.hooks, field).add(
                    path=hook["path"], args=hook.get("args") or [], env=hook.get("env") or []
                )
                if "timeout" in hook:
                    entry.timeout.value = hook["timeout"]

"""Validate :class:`ContainerEdits` and apply them to a copy of an OCI spec (pure).

The one interpreter of edits, in the spirit of CDI: applying the same edits twice gives the
same spec as applying them once, unknown spec keys are kept, and the user's own entries are never
removed. Env entries replace the same variable (the container must see gpuhook's value, not the
image's); a device node, mount or hook that already exists at the same path/destination is left
as it is, except a mount at a destination listed in ``replace_mounts`` (and mounted by the
edits), which gives way to gpuhook's.
"""

from __future__ import annotations

from gpuhook.errors import SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.model.edits import ContainerEdits
    from gpuhook.model.inventory import DeviceNode


def validate(edits: ContainerEdits) -> None:
    """Reject edits that would be unsafe or that runc would misread. Raises SpecError."""
    for entry in edits.env:
        key, eq, _ = entry.partition("=")
        if not eq or not key or "\x00" in entry:
            raise SpecError(f"invalid env edit {entry!r}")
    for node in edits.device_nodes:
        _check_path("device node", node.path)
        if node.type not in ("c", "b", "u", "p"):
            raise SpecError(f"device node {node.path}: invalid type {node.type!r}")
        if node.major < 0 or node.minor < 0:
            raise SpecError(f"device node {node.path}: invalid major/minor")
    for mount in edits.mounts:
        _check_path("mount", mount.container_path)
        if mount.type == "bind" and not mount.host_path.startswith("/"):
            raise SpecError(f"mount {mount.container_path}: host path must be absolute")
    for destination in edits.replace_mounts:
        _check_path("replaced mount", destination)
    for hook in edits.hooks:
        if not hook.path.startswith("/"):
            raise SpecError(f"hook {hook.path!r}: path must be absolute")
        if hook.hook_name not in (
            "prestart",
            "createRuntime",
            "createContainer",
            "startContainer",
            "poststart",
            "poststop",
        ):
            raise SpecError(f"hook {hook.path}: unknown hook name {hook.hook_name!r}")


def _check_path(what: str, path: str) -> None:
    if not path.startswith("/") or "\x00" in path:
        raise SpecError(f"{what} path {path!r} must be absolute")
    if any(part == ".." for part in path.split("/")):
        raise SpecError(f"{what} path {path!r} must not contain '..'")


def copy_json(value: Any) -> Any:
    """Deep copy of JSON data (cheaper than :mod:`copy`, which costs milliseconds to import)."""
    if isinstance(value, dict):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_json(v) for v in value]
    return value


def _obj(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        if value is not None:
            raise SpecError(f"config.json: {key} is not an object")
        value = parent[key] = {}
    return value


def _list(parent: dict[str, Any], key: str) -> list[Any]:
    value = parent.get(key)
    if not isinstance(value, list):
        if value is not None:
            raise SpecError(f"config.json: {key} is not a list")
        value = parent[key] = []
    return value


def apply(spec: dict[str, Any], edits: ContainerEdits) -> dict[str, Any]:
    """A new spec with ``edits`` applied; ``spec`` is not modified."""
    validate(edits)
    out: dict[str, Any] = copy_json(spec)
    if edits.env:
        env = _list(_obj(out, "process"), "env")
        for entry in edits.env:
            _set_env(env, entry)
    if edits.device_nodes:
        _add_device_nodes(_obj(out, "linux"), edits.device_nodes)
    if edits.mounts:
        _add_mounts(_list(out, "mounts"), edits)
    if edits.hooks:
        hooks = _obj(out, "hooks")
        for hook in edits.hooks:
            entries = _list(hooks, hook.hook_name)
            oci = hook.to_oci()
            if oci not in entries:
                entries.append(oci)
    if edits.remove_hooks and isinstance(out.get("hooks"), dict):
        _remove_prestart_hooks(out["hooks"], edits.remove_hooks)
    return out


def _add_device_nodes(linux: dict[str, Any], nodes: tuple[DeviceNode, ...]) -> None:
    """Each node not already at its path, with its cgroup allow rule."""
    devices = _list(linux, "devices")
    rules = _list(_obj(linux, "resources"), "devices")
    existing = device_paths(devices)
    for node in nodes:
        if node.path in existing:
            continue
        existing.add(node.path)
        devices.append(
            {
                "path": node.path,
                "type": node.type,
                "major": node.major,
                "minor": node.minor,
                "fileMode": node.mode,
                "uid": 0,
                "gid": 0,
            }
        )
        rule = {
            "allow": True,
            "type": node.type,
            "major": node.major,
            "minor": node.minor,
            "access": "rwm",
        }
        if rule not in rules:
            rules.append(rule)


def _add_mounts(mounts: list[Any], edits: ContainerEdits) -> None:
    """Each mount whose destination is free (after dropping those ``replace_mounts`` names)."""
    replaced = _replaced(edits)
    if replaced:
        mounts[:] = [
            m for m in mounts if not (isinstance(m, dict) and m.get("destination") in replaced)
        ]
    taken = taken_destinations(mounts, edits)
    for mount in edits.mounts:
        if mount.container_path in taken:
            continue
        taken.add(mount.container_path)
        mounts.append(
            {
                "destination": mount.container_path,
                "type": mount.type,
                "source": mount.host_path,
                "options": list(mount.options),
            }
        )


def _remove_prestart_hooks(hooks: dict[str, Any], basenames: tuple[str, ...]) -> None:
    prestart = hooks.get("prestart")
    if isinstance(prestart, list):
        hooks["prestart"] = [
            h
            for h in prestart
            if not (
                isinstance(h, dict)
                and isinstance(h.get("path"), str)
                and h["path"].rsplit("/", 1)[-1] in basenames
            )
        ]


def device_paths(devices: Any) -> set[str]:
    """The device node paths a spec's ``linux.devices`` holds: apply adds no node at one."""
    listed = devices if isinstance(devices, list) else ()
    return {d["path"] for d in listed if isinstance(d, dict) and isinstance(d.get("path"), str)}


def taken_destinations(mounts: Any, edits: ContainerEdits) -> set[str]:
    """The mount destinations a spec holds that ``edits`` does not replace: apply adds no mount
    at one."""
    replaced = _replaced(edits)
    listed = mounts if isinstance(mounts, list) else ()
    return {
        m["destination"]
        for m in listed
        if isinstance(m, dict)
        and isinstance(m.get("destination"), str)
        and m["destination"] not in replaced
    }


def _replaced(edits: ContainerEdits) -> set[str]:
    """The destinations whose spec mounts give way: named in ``replace_mounts`` and mounted by
    ``edits`` (a replacement without gpuhook's own mount there removes nothing)."""
    return set(edits.replace_mounts) & {m.container_path for m in edits.mounts}


def _set_env(env: list[Any], entry: str) -> None:
    """Set one variable: replace its first occurrence in place, drop any later duplicates."""
    key = entry.partition("=")[0] + "="
    first = -1
    i = 0
    while i < len(env):
        item = env[i]
        if isinstance(item, str) and item.startswith(key):
            if first < 0:
                first = i
                env[i] = entry
            else:
                del env[i]
                continue
        i += 1
    if first < 0:
        env.append(entry)

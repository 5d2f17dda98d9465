"""Read config.json as runc reads it, or refuse it (pure, stdlib only).

runc decodes the spec with Go's ``encoding/json``, whose struct fields match object keys
case-insensitively (``"Hooks": {"Prestart": [...]}`` is a prestart hook to runc; Go folds ASCII
case, and the long s U+017F and the Kelvin sign U+212A fold to S and K too), where its dicts
match exactly. A spec whose keys spell a field of the OCI structs gpuhook reads in any other way
than the spec's own spelling is refused, so gpuhook and runc never read two different specs.
(Repeated keys, which Go merges and Python overwrites, are refused when the spec is parsed:
:func:`gpuhook.runtime.ocispec.parse`.) Maps (``annotations``) and string lists (``env``) are
case-sensitive in Go too, and are not checked here.
"""

from __future__ import annotations

from gpuhook.errors import SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The JSON names of the OCI runtime-spec structs (specs-go/config.go) that the decision or the
# edits read or write; their objects are checked wherever they appear.
_SPEC = ("ociVersion", "process", "root", "hostname", "domainname", "mounts", "hooks",
         "annotations", "linux")  # fmt: skip
_PROCESS = ("terminal", "consoleSize", "user", "args", "commandLine", "env", "cwd",
            "capabilities", "rlimits", "noNewPrivileges", "apparmorProfile", "oomScoreAdj",
            "selinuxLabel", "scheduler", "ioPriority", "execCPUAffinity")  # fmt: skip
_CAPABILITIES = ("bounding", "effective", "inheritable", "permitted", "ambient")
_MOUNT = ("destination", "type", "source", "options", "uidMappings", "gidMappings")
_HOOKS = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart",
          "poststop")  # fmt: skip
_HOOK = ("path", "args", "env", "timeout")
_ROOT = ("path", "readonly")
_LINUX = ("uidMappings", "gidMappings", "sysctl", "resources", "cgroupsPath", "namespaces",
          "devices", "seccomp", "rootfsPropagation", "maskedPaths", "readonlyPaths",
          "mountLabel", "intelRdt", "personality", "timeOffsets")  # fmt: skip
_RESOURCES = ("devices", "memory", "cpu", "pids", "blockIO", "hugepageLimits", "network", "rdma",
              "unified")  # fmt: skip
_DEVICE_RULE = ("allow", "type", "major", "minor", "access")
_DEVICE = ("path", "type", "major", "minor", "fileMode", "uid", "gid")

_GO_FOLD = {"\u017f": "S", "\u212a": "K"}  # the non-ASCII runes whose fold is an ASCII letter


def fold(key: str) -> str:
    """``key`` as Go's encoding/json compares field names: ASCII upper case, with the two
    non-ASCII runes that fold to ASCII letters mapped to them."""
    if key.isascii():
        return key.upper()
    return "".join(_GO_FOLD.get(c, c.upper() if c.isascii() else c) for c in key)


def _folded(names: tuple[str, ...]) -> dict[str, str]:
    """The fields of one struct by their fold (no two fold alike: each is its own field)."""
    folded = {fold(n): n for n in names}
    if len(folded) != len(names):
        raise ValueError(f"two field names fold alike: {names}")
    return folded


# Each struct's fields by their fold, made once: a spec is checked on every create.
_FOLDED: dict[tuple[str, ...], dict[str, str]] = {
    names: _folded(names)
    for names in (_SPEC, _PROCESS, _CAPABILITIES, _MOUNT, _HOOKS, _HOOK, _ROOT, _LINUX,
                  _RESOURCES, _DEVICE_RULE, _DEVICE)
}  # fmt: skip


def check(spec: dict[str, Any]) -> None:
    """Raise :class:`SpecError` (one line) when a key of a checked object is a field's name in
    another spelling."""
    _fields(spec, _SPEC, "")
    process = spec.get("process")
    if isinstance(process, dict):
        _fields(process, _PROCESS, "process")
        _fields(process.get("capabilities"), _CAPABILITIES, "process.capabilities")
    _fields(spec.get("root"), _ROOT, "root")
    _items(spec.get("mounts"), _MOUNT, "mounts")
    hooks = spec.get("hooks")
    if isinstance(hooks, dict):
        _fields(hooks, _HOOKS, "hooks")
        for name in _HOOKS:
            _items(hooks.get(name), _HOOK, f"hooks.{name}")
    linux = spec.get("linux")
    if isinstance(linux, dict):
        _fields(linux, _LINUX, "linux")
        _items(linux.get("devices"), _DEVICE, "linux.devices")
        resources = linux.get("resources")
        if isinstance(resources, dict):
            _fields(resources, _RESOURCES, "linux.resources")
            _items(resources.get("devices"), _DEVICE_RULE, "linux.resources.devices")


def _items(value: Any, names: tuple[str, ...], where: str) -> None:
    for i, item in enumerate(value if isinstance(value, list) else ()):
        _fields(item, names, f"{where}[{i}]")


def _fields(obj: Any, names: tuple[str, ...], where: str) -> None:
    if not isinstance(obj, dict):
        return
    folded = _FOLDED[names]
    for key in obj:
        if key in names:
            continue  # the field's own spelling (folds differ between fields: _folded)
        field = folded.get(fold(key))
        if field is not None and field != key:
            at = f"{where}.{key}" if where else key
            raise SpecError(
                f"config.json: key {at!r} is the field {field!r} to runc (Go matches field names "
                "case-insensitively): refused, so that gpuhook and runc read the same spec"
            )

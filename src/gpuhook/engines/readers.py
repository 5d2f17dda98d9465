"""Read-only views of the container engines' configs: is gpuhook-runtime registered, and is it
the default runtime? (``gpuhook doctor``.)

docker: ``/etc/docker/daemon.json``, ``runtimes.<name>.path`` (or, for docker 23+ shim-style
entries, ``runtimes.<name>.options.BinaryName``) and ``default-runtime`` (runc when absent).
containerd: ``/etc/containerd/config.toml``, config version 2 (containerd 1.x, CRI plugin
``io.containerd.grpc.v1.cri``), 3 (containerd 2.0-2.2) or 4 (containerd 2.3+; both
``io.containerd.cri.v1.runtime``):
``<plugin>.containerd.runtimes.<name>.options.BinaryName`` and
``<plugin>.containerd.default_runtime_name`` (runc when absent), including the files named by
``imports`` (version 2 replaces a whole plugin section with an imported one, versions 3 and 4
merge key by key); and the CRI plugin's CDI settings, ``enable_cdi`` (off by default in containerd
1.7, on in 2.x) and ``cdi_spec_dirs`` (default ``/etc/cdi``, ``/var/run/cdi``), which sit in the
same plugin table as ``containerd``.
podman: ``/etc/containers/containers.conf``, ``engine.runtimes.<name>`` (a list of paths tried in
order) and ``engine.runtime`` (podman's own default, crun or runc, when absent); podman 4.x reads
CDI specs from ``/etc/cdi`` and ``/var/run/cdi``.

All the reading of these formats lives here, so that it can later share its parsing with
the module that writes them (``gpuhook runtime configure``).
"""

from __future__ import annotations

import glob
import json
import os
import tomllib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

# The engines gpuhook registers with: their names, default configs, the systemd service to
# restart after an edit ("" for podman, which reads containers.conf on every command) and the
# executable whose presence says the engine is installed. The one table of engines.
DOCKER = "docker"
CONTAINERD = "containerd"
PODMAN = "podman"
ENGINES = (DOCKER, CONTAINERD, PODMAN)
DEFAULT_PATHS = {
    DOCKER: "/etc/docker/daemon.json",
    CONTAINERD: "/etc/containerd/config.toml",
    PODMAN: "/etc/containers/containers.conf",
}
SERVICE = {DOCKER: "docker", CONTAINERD: "containerd", PODMAN: ""}
DAEMON = {DOCKER: "dockerd", CONTAINERD: "containerd", PODMAN: "podman"}
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
RUNTIME_BASENAME = "gpuhook-runtime"
# Config version 2: containerd 1.x; 3: containerd 2.0-2.2; 4: containerd 2.3+ (the top-level
# grpc/ttrpc/debug/metrics tables moved into plugins; the CRI runtime plugin did not move).
CRI_PLUGIN = {
    2: "io.containerd.grpc.v1.cri",
    3: "io.containerd.cri.v1.runtime",
    4: "io.containerd.cri.v1.runtime",
}
MAX_BYTES = 4 * 1024 * 1024


class Registration:
    """What one engine config says about runtimes.

    ``runtimes``: every runtime name with the executable it runs ("" when none is named);
    ``default``: the default runtime's name; ``error``: a one-line reason the file could not
    be read ("" when it could); ``exists``: whether the file exists at all. ``cdi``: whether the
    engine resolves CDI devices itself, and ``cdi_dirs`` the folders it reads specs from.
    """
    def __init__(
        self,
        engine: str,
        path: str,
        exists: bool,
        runtimes: dict[str, str] | None = None,
        default: str = "runc",
        error: str = "",
        version: int | None = None,
        cdi: bool = False,
        cdi_dirs: tuple[str, ...] = (),
    ) -> None:
        self.engine = engine
        self.cdi = cdi
        self.cdi_dirs = cdi_dirs
        self.path = path
        self.exists = exists
        self.runtimes = runtimes or {}
        self.default = default
        self.error = error
        self.version = version

    @property
    def gpuhook_runtimes(self) -> dict[str, str]:
        """The runtimes that run gpuhook-runtime (by the executable's name)."""
        return {
            name: path
            for name, path in self.runtimes.items()
            if os.path.basename(path) == RUNTIME_BASENAME
        }

    @property
    def default_is_gpuhook(self) -> bool:
        return self.default in self.gpuhook_runtimes


def _read(path: str) -> tuple[bytes | None, str]:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"cannot read: {exc.strerror}"
    if len(data) > MAX_BYTES:
        return None, "larger than 4 MiB"
    return data, ""


def read_docker(path: str) -> Registration:
    data, error = _read(path)
    if data is None:
        return Registration(DOCKER, path, bool(error), error=error)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        return Registration(DOCKER, path, True, error=f"not valid JSON: {exc}")
    if not isinstance(doc, dict):
        return Registration(DOCKER, path, True, error="the top level is not a JSON object")
    runtimes: dict[str, str] = {}
    raw = doc.get("runtimes")
    if raw is not None and not isinstance(raw, dict):
        return Registration(DOCKER, path, True, error="'runtimes' is not an object")
    for name, entry in (raw or {}).items():
        binary = ""
        if isinstance(entry, dict):
            binary = entry.get("path") or ""
            options = entry.get("options")
            if not binary and isinstance(options, dict):
                binary = options.get("BinaryName") or ""
        runtimes[str(name)] = binary if isinstance(binary, str) else ""
    default = doc.get("default-runtime") or "runc"
    return Registration(DOCKER, path, True, runtimes, str(default))


def _load_toml(data: bytes) -> dict[str, Any]:
    return tomllib.loads(data.decode("utf-8"))


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _imports(doc: dict[str, Any], path: str, version: int) -> str:
    """Fold the files named by ``imports`` into ``doc``; returns a one-line error or ""."""

    patterns = doc.get("imports") or []
    if not isinstance(patterns, list):
        return "'imports' is not a list"
    base = os.path.dirname(os.path.abspath(path))
    for pattern in patterns:
        if not isinstance(pattern, str):
            return "'imports' holds something other than paths"
        full = pattern if os.path.isabs(pattern) else os.path.join(base, pattern)
        for name in sorted(glob.glob(full)):
            data, error = _read(name)
            if data is None:
                return f"import {name}: {error or 'not found'}"
            try:
                imported = _load_toml(data)
            except (ValueError, UnicodeDecodeError) as exc:
                return f"import {name}: not valid TOML: {exc}"
            theirs = imported.get("version", 1)
            if isinstance(theirs, int) and theirs > version:
                return (
                    f"import {name}: config version {theirs} is higher than this file's "
                    f"({version}): containerd 2.x refuses to start"
                )
            plugins = imported.get("plugins")
            if version == 2 and isinstance(plugins, dict):
                # containerd 1.x: an imported plugin section replaces the main file's.
                doc.setdefault("plugins", {}).update(plugins)
                imported = {k: v for k, v in imported.items() if k != "plugins"}
            imported.pop("imports", None)
            imported.pop("version", None)
            _merge(doc, imported)
    return ""


def read_containerd(path: str) -> Registration:
    data, error = _read(path)
    if data is None:
        return Registration(CONTAINERD, path, bool(error), error=error)
    try:
        doc = _load_toml(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return Registration(CONTAINERD, path, True, error=f"not valid TOML: {exc}")
    version = doc.get("version", 1)
    if version not in CRI_PLUGIN:
        return Registration(
            CONTAINERD,
            path,
            True,
            error=f"config version {version} is not supported (gpuhook reads versions 2, 3 and 4; "
            "containerd config migrate converts older files)",
            version=version if isinstance(version, int) else None,
        )
    error = _imports(doc, path, version)
    if error:
        return Registration(CONTAINERD, path, True, error=error, version=version)
    plugin: Any = doc
    for key in ("plugins", CRI_PLUGIN[version]):
        plugin = plugin.get(key) if isinstance(plugin, dict) else None
    plugin = plugin if plugin is not None else {}
    section = plugin.get("containerd", {}) if isinstance(plugin, dict) else None
    if not isinstance(section, dict):
        return Registration(
            CONTAINERD, path, True, error="the CRI containerd section is not a table"
        )
    runtimes: dict[str, str] = {}
    raw = section.get("runtimes") or {}
    if isinstance(raw, dict):
        for name, entry in raw.items():
            options = entry.get("options") if isinstance(entry, dict) else None
            binary = options.get("BinaryName") if isinstance(options, dict) else ""
            runtimes[str(name)] = binary if isinstance(binary, str) else ""
    default = section.get("default_runtime_name") or "runc"
    cdi, dirs = cdi_settings(plugin, version)
    return Registration(
        CONTAINERD, path, True, runtimes, str(default), version=version, cdi=cdi, cdi_dirs=dirs
    )


def cdi_settings(plugin: dict[str, Any], version: int) -> tuple[bool, tuple[str, ...]]:
    """``enable_cdi`` (default: on in containerd 2.x's versions 3 and 4, off in 1.7's version 2) and
    ``cdi_spec_dirs`` of the CRI plugin table."""
    enabled = plugin.get("enable_cdi", version >= 3)
    dirs = plugin.get("cdi_spec_dirs", list(CDI_SPEC_DIRS))
    if not isinstance(dirs, list):
        dirs = []
    return enabled is True, tuple(d for d in dirs if isinstance(d, str))


def read_podman(path: str) -> Registration:
    data, error = _read(path)
    if data is None:
        return Registration(
            PODMAN, path, bool(error), error=error, cdi=True, cdi_dirs=CDI_SPEC_DIRS
        )
    try:
        doc = _load_toml(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return Registration(PODMAN, path, True, error=f"not valid TOML: {exc}")
    engine = doc.get("engine", {})
    raw = engine.get("runtimes", {}) if isinstance(engine, dict) else None
    if not isinstance(raw, dict):
        return Registration(PODMAN, path, True, error="'engine.runtimes' is not a table")
    runtimes: dict[str, str] = {}
    for name, paths in raw.items():
        listed = [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else []
        ours = [p for p in listed if os.path.basename(p) == RUNTIME_BASENAME]
        runtimes[str(name)] = (ours or listed or [""])[0]
    default = engine.get("runtime") or "crun"
    return Registration(
        PODMAN, path, True, runtimes, str(default), cdi=True, cdi_dirs=CDI_SPEC_DIRS
    )


def read(engine: str, path: str) -> Registration:
    if engine == PODMAN:
        return read_podman(path)
    return read_docker(path) if engine == DOCKER else read_containerd(path)

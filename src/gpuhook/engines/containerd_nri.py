"""containerd's NRI settings, read-only (``gpuhook doctor``'s NRI mode check).

``[plugins.'io.containerd.nri.v1.nri']``: ``disable`` (default off in containerd 2.x, config
version 3; on in 1.7, version 2), ``socket_path`` (default ``/var/run/nri/nri.sock``), and its
``default_validator`` table: ``enable`` and ``required_plugins`` (names, or ``idx-name``),
which make containerd refuse a create while a required plugin is not registered. The file's
``imports`` are followed as :func:`gpuhook.engines.readers.read_containerd` follows them.
"""

from __future__ import annotations

from typing import Any

from gpuhook.engines import readers

NRI_PLUGIN = "io.containerd.nri.v1.nri"
DEFAULT_SOCKET = "/var/run/nri/nri.sock"


class NriSettings:
    """``enabled``: NRI is on; ``socket``: its socket; ``required``: the plugins the default
    validator requires (empty when the validator is off); ``error``: why the file could not be
    read ("" when it could)."""

    def __init__(
        self,
        enabled: bool = False,
        socket: str = DEFAULT_SOCKET,
        required: tuple[str, ...] = (),
        error: str = "",
    ) -> None:
        self.enabled = enabled
        self.socket = socket
        self.required = required
        self.error = error

    def requires(self, name: str) -> bool:
        """Whether the validator requires plugin ``name`` (as a name or ``NN-name``)."""
        return any(r == name or r.partition("-")[2] == name for r in self.required)


def read(path: str) -> NriSettings:
    data, error = readers._read(path)
    if data is None:
        return NriSettings(error=error or f"{path} not found")
    try:
        doc = readers._load_toml(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return NriSettings(error=f"not valid TOML: {exc}")
    version = doc.get("version", 1)
    if version not in readers.CRI_PLUGIN:
        return NriSettings(error=f"config version {version} is not supported")
    error = readers._imports(doc, path, version)
    if error:
        return NriSettings(error=error)
    plugins = doc.get("plugins")
    table: Any = plugins.get(NRI_PLUGIN) if isinstance(plugins, dict) else None
    table = table if isinstance(table, dict) else {}
    enabled = table.get("disable", version != 3) is not True
    socket = table.get("socket_path", DEFAULT_SOCKET)
    validator = table.get("default_validator")
    required: tuple[str, ...] = ()
    if isinstance(validator, dict) and validator.get("enable") is True:
        names = validator.get("required_plugins") or []
        required = tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()
    return NriSettings(enabled, socket if isinstance(socket, str) else DEFAULT_SOCKET, required)

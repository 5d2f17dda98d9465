"""containerd's own reading of its config: ``containerd --config <file> config dump`` prints the
merged config (the root file with every import folded in, migrated to the running containerd's
config version: 2 for 1.x, 4 for 2.3) or fails with the line containerd would fail to start
with. ``gpuhook runtime configure`` reads runc's options from it (the options a new gpuhook
runtime must carry: ``SystemdCgroup``, ``Root``...; a drop-in may set them, not the root file)
and, after writing, checks that containerd reads what was meant (:func:`problems`); the file
side restores every file when it does not (:mod:`gpuhook.engines.configure`).

A dump that succeeds is not enough: NVIDIA's toolkit wrote a version-3 drop-in whose runtime
had no ``runtime_type`` (NVIDIA/nvidia-container-toolkit#1956), which containerd loads and then
fails every pod with; and a drop-in of a higher version than the root file stops containerd
(NVIDIA/aicr#1688, "drop-in config version 4 higher than root config version 2").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from typing import TYPE_CHECKING

from gpuhook.engines.common import RUNC, RUNC_TYPE
from gpuhook.engines.readers import CRI_PLUGIN, RUNTIME_BASENAME

if TYPE_CHECKING:
    from typing import Any

TIMEOUT = 30.0


class DumpError(Exception):
    """``containerd config dump`` failed: the one line why."""


def binary(path: str | None) -> str | None:
    """The containerd executable to ask: ``path`` when given, else ``containerd`` on PATH;
    None when there is none."""
    if path:
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which("containerd")


def dump(containerd: str, config_path: str) -> dict[str, Any]:
    """The merged config as containerd reads ``config_path``. Raises :class:`DumpError`."""
    try:
        proc = subprocess.run(
            [containerd, "--config", config_path, "config", "dump"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DumpError(f"{containerd} config dump: {exc}") from None
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        why = lines[-1] if lines else f"exit status {proc.returncode}"
        raise DumpError(f"containerd config dump: {why}")
    try:
        return tomllib.loads(proc.stdout)
    except tomllib.TOMLDecodeError as exc:
        raise DumpError(f"containerd config dump printed no TOML ({exc})") from None


def cri_section(merged: dict[str, Any]) -> dict[str, Any]:
    """The CRI plugin's ``containerd`` table of a dump ({} when absent)."""
    plugin = CRI_PLUGIN.get(merged.get("version", 2), CRI_PLUGIN[2])
    node: Any = merged
    for key in ("plugins", plugin, "containerd"):
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _options(runtime: Any) -> dict[str, Any]:
    options = runtime.get("options") if isinstance(runtime, dict) else None
    return options if isinstance(options, dict) else {}


def source_runtime(merged: dict[str, Any]) -> str:
    """The runtime whose options gpuhook's carries: the default runtime when it is a runc
    runtime other than gpuhook's, else runc."""
    cri = cri_section(merged)
    runtimes = cri.get("runtimes") if isinstance(cri.get("runtimes"), dict) else {}
    default = cri.get("default_runtime_name") or RUNC
    entry = runtimes.get(default) if isinstance(runtimes, dict) else None
    if (
        isinstance(entry, dict)
        and entry.get("runtime_type") == RUNC_TYPE
        and os.path.basename(str(_options(entry).get("BinaryName") or "")) != RUNTIME_BASENAME
    ):
        return str(default)
    return RUNC


def runc_options(merged: dict[str, Any]) -> dict[str, Any]:
    """The options the merged config gives the runtime gpuhook copies from, minus BinaryName
    (containerd 2.x's dump lists every option, zero values included)."""
    cri = cri_section(merged)
    runtimes = cri.get("runtimes") if isinstance(cri.get("runtimes"), dict) else {}
    entry = runtimes.get(source_runtime(merged)) if isinstance(runtimes, dict) else None
    return {k: v for k, v in _options(entry).items() if k != "BinaryName"}


def problems(
    merged: dict[str, Any],
    name: str,
    runtime_path: str,
    set_default: bool,
    options: dict[str, Any],
) -> list[str]:
    """What the merged config gets wrong about gpuhook's registration ([] when nothing)."""
    cri = cri_section(merged)
    runtimes = cri.get("runtimes") if isinstance(cri.get("runtimes"), dict) else {}
    entry = runtimes.get(name) if isinstance(runtimes, dict) else None
    if not isinstance(entry, dict):
        return [f"runtime {name} is not in the merged config"]
    found = []
    if entry.get("runtime_type") != RUNC_TYPE:
        found.append(
            f"runtime {name} has runtime_type {entry.get('runtime_type')!r}, not {RUNC_TYPE}"
        )
    have = _options(entry)
    if have.get("BinaryName") != runtime_path:
        found.append(f"runtime {name} runs {have.get('BinaryName')!r}, not {runtime_path}")
    for key, value in options.items():
        if have.get(key) != value and (key in have or value not in ("", 0, False, [], {})):
            found.append(f"runtime {name}: {key} = {have.get(key)!r}, runc has {value!r}")
    default = cri.get("default_runtime_name") or RUNC
    if set_default and default != name:
        found.append(f"the default runtime is {default}, not {name} (another file overrides it)")
    return found

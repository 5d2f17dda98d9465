"""Checks run by the Debian package's maintainer scripts (stdlib only, no config needed).

``python3 -I -m gpuhook.maintscript default-runtime-warning`` (prerm, on removal): warn on stderr
for every container engine config that still makes gpuhook the default runtime. Removing gpuhook
then leaves that engine with a default runtime whose executable is gone, and every container
fails to start, so the operator must hear about it; the package never edits those files itself.

``python3 -I -m gpuhook.maintscript configure-hint`` (postinst): print the ``gpuhook runtime
configure`` commands, unless an engine already uses gpuhook as its default runtime.

Both always exit 0: a maintainer script must not fail over an advisory message. The parsing is
deliberately small and tolerant: any table of a containerd config (v1, v2 or v3 layout, and the
files its ``imports`` name) with a ``default_runtime_name`` counts, and docker's runtimes may be
given by ``path`` or by ``options.BinaryName``.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import tomllib
from typing import Any

DOCKER_CONFIG = "/etc/docker/daemon.json"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONFIGURE_COMMANDS = (
    "gpuhook runtime configure --runtime docker --set-as-default",
    "gpuhook runtime configure --runtime containerd --set-as-default",
)


class Finding:
    """An engine config that makes gpuhook its default runtime (``problem`` empty), or that could
    not be read (``problem`` says why)."""

    def __init__(self, engine: str, path: str, detail: str, problem: str = "") -> None:
        self.engine = engine
        self.path = path
        self.detail = detail
        self.problem = problem


def _is_gpuhook(name: str, binary: Any) -> bool:
    if "gpuhook" in name:
        return True
    return isinstance(binary, str) and "gpuhook" in os.path.basename(binary)


def _binary_of(runtime: Any) -> Any:
    if not isinstance(runtime, dict):
        return None
    options = runtime.get("options")
    if isinstance(options, dict) and options.get("BinaryName"):
        return options["BinaryName"]
    return runtime.get("path") or runtime.get("runtime_engine")


def docker_default(text: str) -> str:
    """What makes gpuhook docker's default runtime in this daemon.json ("" when it is not).
    Raises ValueError when the text is not a JSON object."""
    data = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    name = data.get("default-runtime")
    if not isinstance(name, str) or not name:
        return ""
    runtimes = data.get("runtimes")
    binary = _binary_of(runtimes.get(name)) if isinstance(runtimes, dict) else None
    if not _is_gpuhook(name, binary):
        return ""
    return f'default-runtime "{name}"' + (f" -> {binary}" if binary else "")


def containerd_default(text: str) -> str:
    """The same for a containerd config.toml (any layout version). Raises ValueError on bad TOML."""
    found: list[str] = []
    _walk_containerd(tomllib.loads(text), [], found)
    return "; ".join(found)


def _walk_containerd(table: dict[str, Any], where: list[str], found: list[str]) -> None:
    name = table.get("default_runtime_name")
    runtimes = table.get("runtimes")
    section = ".".join(f'"{p}"' if "." in p else p for p in where) or "(top level)"
    if isinstance(name, str) and name:
        binary = _binary_of(runtimes.get(name)) if isinstance(runtimes, dict) else None
        if _is_gpuhook(name, binary):
            arrow = f" -> {binary}" if binary else ""
            found.append(f'default_runtime_name "{name}"{arrow} in [{section}]')
    legacy = table.get("default_runtime")  # containerd 1.x before default_runtime_name
    if isinstance(legacy, dict) and _is_gpuhook("", _binary_of(legacy)):
        found.append(f"default_runtime {_binary_of(legacy)} in [{section}]")
    for key, value in table.items():
        if isinstance(value, dict) and key != "runtimes":
            _walk_containerd(value, [*where, key], found)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _containerd_files(path: str, text: str) -> list[tuple[str, str]]:
    """The main file and the drop-ins its top-level ``imports`` names."""
    files = [(path, text)]
    try:
        imports = tomllib.loads(text).get("imports", [])
    except tomllib.TOMLDecodeError:
        return files
    for pattern in imports if isinstance(imports, list) else []:
        if not isinstance(pattern, str):
            continue
        full = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(path), pattern)
        for match in sorted(glob.glob(full)):
            body = _read(match)
            if body is not None:
                files.append((match, body))
    return files


def findings(
    docker_config: str = DOCKER_CONFIG, containerd_config: str = CONTAINERD_CONFIG
) -> list[Finding]:
    out: list[Finding] = []
    try:
        text = _read(docker_config)
        if text is not None and (detail := docker_default(text)):
            out.append(Finding("docker", docker_config, detail))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        out.append(Finding("docker", docker_config, "", _why(exc)))
    try:
        text = _read(containerd_config)
        for path, body in _containerd_files(containerd_config, text) if text is not None else []:
            try:
                if detail := containerd_default(body):
                    out.append(Finding("containerd", path, detail))
            except (ValueError, UnicodeDecodeError) as exc:
                out.append(Finding("containerd", path, "", _why(exc)))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        out.append(Finding("containerd", containerd_config, "", _why(exc)))
    return out


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return " ".join(str(exc).split()) or type(exc).__name__


def removal_warnings(found: list[Finding]) -> list[str]:
    lines = []
    for f in found:
        if f.problem:
            lines.append(
                f"gpuhook: warning: cannot parse {f.path} ({f.problem}); check by hand that "
                f"{f.engine} does not use gpuhook as its default runtime"
            )
            continue
        fix = (
            'remove "default-runtime" (or set it to "runc") and restart docker'
            if f.engine == "docker"
            else 'set default_runtime_name back to "runc" and restart containerd'
        )
        lines.append(
            f"gpuhook: WARNING: {f.path} still makes gpuhook the default runtime of {f.engine} "
            f"({f.detail}); without gpuhook every {f.engine} container will fail to start: "
            f"{fix} (this package does not edit it)"
        )
    return lines


def configure_hint(found: list[Finding]) -> list[str]:
    if any(not f.problem for f in found):
        return []
    return [
        "gpuhook: no container engine uses gpuhook yet (the package never edits their configs).",
        "gpuhook: to make it the default runtime, run one of:",
        *(f"  {command}" for command in CONFIGURE_COMMANDS),
    ]


def main(argv: list[str]) -> int:
    verb = argv[1] if len(argv) > 1 else ""
    if verb == "default-runtime-warning":
        for line in removal_warnings(findings()):
            print(line, file=sys.stderr)
    elif verb == "configure-hint":
        for line in configure_hint(findings()):
            print(line)
    else:
        print(
            "usage: python3 -m gpuhook.maintscript default-runtime-warning|configure-hint",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The peer runtime's set-up: NVIDIA's nvidia-container-runtime in CDI mode on the bench's node.

``nvidia-ctk cdi generate`` cannot run on the fake node (its NVML is a stub), so this writes the
spec it would write for the node, from the node's own description (tools/fake-node's node.json):
one device per GPU (by index and by UUID) plus ``all``, the control device nodes, a read-only
bind mount for every driver library, binary, firmware file and socket, and the
createContainer hooks of nvidia-ctk 1.20 (``create-symlinks`` for the sonames,
``enable-cuda-compat``, ``update-ldcache`` for the library folders,
``disable-device-node-modification``), all run by ``nvidia-cdi-hook``. Then the runtime's
``config.toml`` (CDI mode, that spec folder, runc), found through ``XDG_CONFIG_HOME``.
"""

from __future__ import annotations

import json
import os
from typing import Any

READ_ONLY = ["ro", "nosuid", "nodev", "rbind", "rprivate"]


def _node(entry: dict[str, Any]) -> dict[str, Any]:
    return {"path": entry["path"], "hostPath": entry["host_path"]}


def _files(truth: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for group in ("libraries", "binaries", "firmware", "sockets"):
        value = truth.get(group) or []
        items = [e for lib in value.values() for e in lib] if isinstance(value, dict) else value
        found += [e for e in items if isinstance(e, dict) and "host_path" in e and "path" in e]
    return found


def _hooks(truth: dict[str, Any], cdi_hook: str, libraries: list[dict[str, Any]]) -> list[Any]:
    links = [
        f"{lib['file']}::{lib['soname_link']}"
        for lib in libraries
        if lib.get("soname_link") and lib.get("file")
    ]
    folders = sorted({os.path.dirname(lib["path"]) for lib in libraries})

    def hook(*args: str) -> dict[str, Any]:
        return {"hookName": "createContainer", "path": cdi_hook, "args": ["nvidia-cdi-hook", *args]}

    return [
        hook("create-symlinks", *[x for link in links for x in ("--link", link)]),
        hook("enable-cuda-compat", f"--host-driver-version={truth['driver_version']}"),
        hook("update-ldcache", *[x for f in folders for x in ("--folder", f)]),
        hook("disable-device-node-modification"),
    ]


def cdi_spec(truth: dict[str, Any], cdi_hook: str) -> dict[str, Any]:
    """The CDI spec ``nvidia-ctk cdi generate`` would write for the node ``truth``."""
    files = _files(truth)
    libraries = [f for f in files if f.get("soname")]
    devices = []
    for gpu in truth["gpus"]:
        edits = {"deviceNodes": [_node(gpu["device_node"])]}
        devices += [
            {"name": str(gpu["index"]), "containerEdits": edits},
            {"name": gpu["uuid"], "containerEdits": edits},
        ]
        for mig in gpu.get("mig_devices") or []:  # the parent's node and the MIG caps nodes
            nodes = [_node(gpu["device_node"])] + [_node(n) for n in mig.get("caps_nodes", [])]
            devices.append({"name": mig["uuid"], "containerEdits": {"deviceNodes": nodes}})
    every = [_node(g["device_node"]) for g in truth["gpus"]]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every}})
    uvm = [
        {"path": p, "hostPath": os.path.join(truth["dev_root"], "dev", os.path.basename(p))}
        for p in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
        if os.path.exists(os.path.join(truth["dev_root"], "dev", os.path.basename(p)))
    ]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [_node(n) for n in truth["control_nodes"]] + uvm,
            "hooks": _hooks(truth, cdi_hook, libraries),
            "mounts": [
                {"hostPath": f["host_path"], "containerPath": f["path"], "options": READ_ONLY}
                for f in files
            ],
        },
    }


def write_peer_config(folder: str, truth: dict[str, Any], runc: str, cdi_hook: str) -> str:
    """Write the CDI spec and the runtime's config.toml under ``folder``; return the value for
    the peer's ``XDG_CONFIG_HOME``."""
    spec_dir = os.path.join(folder, "cdi")
    os.makedirs(spec_dir, exist_ok=True)
    with open(os.path.join(spec_dir, "nvidia.json"), "w") as fh:
        json.dump(cdi_spec(truth, cdi_hook), fh, indent=1)
    return write_runtime_config(os.path.join(folder, "xdg"), truth["driver_root"], runc, spec_dir)


def write_runtime_config(xdg: str, driver_root: str, runc: str, spec_dir: str) -> str:
    """NVIDIA's ``nvidia-container-runtime/config.toml`` under ``xdg``: CDI mode, the specs in
    ``spec_dir``, ``runc`` as its runtime; returns ``xdg`` (the peer's ``XDG_CONFIG_HOME``)."""
    os.makedirs(os.path.join(xdg, "nvidia-container-runtime"), exist_ok=True)
    with open(os.path.join(xdg, "nvidia-container-runtime", "config.toml"), "w") as fh:
        fh.write(
            "[nvidia-container-cli]\n"
            f'root = "{driver_root}"\n'
            "[nvidia-container-runtime]\n"
            'mode = "cdi"\n'
            'log-level = "info"\n'
            'debug = "/dev/null"\n'
            f'runtimes = ["{runc}"]\n'
            "[nvidia-container-runtime.modes.cdi]\n"
            'default-kind = "nvidia.com/gpu"\n'
            'annotation-prefixes = ["cdi.k8s.io/"]\n'
            f'spec-dirs = ["{spec_dir}"]\n'
        )
    return xdg

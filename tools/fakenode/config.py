"""gpuhook's config for the node (DIR/config.yaml): its roots, state, log, runtime, its own
runtime service socket and CDI folder (never the host's)."""

from __future__ import annotations

import json
import os
from typing import Any

from fakenode.tree import write


def yaml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a YAML flow scalar


# The node's CDI spec, in DIR/cdi, the only CDI folder its config names (never the host's /etc/cdi
# or /var/run/cdi, whose other specs would conflict or be compared).
CDI_NAME = "gpuhook-nvidia.json"


def service_socket(node: dict[str, Any]) -> str:
    """The node's own runtime service socket (nothing listens there unless a test starts
    `gpuhook runtime serve` on it; never the host's /run/gpuhook/runtime.sock). "" when the path
    is too long for a unix socket."""
    path = os.path.join(os.path.dirname(node["config"]), "runtime.sock")
    return path if len(path.encode()) <= 107 else ""


def write_config(node: dict[str, Any]) -> None:
    cdi_dir = os.path.join(os.path.dirname(node["config"]), "cdi")
    text = (
        "# gpuhook config for a fake GPU node, written by tools/fake-node\n"
        f"driver_root: {yaml_str(node['driver_root'])}\n"
        f"dev_root: {yaml_str(node['dev_root'])}\n"
        f"state_dir: {yaml_str(node['state_dir'])}\n"
        "runtime:\n"
        f"  path: {yaml_str(node['runtime'])}\n"
        f"  service: {yaml_str(service_socket(node))}\n"
        "log:\n"
        "  level: debug\n"
        f"  file: {yaml_str(node['log_file'])}\n"
        "hook:\n"
        f"  path: {yaml_str(node['hook_path'])}\n"
        "  ldconfig: /sbin/ldconfig\n"
        "cdi:\n"
        f"  output: {yaml_str(os.path.join(cdi_dir, CDI_NAME))}\n"
        f"  spec_dirs: [{yaml_str(cdi_dir)}]\n"
    )
    write(node["config"], text)

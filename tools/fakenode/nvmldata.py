"""The fake NVML library's data: the node's GPUs and MIG devices as lines (format: README.md),
and a C string literal of any text (the data is also compiled into the library)."""

from __future__ import annotations

from typing import Any

from fakenode.devices import CAP_CONFIG_MINOR, CAP_MONITOR_MINOR, PCI_SUBSYS_ID


def nvml_data(node: dict[str, Any], dev_root: str) -> str:
    lines = [
        "# fake NVML data, written by tools/fake-node (format: tools/fakenode/README.md)",
        "version 1",
        f"driver_version {node['driver_version']}",
        f"nvml_version {node['nvml_version']}",
        f"cuda_version {node['cuda_version']}",
        f"dev_root {dev_root}",
        f"caps config={CAP_CONFIG_MINOR} monitor={CAP_MONITOR_MINOR}",
    ]
    for g in node["gpus"]:
        lines.append(
            f"gpu index={g['index']} minor={g['minor']} uuid={g['uuid']} memory={g['memory']} "
            f"pci={g['pci_bus_id']} device_id=0x{g['pci_device_id']:08X} "
            f"subsys_id=0x{PCI_SUBSYS_ID:08X} cc={g['compute_capability']} "
            f"mig={int(g['mig_enabled'])} persistence={g['persistence_mode']} "
            f"compute_mode={g['compute_mode']} brand={g['brand']} name={g['name']}"
        )
    for g in node["gpus"]:
        for m in g["mig_devices"]:
            lines.append(
                f"mig gpu={g['index']} slot={m['index']} uuid={m['uuid']} gi={m['gi_id']} "
                f"ci={m['ci_id']} gi_minor={m['caps_minors'][0]} ci_minor={m['caps_minors'][1]} "
                f"memory={m['memory']} profile={m['profile']} name={m['name']}"
            )
    return "\n".join(lines) + "\n"


def c_string(text: str) -> str:
    """A C string literal (split at newlines) for any text."""
    out = []
    for line in text.splitlines(keepends=True):
        chars = []
        for ch in line:
            if ch in '\\"':
                chars.append("\\" + ch)
            elif ch == "\n":
                chars.append("\\n")
            elif " " <= ch <= "~":
                chars.append(ch)
            else:
                chars.extend(f"\\{b:03o}" for b in ch.encode())
        out.append('"' + "".join(chars) + '"')
    return " \\\n    ".join(out) or '""'

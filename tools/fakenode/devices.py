"""The fake hardware's device numbers and ids: the NVIDIA majors and minors, the nvidia-caps
minors of MIG, GPU and MIG UUIDs, PCI bus ids, MIG layouts, and the /proc files that list them."""

from __future__ import annotations

import uuid
from typing import Any

from fakenode import Fail

NVIDIA_MAJOR = 195
CTL_MINOR = 255
MODESET_MINOR = 254
DEVICE_MODE = 0o666
# The nvidia-caps minors of the real driver's /proc/driver/nvidia-caps/mig-minors table:
# config 1, monitor 2, then per GPU minor 15 GPU instances x (access + 8 compute instances).
CAP_CONFIG_MINOR = 1
CAP_MONITOR_MINOR = 2
CAP_FIRST = 3
CAP_GIS_PER_GPU = 15
CAP_CIS_PER_GI = 8
CAP_MAX_GPUS = 32
CAP_MODE_CONFIG = 0o400  # DeviceFileMode: 256
CAP_MODE_READ = 0o444  # DeviceFileMode: 292
# H100 SXM5 PCI ids and the bus numbers of an HGX H100 8-GPU board.
PCI_DEVICE_ID = 0x233010DE
PCI_SUBSYS_ID = 0x16C110DE
HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
UUID_NAMESPACE = uuid.UUID("5b0e3a52-7d1c-4b7e-9a56-3f1f6c0a9d21")
# MIG layouts of one GPU, per number of MIG devices: (profile, GPU instance id, memory eighths).
# Up to 4 devices: a mixed, valid H100 placement; 5..7: that many 1g.10gb instances (ids 7..13).
MIG_MIXED = (("3g.40gb", 2, 4), ("2g.20gb", 3, 2), ("1g.10gb", 9, 1), ("1g.10gb", 10, 1))
MAX_MIG_DEVICES = 7
MAX_GPUS = 64


def cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    base = CAP_FIRST + (gpu_minor * CAP_GIS_PER_GPU + gi) * (1 + CAP_CIS_PER_GI)
    return base if ci is None else base + 1 + ci


def mig_layout(count: int) -> list[tuple[str, int, int]]:
    if count <= len(MIG_MIXED):
        return list(MIG_MIXED[:count])
    return [("1g.10gb", 7 + j, 1) for j in range(count)]


def gpu_uuid(index: int) -> str:
    return "GPU-" + str(uuid.uuid5(UUID_NAMESPACE, f"gpu/{index}"))


def mig_uuid(index: int, slot: int) -> str:
    return "MIG-" + str(uuid.uuid5(UUID_NAMESPACE, f"mig/{index}/{slot}"))


def pci_bus_id(index: int) -> str:
    return f"{index // len(HGX_BUSES):08X}:{HGX_BUSES[index % len(HGX_BUSES)]:02X}:00.0"


def node_entry(dev_root: str, path: str, major: int, minor: int, mode: int) -> dict[str, Any]:
    return {
        "path": path,
        "host_path": dev_root + path,
        "type": "c",
        "major": major,
        "minor": minor,
        "mode": mode,
    }


def free_major(used: set[int], start: int) -> int:
    for major in range(start, 233, -1):
        if major not in used:
            used.add(major)
            return major
    raise Fail("no free character device major number")


def host_majors() -> tuple[int, int]:
    """nvidia-uvm and nvidia-caps majors: the host's when its driver is loaded, else unused ones."""
    names: dict[str, int] = {}
    used: set[int] = set()
    try:
        with open("/proc/devices", encoding="ascii") as fh:
            text = fh.read()
    except OSError:
        text = ""
    for line in text.split("Block devices:")[0].splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit():
            used.add(int(fields[0]))
            names[fields[1]] = int(fields[0])
    uvm = names.get("nvidia-uvm") or free_major(used, 510)
    used.add(uvm)
    caps = names.get("nvidia-caps") or free_major(used, 511)
    return uvm, caps


def cap_file(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def mig_minors_table() -> str:
    lines = [f"config {CAP_CONFIG_MINOR}", f"monitor {CAP_MONITOR_MINOR}"]
    for gpu in range(CAP_MAX_GPUS):
        for gi in range(CAP_GIS_PER_GPU):
            lines.append(f"gpu{gpu}/gi{gi}/access {cap_minor(gpu, gi)}")
            lines.extend(
                f"gpu{gpu}/gi{gi}/ci{ci}/access {cap_minor(gpu, gi, ci)}"
                for ci in range(CAP_CIS_PER_GI)
            )
    return "\n".join(lines) + "\n"


def proc_devices(uvm: int, caps: int) -> str:
    chars = [
        (1, "mem"),
        (4, "/dev/vc/0"),
        (4, "tty"),
        (4, "ttyS"),
        (5, "/dev/tty"),
        (5, "/dev/console"),
        (5, "/dev/ptmx"),
        (7, "vcs"),
        (10, "misc"),
        (13, "input"),
        (128, "ptm"),
        (136, "pts"),
        (NVIDIA_MAJOR, "nvidia-frontend"),
        (uvm, "nvidia-uvm"),
        (caps, "nvidia-caps"),
    ]
    blocks = [(7, "loop"), (8, "sd"), (259, "blkext")]
    out = ["Character devices:"] + [f"{m:3d} {n}" for m, n in sorted(chars)]
    out += ["", "Block devices:"] + [f"{m:3d} {n}" for m, n in blocks]
    return "\n".join(out) + "\n"

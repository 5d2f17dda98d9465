"""The node as data: what tools/fake-node builds, from its arguments, written as node.json (the
truth tests compare against; fields: README.md)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from fakenode import GENERATOR
from fakenode.devices import (
    CAP_CONFIG_MINOR,
    CAP_MODE_CONFIG,
    CAP_MODE_READ,
    CAP_MONITOR_MINOR,
    CTL_MINOR,
    DEVICE_MODE,
    MODESET_MINOR,
    NVIDIA_MAJOR,
    PCI_DEVICE_ID,
    cap_minor,
    gpu_uuid,
    host_majors,
    mig_layout,
    mig_uuid,
    node_entry,
    pci_bus_id,
)
from fakenode.driver import BINARIES, DEV_LINKS, FIRMWARE, LAYOUTS, LIBRARIES, LOADER_FILES, SOCKET


def build_model(args: argparse.Namespace, root: str) -> dict[str, Any]:
    driver_root = os.path.join(root, "driver")
    dev_root = os.path.join(root, "dev")
    ver = args.driver_version
    uvm_major, caps_major = host_majors()
    cuda = args.cuda_version
    layout = LAYOUTS[args.layout]
    libdir, bindir = layout["libdir"], layout["bindir"]
    libraries, absent = _libraries(args, driver_root, libdir)
    config = os.path.join(root, "config.yaml")
    env = {
        "GPUHOOK_CONFIG": config,
        "GPUHOOK_CACHE_DIR": os.path.join(root, "run", "config"),
        "LD_LIBRARY_PATH": driver_root + libdir,
    }
    return {
        "generator": GENERATOR,
        "schema_version": 1,
        "root": root,
        "driver_root": driver_root,
        "dev_root": dev_root,
        "state_dir": os.path.join(root, "state"),
        "config": config,
        "log_file": os.path.join(root, "log", "gpuhook.log"),
        "nvml_data": os.path.join(root, "nvml", "data"),
        "cuda_client": os.path.join(root, "build", "fake-cuda-client"),
        "nvml_installed": not args.no_nvml,
        "layout": args.layout,
        "libdir": libdir,
        "bindir": bindir,
        "ld_so_cache": None if args.no_ldcache else f"{driver_root}/etc/ld.so.cache",
        "runtime": args.runtime,
        "hook_path": args.hook_path,
        "driver_version": ver,
        "cuda_version": cuda,
        "cuda_version_string": f"{cuda // 1000}.{cuda % 1000 // 10}",
        "nvml_version": f"{cuda // 1000}.{ver}",
        "gpu_major": NVIDIA_MAJOR,
        "uvm_major": uvm_major,
        "caps_major": caps_major,
        "gpus": [_gpu(args, index, dev_root, caps_major) for index in range(args.gpus)],
        "control_nodes": _control_nodes(dev_root, uvm_major),
        "mig_caps": _mig_caps(dev_root, caps_major),
        "libraries": libraries,
        "absent_libraries": absent,
        **_driver_files(driver_root, ver, layout),
        "proc_files": [
            "/proc/driver/nvidia/version",
            "/proc/driver/nvidia-caps/mig-minors",
            "/proc/devices",
            "/sys/module/nvidia/version",
        ],
        "env": env,
        "args": _args(args),
    }


def _gpu(args: argparse.Namespace, index: int, dev_root: str, caps_major: int) -> dict[str, Any]:
    minor = index
    mig_enabled = index in args.mig_gpus
    return {
        "index": index,
        "uuid": gpu_uuid(index),
        "minor": minor,
        "name": args.gpu_name,
        "memory": args.memory,
        "pci_bus_id": pci_bus_id(index),
        "pci_device_id": PCI_DEVICE_ID,
        "compute_capability": args.compute_capability,
        "brand": args.gpu_brand,
        "mig_enabled": mig_enabled,
        "persistence_mode": 1,
        "compute_mode": 0,
        "device_node": node_entry(
            dev_root, f"/dev/nvidia{minor}", NVIDIA_MAJOR, minor, DEVICE_MODE
        ),
        "mig_devices": _mig_devices(args, index, dev_root, caps_major) if mig_enabled else [],
    }


def _mig_devices(
    args: argparse.Namespace, index: int, dev_root: str, caps_major: int
) -> list[dict[str, Any]]:
    minor = index
    migs = []
    for slot, (profile, gi, eighths) in enumerate(mig_layout(args.mig_devices)):
        ci = 0
        gi_minor, ci_minor = cap_minor(minor, gi), cap_minor(minor, gi, ci)
        memory = (args.memory * eighths // 8) >> 20 << 20
        migs.append(
            {
                "index": slot,
                "uuid": mig_uuid(index, slot),
                "gi_id": gi,
                "ci_id": ci,
                "profile": profile,
                "name": f"{args.gpu_name} MIG {profile}",
                "memory": memory,
                "caps_minors": [gi_minor, ci_minor],
                "caps_proc_paths": [
                    f"/proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}/access",
                    f"/proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}/ci{ci}/access",
                ],
                "caps_nodes": [
                    node_entry(
                        dev_root,
                        f"/dev/nvidia-caps/nvidia-cap{m}",
                        caps_major,
                        m,
                        CAP_MODE_READ,
                    )
                    for m in (gi_minor, ci_minor)
                ],
            }
        )
    return migs


def _libraries(
    args: argparse.Namespace, driver_root: str, libdir: str
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """The driver libraries per capability, and those deliberately left out."""
    ver = args.driver_version
    libraries: dict[str, list[dict[str, Any]]] = {}
    absent = []
    for capability, name, soname_pattern in LIBRARIES:
        if soname_pattern is None or (name == "libnvidia-ml.so" and args.no_nvml):
            absent.append(name)
            continue
        soname = soname_pattern.format(v=ver)
        file = f"{name}.{ver}"
        libraries.setdefault(capability, []).append(
            {
                "name": name,
                "soname": soname,
                "file": file,
                "path": f"{libdir}/{file}",
                "host_path": f"{driver_root}{libdir}/{file}",
                "soname_link": None if soname == file else f"{libdir}/{soname}",
                "dev_link": f"{libdir}/{name}" if name in DEV_LINKS else None,
            }
        )
    return libraries, absent


def _control_nodes(dev_root: str, uvm_major: int) -> list[dict[str, Any]]:
    return [
        node_entry(dev_root, "/dev/nvidiactl", NVIDIA_MAJOR, CTL_MINOR, DEVICE_MODE),
        node_entry(dev_root, "/dev/nvidia-modeset", NVIDIA_MAJOR, MODESET_MINOR, DEVICE_MODE),
        node_entry(dev_root, "/dev/nvidia-uvm", uvm_major, 0, DEVICE_MODE),
        node_entry(dev_root, "/dev/nvidia-uvm-tools", uvm_major, 1, DEVICE_MODE),
    ]


def _mig_caps(dev_root: str, caps_major: int) -> dict[str, dict[str, Any]]:
    return {
        "config": {
            **node_entry(
                dev_root,
                f"/dev/nvidia-caps/nvidia-cap{CAP_CONFIG_MINOR}",
                caps_major,
                CAP_CONFIG_MINOR,
                CAP_MODE_CONFIG,
            ),
            "proc_path": "/proc/driver/nvidia/capabilities/mig/config",
        },
        "monitor": {
            **node_entry(
                dev_root,
                f"/dev/nvidia-caps/nvidia-cap{CAP_MONITOR_MINOR}",
                caps_major,
                CAP_MONITOR_MINOR,
                CAP_MODE_READ,
            ),
            "proc_path": "/proc/driver/nvidia/capabilities/mig/monitor",
        },
    }


def _driver_files(driver_root: str, ver: str, layout: dict[str, str]) -> dict[str, Any]:
    """The driver's binaries, firmware, graphics loader files and sockets."""
    bindir = layout["bindir"]
    return {
        "binaries": [
            {
                "name": name,
                "path": f"{bindir}/{name}",
                "host_path": f"{driver_root}{bindir}/{name}",
                "capability": capability,
            }
            for name, capability in BINARIES.items()
        ],
        "firmware": [
            {
                "path": f"/lib/firmware/nvidia/{ver}/{fw}",
                "host_path": f"{driver_root}/lib/firmware/nvidia/{ver}/{fw}",
            }
            for fw in FIRMWARE
        ],
        "loader_files": [
            {
                "kind": kind,
                "name": name,
                "path": f"{layout[key]}/{name}",
                "host_path": f"{driver_root}{layout[key]}/{name}",
                "library_path": library,
            }
            for kind, key, name, library in LOADER_FILES
        ],
        "sockets": [{"path": SOCKET, "host_path": driver_root + SOCKET, "capability": "utility"}],
    }


def _args(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments the node was built with, as node.json records them."""
    return {
        "gpus": args.gpus,
        "mig_gpus": sorted(args.mig_gpus),
        "mig_devices": args.mig_devices,
        "driver_version": args.driver_version,
        "cuda_version": args.cuda_version,
        "gpu_name": args.gpu_name,
        "memory": args.memory,
        "compute_capability": args.compute_capability,
        "gpu_brand": args.gpu_brand,
        "layout": args.layout,
        "no_nvml": args.no_nvml,
        "no_ldcache": args.no_ldcache,
    }

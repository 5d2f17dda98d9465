"""The node's file tree: the driver root's folders, loader files, firmware, /proc and /sys files,
the persistenced socket, the device nodes (mknod) and the driver root's ld.so.cache."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from typing import Any

from fakenode import Fail
from fakenode.devices import CAP_MODE_READ, cap_file, mig_minors_table, proc_devices
from fakenode.driver import loader_json


def write(path: str, text: str | bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    with open(path, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)


def make_socket(path: str) -> None:
    """A real unix socket file (bound, then closed; the file stays). Bound by a relative name from
    inside its folder: a deep tmp path can exceed sun_path's 108 bytes."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    cwd = os.open(".", os.O_RDONLY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.chdir(folder)
        sock.bind(os.path.basename(path))
    finally:
        sock.close()
        os.fchdir(cwd)
        os.close(cwd)
    os.chmod(path, 0o777)  # noqa: S103 - as nvidia-persistenced leaves its socket


def mknod(node: dict[str, Any]) -> None:
    path = node["host_path"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mknod(path, stat.S_IFCHR | node["mode"], os.makedev(node["major"], node["minor"]))
    os.chmod(path, node["mode"])


def make_tree(node: dict[str, Any]) -> None:
    driver_root = node["driver_root"]
    ver = node["driver_version"]
    for folder in (node["libdir"], node["bindir"]):
        os.makedirs(driver_root + folder, exist_ok=True)
    for folder in ("state", "log", "nvml"):
        os.makedirs(os.path.join(node["root"], folder), exist_ok=True)
    if node["layout"] == "standard":
        write(f"{driver_root}/etc/ld.so.conf", node["libdir"] + "\n")
    for loader in node["loader_files"]:
        write(loader["host_path"], loader_json(loader["kind"], loader["library_path"]))
    for fw in node["firmware"]:
        name = os.path.basename(fw["path"]).encode()
        write(
            fw["host_path"],
            (b"FAKE NVIDIA GSP FIRMWARE " + name + b" " + ver.encode() + b"\n").ljust(4096, b"\0"),
        )

    proc = f"{driver_root}/proc/driver/nvidia"
    write(
        f"{proc}/version",
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {ver}  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n",
        0o444,
    )
    write(f"{driver_root}/proc/driver/nvidia-caps/mig-minors", mig_minors_table(), 0o444)
    write(f"{driver_root}/proc/devices", proc_devices(node["uvm_major"], node["caps_major"]), 0o444)
    write(f"{driver_root}/sys/module/nvidia/version", ver + "\n", 0o444)
    for cap in node["mig_caps"].values():
        write(driver_root + cap["proc_path"], cap_file(cap["minor"], cap["mode"]), 0o444)
    for g in node["gpus"]:
        bus = g["pci_bus_id"][4:].lower()
        write(
            f"{proc}/gpus/{bus}/information",
            f"Model: \t\t {g['name']}\nIRQ:   \t\t {120 + g['index']}\n"
            f"GPU UUID: \t {g['uuid']}\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\n"
            f"DMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\n"
            f"Device Minor: \t {g['minor']}\nGPU Firmware: \t {ver}\nGPU Excluded:\t No\n",
            0o444,
        )
        for m in g["mig_devices"]:
            for minor, proc_path in zip(m["caps_minors"], m["caps_proc_paths"], strict=True):
                write(driver_root + proc_path, cap_file(minor, CAP_MODE_READ), 0o444)
    for sock in node["sockets"]:
        make_socket(sock["host_path"])

    for g in node["gpus"]:
        mknod(g["device_node"])
        for m in g["mig_devices"]:
            for cap in m["caps_nodes"]:
                mknod(cap)
    for ctl in node["control_nodes"]:
        mknod(ctl)
    for cap in node["mig_caps"].values():
        mknod(cap)


def run_ldconfig(driver_root: str) -> None:
    ldconfig = "/sbin/ldconfig"
    if not os.access(ldconfig, os.X_OK):
        raise Fail(f"{ldconfig} not found")
    os.makedirs(os.path.join(driver_root, "var", "cache", "ldconfig"), exist_ok=True)
    proc = subprocess.run(
        [ldconfig, "-r", driver_root], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0 or not os.path.exists(os.path.join(driver_root, "etc/ld.so.cache")):
        sys.stderr.write(proc.stdout + proc.stderr)
        raise Fail(f"ldconfig -r {driver_root} failed (status {proc.returncode})")

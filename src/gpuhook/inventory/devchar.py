"""The ``/dev/char/<major>:<minor>`` links of the NVIDIA device nodes, under ``dev_root``.

With the systemd cgroup driver, ``systemctl daemon-reload`` makes systemd reapply a container
unit's device rules, which it resolves through ``/dev/char/<major>:<minor>``; a device without
that link is dropped from the container's device cgroup, and its CUDA and NVML calls then fail
("Failed to initialize NVML: Unknown Error", NVIDIA container toolkit #48). udev makes these links
for the devices it creates, but the NVIDIA driver makes its nodes itself, so nothing links them.
``gpuhook inventory refresh`` makes them (:func:`ensure`), relative (``195:0 -> ../nvidia0``) as
udev's are, and ``gpuhook doctor`` checks them (:func:`check`).

A link that already resolves to the right node (udev's, an absolute one) is kept; a link that
points elsewhere is replaced atomically; anything that is not a link is never touched.
"""

from __future__ import annotations

import os
import stat

from gpuhook.fsutil import atomic_symlink, resolve_in_root
from gpuhook.inventory.driverroot import host_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuhook.model.inventory import DeviceNode, Inventory

CHAR_DIR = "/dev/char"


def nodes(inventory: Inventory) -> list[DeviceNode]:
    """Every NVIDIA device node of the inventory: GPUs, their MIG caps, the control nodes."""
    out: list[DeviceNode] = []
    for gpu in inventory.gpus:
        if gpu.node is not None:
            out.append(gpu.node)
        out += [cap for mig in gpu.mig_devices for cap in mig.caps]
    out += inventory.control_nodes
    unique = {(n.major, n.minor): n for n in out if n.type == "c"}
    return list(unique.values())


def link_path(node: DeviceNode) -> str:
    """``/dev/char/<major>:<minor>`` (in the dev root)."""
    return f"{CHAR_DIR}/{node.major}:{node.minor}"


def target(node: DeviceNode) -> str:
    """The relative target udev would write: ``../nvidia0``, ``../nvidia-caps/nvidia-cap3``."""
    return os.path.relpath(node.path, CHAR_DIR)


def state(dev_root: str, node: DeviceNode) -> str:
    """ "ok", "missing", "wrong" (a link to something else) or "blocked" (not a link)."""
    link = host_path(dev_root, link_path(node))
    try:
        st = os.lstat(link)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "blocked"
    if not stat.S_ISLNK(st.st_mode):
        return "blocked"
    try:
        found = os.stat(resolve_in_root(dev_root, link_path(node)))
    except OSError:
        return "wrong"
    if stat.S_ISCHR(found.st_mode) and found.st_rdev == os.makedev(node.major, node.minor):
        return "ok"
    return "wrong"


def ensure(dev_root: str, inventory: Inventory) -> tuple[int, list[str]]:
    """Make or repair the links of the inventory's nodes. Returns (how many were made or
    replaced, one line per link that could not be)."""
    made = 0
    problems: list[str] = []
    for node in nodes(inventory):
        current = state(dev_root, node)
        if current == "ok":
            continue
        link = host_path(dev_root, link_path(node))
        if current == "blocked":
            problems.append(f"{link} exists and is not a link; left as it is")
            continue
        try:
            os.makedirs(os.path.dirname(link), mode=0o755, exist_ok=True)
            atomic_symlink(target(node), link)
        except OSError as exc:
            problems.append(f"cannot link {link} -> {target(node)}: {exc.strerror}")
            continue
        made += 1
    return made, problems


def check(dev_root: str, inventory: Inventory) -> dict[str, list[str]]:
    """The inventory's nodes by the state of their link: "ok", "missing", "wrong", "blocked"
    (each a list of ``/dev/char/M:m -> node`` texts)."""
    out: dict[str, list[str]] = {"ok": [], "missing": [], "wrong": [], "blocked": []}
    for node in nodes(inventory):
        out[state(dev_root, node)].append(f"{host_path(dev_root, link_path(node))} ({node.path})")
    return out

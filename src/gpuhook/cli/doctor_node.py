"""doctor's checks of the node itself: the config, the inventory, the device nodes and their
/dev/char links, the driver libraries."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpuhook.cli.doctor_check import FAIL, PASS, SKIP, WARN, Node, Result, section
from gpuhook.cli.render import age
from gpuhook.config import loading as config_loading
from gpuhook.inventory import catalog, devchar, driverroot

if TYPE_CHECKING:
    from gpuhook.model.inventory import Inventory

register = section("runtime", "mps")  # ahead of doctor_engines and doctor_host


@register("config", needs_config=False)
def check_config(node: Node) -> Result:
    if node.config_error is not None:
        path = node.config_error.path
        return Result(
            "config",
            FAIL,
            str(node.config_error),
            f"edit {path} (check it with: gpuhook config validate {path})",
        )
    config = node.need_config()
    if not config.source.startswith("/"):
        path, _ = config_loading.config_path(node.config_file)
        return Result("config", PASS, f"no config file at {path}: every key takes its default")
    return Result("config", PASS, f"{config.source} is valid")


@register("inventory")
def check_inventory(node: Node) -> Result:
    config = node.need_config()
    status = node.inventory_status()
    fix = "gpuhook inventory refresh"
    path = config.inventory_path
    inv = status.inventory
    if inv is None:
        if not os.path.lexists(path):
            return Result("inventory", FAIL, f"no inventory at {path}", fix)
        return Result("inventory", FAIL, status.reason.split("; run:")[0], fix)
    if not status.fresh:
        if config.auto_refresh:
            return Result(
                "inventory",
                WARN,
                f"{path} is stale ({status.reason}); the next GPU container's create will "
                "refresh it (and wait for NVML)",
                fix,
            )
        return Result(
            "inventory",
            FAIL,
            f"{path} is stale ({status.reason}) and inventory.auto_refresh is off: GPU "
            "containers get what it says",
            fix,
        )

    built = age(node.now - inv.generated_at)
    if not inv.gpus:
        return Result(
            "inventory",
            WARN,
            f"{path}: NVML reports no GPU (driver {inv.driver_version or 'unknown'}, "
            f"built {built})",
            "check the driver (nvidia-smi), then: gpuhook inventory refresh",
        )
    migs = sum(len(g.mig_devices) for g in inv.gpus)
    return Result(
        "inventory",
        PASS,
        f"{path}: {len(inv.gpus)} GPUs, {migs} MIG devices, driver {inv.driver_version}, "
        f"built {built}",
    )


NODE_FIX = (
    "load the NVIDIA kernel modules and create the device nodes (nvidia-modprobe -c 0 -u, or "
    "run nvidia-smi once), then: gpuhook inventory refresh"
)


REQUIRED_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")


@register("device nodes")
def check_device_nodes(node: Node) -> Result:
    config = node.need_config()
    inv = node.inventory()
    if inv is None:
        return Result("device nodes", SKIP, "needs the inventory (see the inventory check)")
    found: dict[str, list[str]] = {k: [] for k in NODE_STATES}
    for state, text in _gpu_node_states(config.dev_root, inv) + _control_node_states(
        config.dev_root, inv
    ):
        found[state].append(text)
    return _device_nodes_result(found, driverroot.host_path(config.dev_root, "/dev"))


NODE_STATES = ("present", "missing", "changed", "unlisted", "optional")


def _node_state(
    dev_root: str, path: str, what: str, major: int | None, minor: int | None
) -> tuple[str, str]:
    """One expected node: ("present" | "missing" | "changed", what to say)."""
    found = driverroot.read_node(dev_root, path)
    host = driverroot.host_path(dev_root, path)
    if found is None:
        return "missing", f"{host} ({what})"
    if major is not None and (found.major, found.minor) != (major, minor):
        return (
            "changed",
            f"{host} is {found.major}:{found.minor}, the inventory says {major}:{minor}",
        )
    return "present", host


def _gpu_node_states(dev_root: str, inv: Inventory) -> list[tuple[str, str]]:
    """The node of every GPU of the inventory, and the caps of its MIG devices."""
    out = []
    for gpu in inv.gpus:
        if gpu.node is None:
            host = driverroot.host_path(dev_root, f"/dev/nvidia{gpu.minor}")
            out.append(("missing", f"{host} (GPU {gpu.index})"))
        else:
            node = gpu.node
            out.append(_node_state(dev_root, node.path, f"GPU {gpu.index}", node.major, node.minor))
        out += [
            _node_state(dev_root, cap.path, f"MIG {mig.display_id}", cap.major, cap.minor)
            for mig in gpu.mig_devices
            for cap in mig.caps
        ]
    return out


def _control_node_states(dev_root: str, inv: Inventory) -> list[tuple[str, str]]:
    """Every control node gpuhook knows: as the inventory lists it, present but not listed,
    missing (a required one) or absent (an optional one)."""
    known = {n.path: n for n in inv.control_nodes}
    out = []
    for path in catalog.CONTROL_NODES:
        host = driverroot.host_path(dev_root, path)
        if path in known:
            out.append(_node_state(dev_root, path, "control", known[path].major, known[path].minor))
        elif driverroot.read_node(dev_root, path) is not None:
            out.append(("unlisted", host))
        elif path in REQUIRED_CONTROL_NODES:
            out.append(("missing", f"{host} (control)"))
        else:
            out.append(("optional", host))
    return out


def _device_nodes_result(found: dict[str, list[str]], where: str) -> Result:
    count = len(found["present"]) + len(found["unlisted"])
    if found["missing"]:
        return Result("device nodes", FAIL, "missing: " + ", ".join(found["missing"]), NODE_FIX)
    if found["changed"]:
        return Result(
            "device nodes",
            FAIL,
            "changed: " + "; ".join(found["changed"]),
            "gpuhook inventory refresh",
        )
    if found["unlisted"]:
        return Result(
            "device nodes",
            WARN,
            f"{count} present under {where}; not in the inventory (containers do not get "
            f"them): {', '.join(found['unlisted'])}",
            "gpuhook inventory refresh",
        )
    if found["optional"]:
        return Result(
            "device nodes",
            WARN,
            f"{count} present under {where}; not present: {', '.join(found['optional'])} (only "
            "some workloads need them)",
            NODE_FIX,
        )
    return Result("device nodes", PASS, f"{count} present under {where} (GPUs, MIG, control)")


@register("dev char links")
def check_dev_char_links(node: Node) -> Result:
    """/dev/char/<major>:<minor> for every NVIDIA node (systemd cgroup driver, daemon-reload)."""
    name = "dev char links"
    inv = node.inventory()
    if inv is None:
        return Result(name, SKIP, "needs the inventory (see the inventory check)")
    found = devchar.check(node.need_config().dev_root, inv)
    bad = found["missing"] + found["wrong"] + found["blocked"]
    if bad:
        return Result(
            name,
            WARN,
            f"{len(bad)} of {len(bad) + len(found['ok'])} NVIDIA device nodes lack a correct "
            f"/dev/char link: {', '.join(bad)}; with the systemd cgroup driver their containers "
            "lose the GPU at the next systemctl daemon-reload",
            "gpuhook inventory refresh (it makes the links)",
        )
    return Result(name, PASS, f"{len(found['ok'])} NVIDIA device nodes linked under /dev/char")


@register("libraries")
def check_libraries(node: Node) -> list[Result]:
    config = node.need_config()
    inv = node.inventory()
    if inv is None:
        return [Result("libraries", SKIP, "needs the inventory (see the inventory check)")]
    missing_by_cap = dict(inv.missing_libraries)
    results = []
    for cap, names in catalog.LIBRARIES.items():
        if not names:
            continue  # compat32: the 32-bit copies of other capabilities' libraries
        name = f"libraries {cap}"
        found = [lib for lib in inv.libraries if lib.capability == cap]
        missing = list(missing_by_cap.get(cap, ()))
        required = [n for n in missing if n in catalog.REQUIRED_LIBRARIES]
        gone = [lib.path for lib in found if not os.path.isfile(lib.path)]
        if required:
            results.append(
                Result(
                    name,
                    FAIL,
                    f"required {', '.join(required)} not found under {config.driver_root}",
                    f"install the NVIDIA driver's user-space libraries under driver_root "
                    f"({config.driver_root}), then: gpuhook inventory refresh",
                )
            )
        elif gone:
            results.append(
                Result(
                    name,
                    FAIL,
                    f"listed by the inventory but gone: {', '.join(gone)}",
                    "gpuhook inventory refresh",
                )
            )
        elif not found:
            results.append(
                Result(
                    name,
                    WARN,
                    f"none found under {config.driver_root}: containers asking for {cap} get no "
                    f"{cap} libraries",
                    f"install the driver's {cap} libraries if containers need them, then: "
                    "gpuhook inventory refresh",
                )
            )
        elif missing:
            results.append(
                Result(
                    name,
                    WARN,
                    f"{len(found)} found; not found: {', '.join(missing)} (optional: not every "
                    "driver or system ships them)",
                )
            )
        else:
            results.append(Result(name, PASS, f"{len(found)} found"))
    return results

"""The inventory file: build it (NVML + driver-root scan), write it atomically under a lock,
read it cheaply, and tell whether it is stale.

The container-create path calls :func:`load_current`: one file read and a few stats. Only when
the file is missing or stale (and ``inventory.auto_refresh`` is on) does it refresh, under the
lock, once: a second process waiting on the lock finds the fresh file and uses it.
"""

from __future__ import annotations

import os
import time

from gpuhook import _fastjson
from gpuhook.errors import InventoryError
from gpuhook.fsutil import FileLock, atomic_write
from gpuhook.inventory import driverroot
from gpuhook.model.inventory import Gpu, Inventory, MigDevice

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpuhook.config import Config
    from gpuhook.inventory.nvml import GpuFacts

LOCK_TIMEOUT_S = 120.0


def lock_path(config: Config) -> str:
    return config.inventory_path + ".lock"


class Status:
    """What `inspect node` and `doctor` say about the inventory file."""

    def __init__(
        self, inventory: Inventory | None, fresh: bool, age_s: float | None, reason: str
    ) -> None:
        self.inventory = inventory
        self.fresh = fresh
        self.age_s = age_s
        self.reason = reason


def read(config: Config) -> Inventory:
    """Read and decode the inventory file; InventoryError when missing or corrupt."""
    path = config.inventory_path
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise InventoryError(f"no inventory at {path}; run: gpuhook inventory refresh") from None
    except OSError as exc:
        raise InventoryError(f"cannot read inventory {path}: {exc.strerror}") from None
    try:
        return Inventory.from_dict(_fastjson.loads(raw))  # type: ignore[arg-type]
    except (ValueError, TypeError, AttributeError, KeyError) as exc:  # any damage is "corrupt"
        raise InventoryError(
            f"inventory {path} is corrupt ({exc}); run: gpuhook inventory refresh"
        ) from None


def stale_reason(config: Config, inventory: Inventory) -> str:
    """Why ``inventory`` no longer describes the node ("" when it still does)."""
    if os.path.abspath(inventory.driver_root) != os.path.abspath(config.driver_root):
        return f"driver_root changed ({inventory.driver_root} -> {config.driver_root})"
    if os.path.abspath(inventory.dev_root) != os.path.abspath(config.dev_root):
        return f"dev_root changed ({inventory.dev_root} -> {config.dev_root})"
    key = driverroot.staleness_key(config.driver_root, config.dev_root)
    if key != inventory.staleness_key:
        return "the driver changed since the inventory was built"
    return ""


def status(config: Config) -> Status:
    try:
        inventory = read(config)
    except InventoryError as exc:
        return Status(None, False, None, str(exc))
    reason = stale_reason(config, inventory)
    return Status(inventory, not reason, max(0.0, time.time() - inventory.generated_at), reason)


def load_current(config: Config) -> Inventory:
    """The inventory for the container-create path: read it, refresh it if missing or stale.

    With ``inventory.auto_refresh`` off, a stale inventory is used as it is and a missing one is
    an error.
    """
    try:
        inventory = read(config)
    except InventoryError:
        if not config.auto_refresh:
            raise
        return refresh(config, only_if_needed=True)
    if config.auto_refresh and stale_reason(config, inventory):
        return refresh(config, only_if_needed=True)
    return inventory


def refresh(config: Config, *, only_if_needed: bool = False, export_cdi: bool = False) -> Inventory:
    """Build the inventory and write it atomically, holding the refresh lock.

    ``only_if_needed``: after taking the lock, first re-read the file; another process may have
    refreshed it while this one waited. ``export_cdi``: also regenerate the CDI spec at
    ``cdi.output`` when one is configured (``gpuhook inventory refresh`` and its systemd units;
    the lazy refresh of the create path leaves it, so that no container create waits on it).
    """
    try:
        os.makedirs(os.path.dirname(config.inventory_path) or ".", exist_ok=True)
        lock = FileLock(lock_path(config), timeout=LOCK_TIMEOUT_S)
        with lock:
            if only_if_needed:
                try:
                    current = read(config)
                    if not stale_reason(config, current):
                        return current
                except InventoryError:
                    pass
            inventory = build(config)
            data = _fastjson.dumps(inventory.to_dict()).encode() + b"\n"
            atomic_write(config.inventory_path, data, 0o644)
            if export_cdi:
                from gpuhook.inventory import cdi

                cdi.export(inventory, config)
            return inventory
    except TimeoutError:
        raise InventoryError(
            f"timed out after {LOCK_TIMEOUT_S:.0f}s waiting for another inventory refresh "
            f"({lock_path(config)})"
        ) from None
    except OSError as exc:
        raise InventoryError(
            f"cannot write inventory {config.inventory_path}: {exc.strerror}"
        ) from None


def nvml_candidates(config: Config) -> list[str]:
    """Where the driver root keeps libnvidia-ml, tried after the normal library search."""
    from gpuhook.inventory import nvml

    return [
        driverroot.host_path(config.driver_root, f"{folder}/{nvml.SONAME}")
        for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64")
    ]


def build(config: Config) -> Inventory:
    """Query NVML and scan the driver and dev roots (slow: seconds on some nodes)."""
    from gpuhook.inventory import nvml

    key = driverroot.staleness_key(config.driver_root, config.dev_root)
    facts = nvml.query(config.nvml_library, nvml_candidates(config))
    scan = driverroot.scan(config.driver_root, config.dev_root, facts.driver_version)
    warnings = list(scan.warnings)
    gpus = [_gpu(config, g, warnings) for g in facts.gpus]
    return Inventory(
        generated_at=time.time(),
        driver_root=config.driver_root,
        dev_root=config.dev_root,
        driver_version=facts.driver_version,
        cuda_driver_version=facts.cuda_driver_version,
        nvml_library=facts.library,
        gpus=gpus,
        control_nodes=scan.control_nodes,
        libraries=scan.libraries,
        files=scan.files,
        missing_libraries=[(cap, tuple(names)) for cap, names in sorted(scan.missing.items())],
        staleness_key=key,
        warnings=warnings,
    )


def _gpu(config: Config, g: GpuFacts, warnings: list[str]) -> Gpu:
    """One GPU of the NVML facts with its device node and MIG devices (missing nodes: warnings)."""
    node = driverroot.gpu_node(config.dev_root, g.minor)
    if node is None:
        warnings.append(
            f"GPU {g.index} ({g.uuid}): device node "
            f"{driverroot.host_path(config.dev_root, f'/dev/nvidia{g.minor}')} not found"
        )
    migs = tuple(
        MigDevice(
            m.index,
            m.uuid,
            g.index,
            m.gpu_instance_id,
            m.compute_instance_id,
            m.name,
            m.memory_total,
            driverroot.mig_cap_nodes(
                config.driver_root,
                config.dev_root,
                g.minor,
                m.gpu_instance_id,
                m.compute_instance_id,
                warnings,
            ),
        )
        for m in g.migs
    )
    return Gpu(
        g.index,
        g.uuid,
        g.minor,
        g.name,
        g.memory_total,
        g.pci_bus_id,
        g.compute_capability,
        g.mig_enabled,
        migs,
        node,
    )

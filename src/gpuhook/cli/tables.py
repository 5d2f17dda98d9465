"""What ``gpuhook inspect node``, ``mps status``, ``gc`` and ``doctor`` show: pure functions from
gpuhook's data to a view (a JSON-ready dict) and from a view to a table a person reads in
seconds. The decisions (``inspect spec|container|pod``) are :mod:`gpuhook.cli.decisions`'."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpuhook.cli.render import age, check_lines, mib, paint, section, table
from gpuhook.inventory.catalog import LIBRARIES

if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.inventory.store import Status
    from gpuhook.model.inventory import DeviceNode, Inventory


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _node(n: DeviceNode) -> dict[str, Any]:
    return {
        "path": n.path,
        "host_path": n.host_path,
        "type": n.type,
        "major": n.major,
        "minor": n.minor,
        "mode": f"{n.mode:04o}",
    }


# --- inspect node -------------------------------------------------------------------------------


def node_view(config: Config, status: Status, mps: dict[str, Any] | None = None) -> dict[str, Any]:
    """``mps``: :func:`gpuhook.mps.daemons.node_state` (per GPU index: group and daemon state)."""
    inv = status.inventory
    view: dict[str, Any] = {
        "config": config.source,
        "driver_root": config.driver_root,
        "dev_root": config.dev_root,
        "inventory": {
            "path": config.inventory_path,
            "present": inv is not None,
            "generated_at": _iso(inv.generated_at) if inv else None,
            "age_seconds": round(status.age_s, 1) if status.age_s is not None else None,
            "fresh": status.fresh,
            "stale_reason": status.reason,
        },
    }
    if inv is None:
        return view
    view["driver"] = {
        "version": inv.driver_version,
        "cuda_version": inv.cuda_driver_version,
        "nvml_library": inv.nvml_library,
    }
    mps_gpus = (mps or {}).get("gpus", {})
    view["gpus"] = [{**_gpu_view(g), "mps": _mps_gpu(mps_gpus.get(str(g.index)))} for g in inv.gpus]
    if mps and mps.get("error"):
        view["mps_error"] = mps["error"]
    view["control_nodes"] = [_node(n) for n in inv.control_nodes]
    view["libraries"] = _libraries_view(inv)
    for kind, key in (
        ("binary", "binaries"),
        ("firmware", "firmware"),
        ("socket", "ipc_sockets"),
        ("loader", "graphics_loader_files"),
    ):
        view[key] = [
            {
                "name": f.name,
                "path": f.path,
                "container_path": f.container_path,
                "capability": f.capability,
            }
            for f in inv.files_of(kind)
        ]
    view["warnings"] = list(inv.warnings)
    return view


def _gpu_view(g: Any) -> dict[str, Any]:
    return {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "minor": g.minor,
        "memory_total": g.memory_total,
        "pci_bus_id": g.pci_bus_id,
        "compute_capability": g.compute_capability,
        "brand": g.brand,
        "mig_enabled": g.mig_enabled,
        "device_node": _node(g.node) if g.node else None,
        "mig_devices": [
            {
                "index": m.index,
                "id": m.display_id,
                "uuid": m.uuid,
                "name": m.name,
                "gpu_instance_id": m.gpu_instance_id,
                "compute_instance_id": m.compute_instance_id,
                "memory_total": m.memory_total,
                "caps": [_node(c) for c in m.caps],
            }
            for m in g.mig_devices
        ],
    }


def _mps_gpu(state: dict[str, Any] | None) -> dict[str, Any]:
    if state is None:
        return {"shared": False}
    return {"shared": True, **state}


def _libraries_view(inv: Inventory) -> dict[str, Any]:
    missing = dict(inv.missing_libraries)
    out: dict[str, Any] = {}
    for capability in (*LIBRARIES, "compat32"):
        found = [lib for lib in inv.libraries if lib.capability == capability]
        if capability == "compat32" and not found:
            continue
        out[capability] = {
            "found": [
                {
                    "name": lib.name,
                    "soname": lib.soname,
                    "version": lib.version,
                    "path": lib.path,
                    "dev_link": lib.dev_link,
                }
                for lib in found
            ],
            "missing": list(missing.get(capability, ())),
        }
    return out


def node_table(view: dict[str, Any], color: bool = False) -> str:
    out = [_node_head(view, color)]
    if "gpus" not in view:
        return "".join(out)
    out.append(_gpus_section(view["gpus"], color))
    if view.get("mps_error"):
        out.append(
            section("MPS", f"  {paint('fail', 'fail', color)}  {view['mps_error']}\n", color)
        )
    out.append(_control_nodes_section(view["control_nodes"], color))
    out += _driver_files_sections(view, color)
    if view["warnings"]:
        out.append(
            section(
                "Warnings",
                "".join(f"  {paint('warn', 'warn', color)}  {w}\n" for w in view["warnings"]),
                color,
            )
        )
    return "\n".join(out)


def _node_head(view: dict[str, Any], color: bool) -> str:
    inv = view["inventory"]
    state = "fresh" if inv["fresh"] else "stale" if inv["present"] else "missing"
    built = f", built {inv['generated_at']} ({age(inv['age_seconds'])})" if inv["present"] else ""
    stale = f" - {inv['stale_reason']}" if inv["stale_reason"] else ""
    head = [
        ("Config", view["config"]),
        ("Roots", f"driver {view['driver_root']}   dev {view['dev_root']}"),
        ("Inventory", f"{inv['path']}   {paint(state, state, color)}{built}{stale}"),
    ]
    if "driver" in view:
        d = view["driver"]
        nvml = d["nvml_library"] or "-"
        head.insert(0, ("Driver", f"{d['version']}   CUDA {d['cuda_version']}   NVML {nvml}"))
    width = max(len(k) for k, _ in head)
    return "".join(f"{k.ljust(width)}  {v}\n" for k, v in head)


GPU_HEADERS = ["ID", "UUID", "NAME", "MEMORY", "PCI / MIG", "CC", "DEVICE NODE", "MIG", "MPS"]


def _gpus_section(gpus: list[dict[str, Any]], color: bool) -> str:
    rows = []
    for g in gpus:
        node = g["device_node"]
        rows.append(
            [
                g["index"],
                g["uuid"],
                g["name"],
                mib(g["memory_total"]),
                g["pci_bus_id"],
                g["compute_capability"],
                f"{node['path']} {node['major']}:{node['minor']}"
                if node
                else paint("missing", "fail", color),
                f"enabled ({len(g['mig_devices'])})" if g["mig_enabled"] else "-",
                _mps_cell(g["mps"], color),
            ]
        )
        rows += [_mig_row(m, color) for m in g["mig_devices"]]
    return section(f"GPUs ({len(gpus)})", table(GPU_HEADERS, rows), color)


def _mig_row(m: dict[str, Any], color: bool) -> list[Any]:
    caps = ",".join(c["path"].rsplit("/", 1)[-1] for c in m["caps"])
    return [
        f"  {m['id']}",
        m["uuid"],
        m["name"],
        mib(m["memory_total"]),
        f"GI {m['gpu_instance_id']} CI {m['compute_instance_id']}",
        "",
        caps or paint("no caps nodes", "fail", color),
        "",
        "",
    ]


def _control_nodes_section(nodes: list[dict[str, Any]], color: bool) -> str:
    rows = [[n["path"], f"{n['major']}:{n['minor']}", n["mode"], n["host_path"]] for n in nodes]
    return section(
        "Control device nodes", table(["PATH", "MAJOR:MINOR", "MODE", "HOST PATH"], rows), color
    )


def _driver_files_sections(view: dict[str, Any], color: bool) -> list[str]:
    lib_rows = []
    for cap, libs in view["libraries"].items():
        total = len(libs["found"]) + len(libs["missing"])
        lib_rows.append([cap, f"{len(libs['found'])}/{total}", ", ".join(libs["missing"]) or "-"])
    files = [["binary", f["name"], f["path"]] for f in view["binaries"]]
    files += [["firmware", f["name"], f["path"]] for f in view["firmware"]]
    files += [["socket", f["name"], f["path"]] for f in view["ipc_sockets"]]
    files += [["graphics loader", f["name"], f["path"]] for f in view["graphics_loader_files"]]
    return [
        section("Driver libraries", table(["CAPABILITY", "FOUND", "MISSING"], lib_rows), color),
        section("Driver files", table(["KIND", "NAME", "PATH"], files), color),
    ]


def _mps_cell(mps: dict[str, Any], color: bool) -> str:
    if not mps.get("shared"):
        return "-"
    if mps["daemon"] == "running":
        return f"{mps['group']} " + paint(f"running (pid {mps['pid']})", "ok", color)
    return f"{mps['group']} " + paint("down", "fail", color)


# --- mps status ---------------------------------------------------------------------------------


def mps_table(view: dict[str, Any], color: bool = False) -> str:
    rows = []
    notes = []
    for g in view["groups"]:
        state = g["state"]
        defaults = g.get("defaults") or {}
        share = g["share"]
        threads = (
            defaults.get("active_thread_percentage") or share["active_thread_percentage"]["value"]
        )
        pinned = defaults.get("pinned_memory_limit") or {
            str(p["index"]): p["value"] for p in share["pinned_memory_limit"]
        }
        servers = g.get("servers")
        rows.append(
            [
                g["group"],
                ",".join(str(x["index"]) for x in g["gpus"]),
                paint(state, "ok" if state == "running" else "fail", color),
                g["pid"],
                _compute_mode_cell(g.get("compute_modes"), color),
                g["pipe_dir"],
                threads if threads is not None else "-",
                ",".join(f"{i}={v}" for i, v in pinned.items() if v) or "-",
                "-"
                if servers is None
                else "; ".join(
                    f"{s['pid']}: {','.join(s['clients']) or 'no clients'}" for s in servers
                )
                or "none",
            ]
        )
        for key in ("note", "compute_mode_note", "error"):
            if g.get(key):
                notes.append(f"  {g['group']}: {g[key]}\n")
    headers = ["GROUP", "GPUS", "DAEMON", "PID", "COMPUTE MODE", "PIPE DIR", "THREADS %"]
    out = [
        f"MPS root  {view['root']}   (config {view['config']})\n",
        table([*headers, "PINNED", "SERVERS"], rows),
    ]
    if notes:
        out.append(section("Notes", "".join(notes), color))
    return "\n".join(out)


def _compute_mode_cell(modes: dict[str, str] | None, color: bool) -> str:
    """One mode for the group's GPUs (``EXCLUSIVE_PROCESS``), else each GPU's; ``?`` unread."""
    if not modes:
        return "?"
    distinct = set(modes.values())
    text = distinct.pop() if len(distinct) == 1 else ",".join(f"{i}:{m}" for i, m in modes.items())
    return paint(text, "ok" if text == "EXCLUSIVE_PROCESS" else "warn", color)


# --- gc -------------------------------------------------------------------------------------------


def gc_table(view: dict[str, Any], color: bool = False) -> str:
    dry = view["dry_run"]
    verb = "would remove" if dry else "removed"
    rows = [
        [paint(verb, "warn" if dry else "ok", color), i["container_id"], i["reason"]]
        for i in view["removed"]
    ]
    rows += [[paint("kept", "pass", color), i["container_id"], i["reason"]] for i in view["kept"]]
    out = table(["ACTION", "CONTAINER", "WHY"], rows) if rows else ""
    n = len(view["removed"])
    out += (
        f"gc: {verb} {n} link{'s' if n != 1 else ''} of deleted containers, kept "
        f"{len(view['kept'])}, {view['live']} live ({view['records_dir']})"
        + ("; dry run: nothing removed" if dry else "")
        + "\n"
    )
    return out


# --- doctor ---------------------------------------------------------------------------------------


def doctor_table(view: dict[str, Any], color: bool = False) -> str:
    """One line per check: status, check, what was found, and for a failure or warning its fix."""
    lines = check_lines(view["checks"], ("fail", "warn"), color)
    s = view["summary"]
    lines.append(
        f"\ndoctor: {s['fail']} failed, {s['warn']} warnings, {s['pass']} passed, "
        f"{s['skip']} skipped\n"
    )
    return "".join(lines)

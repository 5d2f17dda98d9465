"""What ``gpuhook inspect`` shows: pure functions from gpuhook's data to a view (a JSON-ready
dict) and from a view to a table a person reads in seconds."""

from __future__ import annotations

import time

from gpuhook.cli.render import age, mib, paint, section, table
from gpuhook.inventory.catalog import LIBRARIES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.inventory.store import Status
    from gpuhook.model.inventory import DeviceNode, Inventory
    from gpuhook.pipeline.flow import Outcome


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


# --- inspect spec -------------------------------------------------------------------------------


def outcome_view(outcome: Outcome, bundle: str) -> dict[str, Any]:
    """``gpuhook inspect spec``: the bundle and the decision, in the decision record's shape."""
    from gpuhook.records import writer

    return {"bundle": bundle, **writer.decided_view(outcome)}


def _mount_rows(mounts: list[dict[str, Any]]) -> list[list[str]]:
    """Mounts grouped by the folder they land in (a library folder is a tmpfs with one bind
    mount per name of each library): one row per folder, the full list is in the JSON."""
    tmpfs = [m["containerPath"] for m in mounts if m["type"] != "bind"]
    groups: dict[str, dict[str, list[str]]] = {}  # container folder -> host file -> names
    for m in mounts:
        if m["type"] != "bind":
            continue
        folder, _, name = m["containerPath"].rpartition("/")
        groups.setdefault(folder or "/", {}).setdefault(m["hostPath"], []).append(name)
    rows = []
    for folder, files in groups.items():
        names = [min(ns, key=len) for ns in files.values()]  # a library's soname, not its file
        hosts = {h.rpartition("/")[0] or "/" for h in files}
        source = f" <- {hosts.pop()}" if len(hosts) == 1 else ""
        kind = "libraries" if folder in tmpfs else "mounts"
        where = f"{folder} (tmpfs)" if folder in tmpfs else folder
        rows.append([kind, f"{where}: {', '.join(names)}{source}"])
    rows += [["tmpfs", t] for t in tmpfs if t not in groups]
    return rows


def decision_table(view: dict[str, Any], color: bool = False) -> str:
    """The request, the decision with its reasons, and the edits: shared by inspect spec and
    inspect container."""
    req = view.get("request") or {}  # None in a record: the spec had no GPU marker to parse
    dec = view["decision"]
    out = [_decision_head(view, req, color)]
    channels = req.get("channels") or []
    if channels:
        rows = [[c["channel"], c["source"], c["value"] or '""'] for c in channels]
        out.append(section("Requests", table(["CHANNEL", "SOURCE", "VALUE"], rows), color))
    reasons = [
        [paint(r["verdict"], r["verdict"], color), r["channel"], r["value"], r["why"]]
        for r in dec["reasons"]
    ]
    out.append(section("Reasons", table(["VERDICT", "CHANNEL", "VALUE", "WHY"], reasons), color))
    if view.get("mps"):
        out.append(section("MPS", table(["LIMIT", "VALUE", "FROM"], _mps_rows(view["mps"])), color))
    rows = _edit_rows(view.get("edits"))
    if rows:
        out.append(section("Injected", table(["KIND", "WHAT"], rows), color))
    notes = (view.get("edits") or {}).get("notes", [])
    if notes:  # each edit, then why on its own indented line (both can be long)
        body = "".join(f"{n['what']}\n    {n['why']}\n" for n in notes)
        out.append(section("Driver edits", body, color))
    return "\n".join(out)


def _decision_head(view: dict[str, Any], req: dict[str, Any], color: bool) -> str:
    kube = view.get("kubernetes")
    who = "-"
    if kube:
        who = (
            f"Kubernetes {kube['container_type']} {kube['namespace']}/{kube['pod_name']} "
            f"container {kube['container_name'] or '-'} (pod uid {kube['pod_uid'] or '-'})"
        )
    elif req.get("channels") is not None:
        who = "not a Kubernetes container"
    dec = view["decision"]
    head = [
        ("Container", who),
        ("Privileged", "yes" if req.get("privileged") else "no" if req else "-"),
        ("Decision", _verdict(dec, color)),
    ]
    if dec.get("capabilities"):
        head.append(("Capabilities", ",".join(dec["capabilities"])))
    width = max(len(k) for k, _ in head)
    return "".join(f"{k.ljust(width)}  {v}\n" for k, v in head)


def _verdict(dec: dict[str, Any], color: bool) -> str:
    if not dec["gpu_container"]:
        return "no GPU (no request)"
    granted = paint("granted", "granted", color)
    if dec["devices"]:
        return granted + " " + ", ".join(f"{d['id']} ({d['uuid']})" for d in dec["devices"])
    if dec["driver_only"]:
        return granted + " driver files only (none)"
    return paint("refused", "refused", color) + ": no GPU"


def _mps_rows(mps: dict[str, Any]) -> list[list[str]]:
    pct = mps["active_thread_percentage"]
    rows = [
        ["group", mps["group"], ""],
        ["pipe dir", f"{mps['container_pipe_dir']} <- {mps['pipe_dir']}", ""],
        ["active threads", f"{pct['value']}%", pct["source"]],
    ]
    for d in mps["pinned_memory_limits"]:
        rows.append(
            ["pinned memory", f"device {d['index']} (GPU {d['gpu']}): {d['limit']}", d["source"]]
        )
        reserved = d.get("reserved")
        rows.append(
            [
                "reserved",
                f"device {d['index']} (GPU {d['gpu']}): "
                + (f"{reserved // (1 << 20)}M" if reserved else "none"),
                "the group's share (the daemon's default)" if reserved else "no share configured",
            ]
        )
    if mps.get("client_uid") is not None:
        rows.append(["client uid", str(mps["client_uid"]), "the process's user, on the host"])
    if mps.get("per_process"):
        rows.append(["per process", "yes", mps["per_process"]])
    return rows


def _edit_rows(edits: dict[str, Any] | None) -> list[list[str]]:
    if not edits:
        return []
    rows = [["env", e] for e in edits["env"]]
    nodes = [f"{d['path']} ({d['major']}:{d['minor']})" for d in edits["deviceNodes"]]
    if nodes:
        rows.append(["devices", ", ".join(nodes)])
    rows += _mount_rows(edits["mounts"])
    rows += [["hook", f"{h['hookName']}: {' '.join(h['args'])}"] for h in edits["hooks"]]
    rows += [["remove hook", h] for h in edits.get("removeHooks", [])]
    rows += [["replace mount", m] for m in edits.get("replaceMounts", [])]
    rows += [["engine injected", u] for u in edits.get("engineInjected", [])]
    return rows


# --- inspect container ----------------------------------------------------------------------------


def _short_decision(dec: dict[str, Any], color: bool) -> str:
    if not dec["gpu_container"]:
        return "no GPU"
    if dec["devices"]:
        return paint("granted", "granted", color) + " " + ",".join(d["id"] for d in dec["devices"])
    if dec["driver_only"]:
        return paint("granted", "granted", color) + " driver only"
    return paint("refused", "refused", color)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def container_table(record: dict[str, Any], color: bool = False, now: float | None = None) -> str:
    """One container's record: where and when it was decided, then :func:`decision_table`."""
    now = time.time() if now is None else now
    ts = float(record["timestamp"])
    rt = record.get("runtime") or {}
    runtime = rt.get("path") or "-"
    if rt.get("root"):
        runtime += f" --root {rt['root']}"
    head = [
        ("ID", record["container_id"]),
        ("Created", f"{_iso(ts)} ({age(now - ts)}) by gpuhook {record['gpuhook_version']}"),
        ("Bundle", record["bundle"]),
        ("Runtime", runtime),
        ("Config", record.get("config") or "-"),
    ]
    width = max(len(k) for k, _ in head)
    block = "".join(f"{k.ljust(width)}  {v}\n" for k, v in head)
    return block + "\n" + decision_table(record, color)


def records_table(
    records: list[dict[str, Any]], deleted: int, color: bool = False, now: float | None = None
) -> str:
    """``inspect container --all``: one line per container, oldest first."""
    now = time.time() if now is None else now
    rows = []
    for r in records:
        kube = r.get("kubernetes")
        who = "-"
        if kube:
            name = kube["container_name"] or kube["container_type"]
            who = f"{kube['namespace']}/{kube['pod_name']}/{name}"
        dec = r["decision"]
        why = dec["reasons"][0]["why"] if dec["reasons"] else ""
        rows.append(
            [
                r["container_id"][:12],
                age(now - float(r["timestamp"])),
                who,
                dec.get("channel") or "-",
                _short_decision(dec, color),
                _clip(why, 72),
            ]
        )
    out = table(["ID", "CREATED", "KUBERNETES", "CHANNEL", "DECISION", "WHY"], rows)
    if not records:
        out = "no decision records\n"
    if deleted:
        out += (
            f"({deleted} record link{'s' if deleted != 1 else ''} of deleted containers not "
            "shown; gpuhook gc removes them)\n"
        )
    return out


# --- inspect pod ----------------------------------------------------------------------------------


def _asked(record: dict[str, Any]) -> str:
    channels = (record.get("request") or {}).get("channels") or []
    return "; ".join(f"{c['channel']} {c['value'] or chr(34) * 2}" for c in channels) or "-"


def pod_table(view: dict[str, Any], color: bool = False, now: float | None = None) -> str:
    """``inspect pod``: one line per recorded container of the pod, oldest first."""
    now = time.time() if now is None else now
    rows = []
    pods: dict[str, str] = {}
    for r in view["containers"]:
        kube = r["kubernetes"]
        name = f"{kube['namespace']}/{kube['pod_name']}".strip("/")
        pods[kube["pod_uid"] or "-"] = pods.get(kube["pod_uid"] or "-") or name
        dec = r["decision"]
        rows.append(
            [
                kube["container_name"] or kube["container_type"],
                kube["container_type"],
                r["container_id"][:12],
                age(now - float(r["timestamp"])),
                _clip(_asked(r), 48),
                _short_decision(dec, color),
                _clip(dec["reasons"][0]["why"] if dec["reasons"] else "", 72),
            ]
        )
    head = "".join(f"Pod {name or '-'} (uid {uid})\n" for uid, name in pods.items())
    body = table(["CONTAINER", "TYPE", "ID", "CREATED", "ASKED", "GOT", "WHY"], rows)
    return head + "\n" + body


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
    checks = view["checks"]
    width = max((len(c["check"]) for c in checks), default=5)
    lines = []
    for c in checks:
        status = c["status"]
        line = f"{paint(status.upper().ljust(4), status, color)}  {c['check'].ljust(width)}  "
        line += c["message"]
        if c.get("fix") and status in ("fail", "warn"):
            line += f"; fix: {c['fix']}"
        lines.append(line.rstrip() + "\n")
    s = view["summary"]
    lines.append(
        f"\ndoctor: {s['fail']} failed, {s['warn']} warnings, {s['pass']} passed, "
        f"{s['skip']} skipped\n"
    )
    return "".join(lines)

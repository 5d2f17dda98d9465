"""``gpuhook inspect node --usage``: the view as a dict (JSON, YAML) and as text."""

from __future__ import annotations

import time

from gpuhook.nodeview import join

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.nodeview.probe import Snapshot

MIB = 1 << 20


def view(snap: Snapshot) -> dict[str, Any]:
    """The view's JSON form: per device what is granted and what runs, the MPS clients per
    share group, and the unexpected users (``unexpected_count`` is what the exit status says)."""
    out = snap.usage.to_dict()
    return {
        "nvml_error": snap.nvml_error,
        "unexpected_count": len(out["unexpected"]),
        **out,
    }


def _mib(n: int) -> str:
    return f"{n // MIB} MiB"


def _who(u: dict[str, Any]) -> str:
    if u["owner"] in (join.CONTAINER, join.UNRECORDED):
        pod = f"pod {u['pod']}/{u['container_name']}" if u["pod"] else ""
        cid = f"container {u['container_id'][:12]}"
        return f"{pod} ({cid})" if pod else cid
    if u["owner"] == join.MPS_SERVER:
        return f"MPS server of {u['mps_group']}: {u['command']}"
    if u["owner"] == join.HOST:
        command = u["command"] or "?"
        return f"host: {command[:77] + '...' if len(command) > 80 else command}"
    return "unseen"


def _grant_line(g: dict[str, Any], now: float) -> str:
    who = f"pod {g['pod']}/{g['container']}" if g["pod"] else "(not Kubernetes)"
    age = max(0, int(now - g["since"]))
    line = f"    {who} container {g['container_id'][:12]} via {g['channel']}, {g['state']}, {age}s"
    mps = g["mps"]
    if mps:
        limit = mps["pinned_memory_limit"]
        line += f", MPS {mps['group']} {mps['active_thread_percentage']}%"
        line += f" pinned {_mib(limit)}" if limit else ""
    return line


def text(v: dict[str, Any], _color: bool = False) -> str:
    now = time.time()
    lines: list[str] = []
    if v["nvml_error"]:
        lines.append(f"NVML: {v['nvml_error']} (no processes shown)")
    for d in v["devices"]:
        head = f"{d['kind'].upper()} {d['id']} {d['name']} {d['uuid']}"
        if d["mps_groups"]:
            head += f" (MPS {', '.join(d['mps_groups'])})"
        lines.append(head)
        lines.append("  granted:" + ("" if d["granted"] else " none"))
        lines.extend(_grant_line(g, now) for g in d["granted"])
        lines.append("  processes:" + ("" if d["processes"] else " none"))
        for u in d["processes"]:
            flag = "" if u["expected"] else "  UNEXPECTED"
            lines.append(f"    pid {u['pid']} {u['kind']} {_mib(u['used_memory'])} {_who(u)}{flag}")
    for group, clients in v["mps_clients"].items():
        shown = ", ".join(f"pid {c['pid']} on {c['device']} ({_who(c)})" for c in clients)
        lines.append(f"MPS {group} clients: {shown}")
    lines.append(f"unexpected GPU users: {v['unexpected_count']}")
    for u in v["unexpected"]:
        lines.append(f"  {u['device']} pid {u['pid']} {_who(u)}: {u['why']}")
    return "\n".join(lines) + "\n"

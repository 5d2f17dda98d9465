"""What ``gpuhook inspect spec|container|pod`` shows of a decision: tables a person reads in
seconds, from the typed decision records (:mod:`gpuhook.model.record`). The JSON output is the
record as written (``schemas/record.schema.json``); ``inspect spec`` shows a spec's decision in
the same shape."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpuhook.cli.render import age, paint, section, table
from gpuhook.model.decision import CHANNEL_ENGINE
from gpuhook.model.record import DecisionView
from gpuhook.pipeline.engine import is_gpu_node
from gpuhook.records import writer

if TYPE_CHECKING:
    from gpuhook.model.decision import Decision
    from gpuhook.model.edits import ContainerEdits, Mount
    from gpuhook.model.record import MpsView, Record
    from gpuhook.pipeline.flow import Outcome


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- inspect spec -------------------------------------------------------------------------------


def outcome_view(outcome: Outcome, bundle: str) -> dict[str, Any]:
    """``gpuhook inspect spec``: the bundle and the decision, in the decision record's shape."""
    return {"bundle": bundle, **writer.decided_view(outcome)}


def spec_table(view: dict[str, Any], color: bool = False) -> str:
    """:func:`outcome_view`'s table: read as a record's body is, then :func:`decision_table`."""
    return decision_table(DecisionView.from_dict(view), color)


def decision_table(view: DecisionView, color: bool = False) -> str:
    """The request, the decision with its reasons, and the edits: shared by inspect spec and
    inspect container."""
    out = [_decision_head(view, color)]
    channels = view.request.channels if view.request is not None else ()
    if channels:
        rows = [[c.channel, c.source, c.value or '""'] for c in channels]
        out.append(section("Requests", table(["CHANNEL", "SOURCE", "VALUE"], rows), color))
    reasons = [
        [paint(r.verdict, r.verdict, color), r.channel, r.value, r.why]
        for r in view.decision.reasons
    ]
    out.append(section("Reasons", table(["VERDICT", "CHANNEL", "VALUE", "WHY"], reasons), color))
    if view.mps is not None:
        out.append(section("MPS", table(["LIMIT", "VALUE", "FROM"], _mps_rows(view.mps)), color))
    rows = _edit_rows(view.edits)
    if rows:
        out.append(section("Injected", table(["KIND", "WHAT"], rows), color))
    notes = view.edits.notes
    if notes:  # each edit, then why on its own indented line (both can be long)
        body = "".join(f"{n.what}\n    {n.why}\n" for n in notes)
        out.append(section("Driver edits", body, color))
    return "\n".join(out)


def _decision_head(view: DecisionView, color: bool) -> str:
    kube, req, dec = view.kubernetes, view.request, view.decision
    who = "-"
    if kube is not None:
        who = (
            f"Kubernetes {kube.container_type} {kube.namespace}/{kube.pod_name} "
            f"container {kube.container_name or '-'} (pod uid {kube.pod_uid or '-'})"
        )
    elif req is not None:
        who = "not a Kubernetes container"
    privileged = "-" if req is None else "yes" if req.privileged else "no"
    head = [("Container", who), ("Privileged", privileged), ("Decision", _verdict(dec, color))]
    if dec.capabilities:
        head.append(("Capabilities", ",".join(dec.capabilities)))
    width = max(len(k) for k, _ in head)
    return "".join(f"{k.ljust(width)}  {v}\n" for k, v in head)


def _verdict(dec: Decision, color: bool) -> str:
    if not dec.gpu_container:
        return "no GPU (no request)"
    granted = paint("granted", "granted", color)
    if dec.devices:
        return granted + " " + ", ".join(f"{d.display_id} ({d.uuid})" for d in dec.devices)
    if dec.driver_only:
        return granted + " driver files only (none)"
    return paint("refused", "refused", color) + ": no GPU"


def _mps_rows(mps: MpsView) -> list[list[str]]:
    rows = [
        ["group", mps.group, ""],
        ["pipe dir", f"{mps.container_pipe_dir} <- {mps.pipe_dir}", ""],
        ["active threads", f"{mps.percentage}%", mps.percentage_source],
    ]
    for d in mps.limits:
        where = f"device {d.index} (GPU {d.gpu})"
        rows.append(["pinned memory", f"{where}: {d.limit}", d.source])
        reserved = d.reserved
        rows.append(
            [
                "reserved",
                f"{where}: " + (f"{reserved // (1 << 20)}M" if reserved else "none"),
                "the group's share (the daemon's default)" if reserved else "no share configured",
            ]
        )
    if mps.client_uid is not None:
        rows.append(["client uid", str(mps.client_uid), "the process's user, on the host"])
    if mps.per_process:
        rows.append(["per process", "yes", mps.per_process])
    return rows


def _edit_rows(edits: ContainerEdits) -> list[list[str]]:
    rows = [["env", e] for e in edits.env]
    nodes = [f"{d.path} ({d.major}:{d.minor})" for d in edits.device_nodes]
    if nodes:
        rows.append(["devices", ", ".join(nodes)])
    rows += _mount_rows(edits.mounts)
    rows += [["hook", f"{h.hook_name}: {' '.join(h.args)}"] for h in edits.hooks]
    rows += [["remove hook", h] for h in edits.remove_hooks]
    rows += [["replace mount", m] for m in edits.replace_mounts]
    rows += [["engine injected", u] for u in edits.engine_injected]
    return rows


def _mount_rows(mounts: tuple[Mount, ...]) -> list[list[str]]:
    """Mounts grouped by the folder they land in (a library folder is a tmpfs with one bind
    mount per name of each library): one row per folder, the full list is in the JSON."""
    tmpfs = [m.container_path for m in mounts if m.type != "bind"]
    groups: dict[str, dict[str, list[str]]] = {}  # container folder -> host file -> names
    for m in mounts:
        if m.type != "bind":
            continue
        folder, _, name = m.container_path.rpartition("/")
        groups.setdefault(folder or "/", {}).setdefault(m.host_path, []).append(name)
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


# --- inspect container ----------------------------------------------------------------------------


def _short_decision(dec: Decision, color: bool) -> str:
    if not dec.gpu_container:
        return "no GPU"
    if dec.devices:
        ids = ",".join(d.display_id for d in dec.devices)
        return paint("granted", "granted", color) + " " + ids
    if dec.driver_only:
        return paint("granted", "granted", color) + " driver only"
    return paint("refused", "refused", color)


def container_table(record: Record, color: bool = False, now: float | None = None) -> str:
    """One container's record: where and when it was decided, then :func:`decision_table`."""
    now = time.time() if now is None else now
    ts = record.timestamp
    runtime = record.runtime.path or "-"
    if record.runtime.root:
        runtime += f" --root {record.runtime.root}"
    head = [
        ("ID", record.container_id),
        ("Created", f"{_iso(ts)} ({age(now - ts)}) by gpuhook {record.gpuhook_version}"),
        ("Bundle", record.bundle),
        ("Runtime", runtime),
        ("Config", record.config or "-"),
    ]
    width = max(len(k) for k, _ in head)
    block = "".join(f"{k.ljust(width)}  {v}\n" for k, v in head)
    return block + "\n" + decision_table(record.view, color)


def records_table(
    records: list[Record], deleted: int, color: bool = False, now: float | None = None
) -> str:
    """``inspect container --all``: one line per container, oldest first."""
    now = time.time() if now is None else now
    rows = []
    for r in records:
        kube = r.kubernetes
        who = "-"
        if kube is not None:
            name = kube.container_name or kube.container_type
            who = f"{kube.namespace}/{kube.pod_name}/{name}"
        dec = r.decision
        why = dec.reasons[0].why if dec.reasons else ""
        rows.append(
            [
                r.container_id[:12],
                age(now - r.timestamp),
                who,
                dec.channel or "-",
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


def _asked(record: Record) -> str:
    """The request channels, then the GPU nodes the engine injected (found by device number)."""
    req = record.view.request
    channels = req.channels if req is not None else ()
    asked = [f"{c.channel} {c.value or chr(34) * 2}" for c in channels]
    devices = req.engine_devices if req is not None else ()
    nodes = [path for path, major, minor in devices if is_gpu_node(major, minor)]
    if nodes:
        asked.append(f"{CHANNEL_ENGINE} {','.join(nodes)}")
    return "; ".join(asked) or "-"


def pod_table(records: list[Record], color: bool = False, now: float | None = None) -> str:
    """``inspect pod``: one line per recorded container of the pod, oldest first."""
    now = time.time() if now is None else now
    rows = []
    pods: dict[str, str] = {}
    for r in records:
        kube = r.kubernetes
        if kube is None:  # not a pod's: lookup.find_pod returns none such
            continue
        name = f"{kube.namespace}/{kube.pod_name}".strip("/")
        pods[kube.pod_uid or "-"] = pods.get(kube.pod_uid or "-") or name
        dec = r.decision
        rows.append(
            [
                kube.container_name or kube.container_type,
                kube.container_type,
                r.container_id[:12],
                age(now - r.timestamp),
                _clip(_asked(r), 48),
                _short_decision(dec, color),
                _clip(dec.reasons[0].why if dec.reasons else "", 72),
            ]
        )
    head = "".join(f"Pod {name or '-'} (uid {uid})\n" for uid, name in pods.items())
    body = table(["CONTAINER", "TYPE", "ID", "CREATED", "ASKED", "GOT", "WHY"], rows)
    return head + "\n" + body

"""The report of a run: rows per case and runtime against plain runc in the same run, the
targets' verdicts, the text table, and the Markdown table of the README."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from cases import (
    CASES,
    EDITED,
    GPUHOOK,
    GPUHOOK_PYTHON,
    INTERP,
    NOHOOK,
    PASSTHROUGH,
    PER_FILE,
    RUNC_PARTS,
    TARGET_CONCURRENT_P95_FACTOR,
    TARGET_OVER_GPU1_MS,
    TARGET_OVERHEAD_MS,
    TARGET_OWN_SHARE_MS,
    TARGET_PASSTHROUGH_MS,
)
from stats import median, summary

if TYPE_CHECKING:
    from runner import Bench


def build_report(
    bench: Bench,
    samples: dict[str, dict[str, list[float]]],
    concurrent: dict[str, dict[str, Any]],
    elapsed_s: float,
) -> dict[str, Any]:
    names = [rt.name for rt in bench.runtimes]
    rows: list[dict[str, Any]] = []
    labels = {key: label for key, label, _ in CASES}
    labels[PASSTHROUGH[0]] = PASSTHROUGH[1]
    for key in [c for c, _, _ in CASES] + [PASSTHROUGH[0]]:
        base = summary(samples[key]["runc"])
        for name in names:
            s = summary(samples[key][name])
            row: dict[str, Any] = {"case": key, "label": labels[key], "runtime": name, **s}
            row["overhead_ms"] = s["median"] - base["median"]
            row["paired_overhead_ms"] = paired(samples[key][name], samples[key]["runc"])
            row["ratio"] = s["median"] / base["median"]
            cpu = median(samples[f"{key}:cpu"][name])
            row["cpu_median_ms"] = cpu
            row["cpu_overhead_ms"] = cpu - median(samples[f"{key}:cpu"]["runc"])
            if key != PASSTHROUGH[0]:
                phases = {}
                for phase in ("create", "start", "delete"):
                    ps = summary(samples[f"{key}:{phase}"][name])
                    phases[phase] = {"median": ps["median"], "p95": ps["p95"]}
                row["phases"] = phases
            rows.append(row)
    conc_rows = []
    for width, per in concurrent.items():
        base_lat = per["runc"]["latencies"]
        conc_base: dict[str, float] | None = summary(base_lat) if base_lat else None
        for name in names:
            entry = per[name]
            lat = entry["latencies"]
            s = summary(lat) if lat else {"n": 0, "min": 0.0, "median": 0.0, "p95": 0.0, "max": 0.0}
            conc_rows.append(
                {
                    "case": f"concurrent{width}",
                    "label": f"{width} concurrent creates (1 GPU)",
                    "runtime": name,
                    "width": int(width),
                    "attempts": len(lat) + entry["failures"],
                    "failures": entry["failures"],
                    "corrupt_specs": entry["corrupt"],
                    **s,
                    "p95_overhead_ms": (s["p95"] - conc_base["p95"]) if conc_base else None,
                    "ratio": (s["median"] / conc_base["median"])
                    if conc_base and conc_base["median"]
                    else None,
                    "p95_ratio": (s["p95"] / conc_base["p95"])
                    if conc_base and conc_base["p95"]
                    else None,
                }
            )
    own_share = paired(samples["gpu1"][GPUHOOK], samples[EDITED[0]]["runc"])
    targets = evaluate_targets(rows, conc_rows, GPUHOOK, own_share)
    peers = {
        rt.name: evaluate_targets(rows, conc_rows, rt.name)
        for rt in bench.runtimes
        if rt.name not in ("runc", GPUHOOK)
    }
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            **machine_info(bench),
            "python_start_ms": summary(samples[INTERP[0]]["python"]),
        },
        "runc_on_edited_gpu1": summary(samples[EDITED[0]]["runc"]),
        "gpuhook_own_share_ms": own_share,
        "runc_parts": {key: summary(samples[key]["runc"]) for key, _ in RUNC_PARTS},
        "gpu1_parts_ms": gpu1_parts(samples),
        "iterations": bench.opts.iterations,
        "warmup": bench.opts.warmup,
        "rounds": bench.opts.rounds,
        "seed": bench.opts.seed,
        "mode": run_mode(bench),
        "elapsed_s": round(elapsed_s, 1),
        "runtimes": {rt.name: rt.path for rt in bench.runtimes},
        "cases": rows,
        "concurrent": conc_rows,
        "targets": targets,
        "peer_targets": peers,
    }


def gpu1_parts(samples: dict[str, dict[str, list[float]]]) -> dict[str, float]:
    """Where gpuhook's 1-GPU overhead goes, each part the median of its per-iteration
    differences in this run: runc's work for the device nodes and mounts, runc running the
    ldcache hook, gpuhook's own work; and what the per-file binds cost over the prepared
    folders."""
    runc = samples["gpu1"]["runc"]
    nohook, edited = samples[NOHOOK[0]]["runc"], samples[EDITED[0]]["runc"]
    return {
        "runc: device nodes and mounts": paired(nohook, runc),
        "runc: gpuhook's ldcache hook": paired(edited, nohook),
        "gpuhook's own work (dispatcher, service, spec)": paired(samples["gpu1"][GPUHOOK], edited),
        "libraries bound per file instead of prepared": paired(
            samples[PER_FILE[0]]["runc"], edited
        ),
    }


def paired(values: list[float], base: list[float]) -> float:
    """The median of the per-iteration differences (both measured in the same iterations, in
    order): drift that hits one iteration hits both."""
    return median([a - b for a, b in zip(values, base, strict=True)])


def run_mode(bench: Bench) -> dict[str, Any]:
    """How the runtimes ran: whether gpuhook had its runtime service (its socket, or None), the
    options that add or configure runtimes, and where the fake nodes were built."""
    o = bench.opts
    return {
        "service_socket": bench.socket,
        "no_service": o.no_service,
        "compare_python": o.compare_python,
        "peers": list(o.peer),
        "peer_env": list(o.peer_env),
        "peer_cdi_hook": o.peer_cdi_hook,
        "nodes": o.nodes,
    }


def evaluate_targets(
    rows: list[dict[str, Any]],
    conc: list[dict[str, Any]],
    name: str,
    own_share: float | None = None,
) -> list[dict[str, Any]]:
    """The targets' verdicts for the runtime ``name``; ``own_share``: gpuhook's own share of its
    1-GPU lifecycle (None: not checked, as for a peer)."""
    by = {(r["case"], r["runtime"]): r for r in rows}
    out: list[dict[str, Any]] = []

    def add(label: str, value: float | None, limit: float, unit: str, extra: bool = True) -> None:
        ok = value is not None and value <= limit and extra
        out.append({"target": label, "value": value, "limit": limit, "unit": unit, "ok": ok})

    for case, limit in TARGET_OVERHEAD_MS.items():
        add(f"{case} lifecycle overhead", by[(case, name)]["overhead_ms"], limit, "ms")
    if own_share is not None:
        add(f"gpuhook's own share of gpu1 (over {EDITED[1]})", own_share, TARGET_OWN_SHARE_MS, "ms")
    gpu1 = by[("gpu1", name)]["overhead_ms"]
    for case, limit in TARGET_OVER_GPU1_MS.items():
        add(f"{case} overhead - gpu1 overhead", by[(case, name)]["overhead_ms"] - gpu1, limit, "ms")
    add(
        "passthrough overhead",
        by[("passthrough", name)]["overhead_ms"],
        TARGET_PASSTHROUGH_MS,
        "ms",
    )
    single = (
        by[("gpu1", name)]["phases"]["create"]["median"]
        - by[("gpu1", "runc")]["phases"]["create"]["median"]
    )
    for row in conc:
        if row["runtime"] != name:
            continue
        whole = row["failures"] == 0 and row["corrupt_specs"] == 0 and row["n"] > 0
        limit = TARGET_CONCURRENT_P95_FACTOR * single
        add(
            f"{row['width']} concurrent: all ok, p95 overhead <= {TARGET_CONCURRENT_P95_FACTOR:g}x "
            f"single create overhead ({single:.1f} ms)",
            row["p95_overhead_ms"],
            limit,
            "ms",
            whole,
        )
    return out


def machine_info(bench: Bench) -> dict[str, Any]:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {}
    for rt in bench.runtimes:
        out = subprocess.run(
            [rt.path, "--version"], capture_output=True, text=True, env=rt.env, check=False
        )
        versions[rt.name] = (out.stdout.strip().splitlines() or [""])[0]
    return {
        "hostname": platform.node(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load_avg_at_start": bench.load_at_start,
        "load_avg_at_end": os.getloadavg(),
        "bundle_fs": bench.work,
        "versions": versions,
    }


def print_report(report: dict[str, Any], out: Any = sys.stdout) -> None:
    m = report["machine"]
    out.write(
        f"gpuhook lifecycle bench {report['date']}: {m['cpus']} CPUs ({m['cpu']}), "
        f"kernel {m['kernel']}, {report['iterations']} iterations (median/p95 of that many), "
        f"{report['elapsed_s']:.0f}s; {INTERP[1]}: median "
        f"{m['python_start_ms']['median']:.1f} ms (the issue's reference machine: 6.6 ms)\n"
    )
    out.write(f"runtimes: {', '.join(f'{k} = {v}' for k, v in report['runtimes'].items())}\n\n")
    head = f"{'case':<42} {'runtime':<10} {'min':>7} {'median':>7} {'p95':>7}"
    head += f" {'overhead':>9} {'ratio':>6} {'cpu':>6} {'cpu+':>6}\n"
    out.write(head)
    out.write("-" * (len(head) - 1) + "\n")
    for row in report["cases"]:
        base = row["runtime"] == "runc"
        over = "" if base else f"{row['overhead_ms']:+8.1f}"
        ratio = "" if base else f"{row['ratio']:.2f}x"
        cpu_over = "" if base else f"{row['cpu_overhead_ms']:+6.1f}"
        out.write(
            f"{row['label']:<42} {row['runtime']:<10} {row['min']:7.1f} {row['median']:7.1f} "
            f"{row['p95']:7.1f} {over:>9} {ratio:>6} {row['cpu_median_ms']:6.1f} {cpu_over:>6}\n"
        )
    for row in report["concurrent"]:
        base = row["runtime"] == "runc"
        over = "" if base else f"{row['p95_overhead_ms']:+8.1f}"
        ratio = "" if base or row["p95_ratio"] is None else f"{row['p95_ratio']:.2f}x"
        label = f"{row['width']} concurrent creates, 1 GPU: "
        label += f"{row['attempts'] - row['failures']}/{row['attempts']} ok"
        label += f", {row['corrupt_specs']} bad" if row["corrupt_specs"] else ""
        out.write(
            f"{label:<42} {row['runtime']:<10} {row['min']:7.1f} {row['median']:7.1f} "
            f"{row['p95']:7.1f} {over:>9} {ratio:>6}\n"
        )
    la = report["machine"]
    out.write(
        "\nms of wall time per lifecycle (create+start+delete calls; passthrough: one call); "
        "overhead and ratio: median against runc's in the same run; cpu: median CPU ms of the "
        "lifecycle (calls, container init, hooks; not the runtime service's workers, where "
        "gpuhook's GPU creates are decided, nor any daemon a peer uses), cpu+: over runc's. "
        "Concurrent rows: one "
        "create each; overhead and ratio at p95. Load average at start "
        f"{la['load_avg_at_start'][0]:.2f}, at end {la['load_avg_at_end'][0]:.2f}.\n"
    )
    by = {(r["case"], r["runtime"]): r for r in report["cases"]}
    edited = report["runc_on_edited_gpu1"]["median"]
    runc_gpu1 = by[("gpu1", "runc")]["median"]
    gpuhook_gpu1 = by[("gpu1", GPUHOOK)]["median"]
    out.write(
        f"{EDITED[1]}: median {edited:.1f} ms, {edited - runc_gpu1:+.1f} over runc on the "
        f"unedited spec: runc's own work for the injection; gpuhook's share of the 1-GPU "
        f"overhead: {gpuhook_gpu1 - edited:+.1f} ms (difference of medians), "
        f"{report['gpuhook_own_share_ms']:+.1f} ms (median of per-iteration differences).\n"
    )
    out.write("1-GPU overhead, part by part (medians of per-iteration differences, same run):\n")
    for part, ms in report["gpu1_parts_ms"].items():
        out.write(f"  {part:<48} {ms:+6.1f} ms\n")
    out.write("\ntargets (gpuhook):\n")
    for t in report["targets"]:
        value = "n/a" if t["value"] is None else f"{t['value']:.2f} {t['unit']}"
        verdict = "PASS" if t["ok"] else "FAIL"
        limit = f"{t['limit']:.2f} {t['unit']}"
        out.write(f"  {verdict}  {t['target']}: {value} (limit {limit})\n")
    for line in peer_ratios(report):
        out.write(line + "\n")
    for peer, targets in report["peer_targets"].items():
        out.write(
            f"same targets for {peer}: "
            + ", ".join(f"{t['target'].split(':')[0]} {'ok' if t['ok'] else 'no'}" for t in targets)
            + "\n"
        )


def peer_ratios(report: dict[str, Any]) -> list[str]:
    """gpuhook's overhead against each peer's, case by case (same run)."""
    by = {(r["case"], r["runtime"]): r for r in report["cases"]}
    lines = []
    for peer in [n for n in report["runtimes"] if n not in ("runc", GPUHOOK)]:
        lines.append(f"\ngpuhook against {peer} (median overhead over runc, same run):")
        for key, label in [(c, lbl) for c, lbl, _ in CASES] + [PASSTHROUGH]:
            ours, theirs = by[(key, GPUHOOK)]["overhead_ms"], by[(key, peer)]["overhead_ms"]
            ratio = f"{ours / theirs:.2f}x" if theirs > 0 else "n/a"
            lines.append(f"  {label:<42} gpuhook {ours:+7.1f}  {peer} {theirs:+7.1f}  {ratio}")
        if peer != GPUHOOK_PYTHON:
            lines += peer_goals(by, peer)
    return lines


def peer_goals(by: dict[tuple[str, str], dict[str, Any]], peer: str) -> list[str]:
    """Issue 14's goals against a peer runtime, in the same run."""
    over = {key: (by[(key, GPUHOOK)]["overhead_ms"], by[(key, peer)]["overhead_ms"]) for key in
            ("nongpu", "leak", "gpu1", "gpu8")}  # fmt: skip
    goals = [
        ("non-GPU <= 0.5x the peer's", over["nongpu"][0] <= 0.5 * over["nongpu"][1]),
        (
            "leak case below the peer's non-GPU overhead + 6 ms",
            over["leak"][0] < over["nongpu"][1] + 6.0,
        ),
        ("1 GPU below the peer's", over["gpu1"][0] < over["gpu1"][1]),
        ("8 GPUs below the peer's", over["gpu8"][0] < over["gpu8"][1]),
    ]
    return [f"  {'PASS' if ok else 'FAIL'}  {goal}" for goal, ok in goals]


def markdown(report: dict[str, Any]) -> str:
    """The table as Markdown (for the README): one row per case, one column group per runtime."""
    names = list(report["runtimes"])
    others = [n for n in names if n != "runc"]
    head = ["case", "runc median (p95)"]
    head += [f"{n} median (p95), overhead, ratio" for n in others]
    head += [f"{n} CPU overhead" for n in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by = {(r["case"], r["runtime"]): r for r in report["cases"]}
    for key, label in [(c, lbl) for c, lbl, _ in CASES] + [PASSTHROUGH]:
        base = by[(key, "runc")]
        cells = [label, f"{base['median']:.1f} ({base['p95']:.1f})"]
        for n in others:
            r = by[(key, n)]
            over = f"**{r['overhead_ms']:+.1f}**"
            cells.append(f"{r['median']:.1f} ({r['p95']:.1f}), {over}, {r['ratio']:.2f}x")
        cells += [f"{by[(key, n)]['cpu_overhead_ms']:+.1f}" for n in others]
        lines.append("| " + " | ".join(cells) + " |")
    conc = {(r["width"], r["runtime"]): r for r in report["concurrent"]}
    for width in sorted({r["width"] for r in report["concurrent"]}):
        base = conc[(width, "runc")]
        cells = [f"{width} concurrent creates (1 GPU), p95", f"{base['p95']:.1f}"]
        for n in others:
            r = conc[(width, n)]
            ok = f"{r['attempts'] - r['failures']}/{r['attempts']} ok"
            cells.append(f"{r['p95']:.1f}, **{r['p95_overhead_ms']:+.1f}**, {ok}")
        cells += ["" for _ in others]
        lines.append("| " + " | ".join(cells) + " |")
    edited = report["runc_on_edited_gpu1"]
    interp = report["machine"]["python_start_ms"]
    lines += [
        "",
        f"Same run: {EDITED[1]} median {edited['median']:.1f} ms (p95 {edited['p95']:.1f}); "
        f"`{INTERP[1]}` median {interp['median']:.1f} ms (p95 {interp['p95']:.1f}). "
        "CPU overhead: the lifecycle's calls, container init and hooks over runc's; the runtime "
        "service's workers (where gpuhook's GPU creates are decided) are not counted.",
        "",
        "1-GPU overhead, part by part (medians of per-iteration differences, same run): "
        + "; ".join(f"{part} **{ms:+.1f}** ms" for part, ms in report["gpu1_parts_ms"].items())
        + ".",
    ]
    ratios = peer_ratios(report)
    if ratios:
        lines += ["", "```text", *[x.strip("\n") for x in ratios], "```"]
    return "\n".join(lines) + "\n"

#!/usr/bin/python3
"""Container-start overhead on THIS node's real GPUs: gpuhook-runtime against plain runc (and
NVIDIA's runtime in CDI mode with the spec ``nvidia-ctk cdi generate`` writes here), one run.

    bench/realnode.py --config /etc/gpuhook/config.yaml [-n 30] \\
        [--nvidia-runtime PATH --nvidia-ctk PATH --nvidia-cdi-hook PATH]

``make bench`` measures on the fake node, where every driver file is a stub; this is the same
lifecycle (``bench/lifecycle.py``: create with ``--log``/``--pid-file``, start, reap, delete, each
call timed, interleaved in a shuffled order) on a machine with an NVIDIA driver, for the figures
a real GPU node gives. The node's gpuhook config must have a refreshed inventory; the bench copies
it with the runtime service on its own socket (and log level info) and starts that service.
Cases: a non-GPU container, ``make bench``'s leak case (image env ``NVIDIA_VISIBLE_DEVICES=all``,
Kubernetes CRI annotations, a kubelet checkpoint the bench writes in which other pods hold every
GPU), GPU 0 (``NVIDIA_VISIBLE_DEVICES=0``), GPU 0 in a big image (3,000 ELF libraries, when a C
compiler is at hand) and plain runc on gpuhook's GPU-0 spec (runc's own work for the injection).
Each runtime's GPU spec must hold ``/dev/nvidia0`` and gpuhook's leak-case spec none, or the
bench stops.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.join(os.path.dirname(BENCH), "tools"))

import bundles  # noqa: E402
import cases  # noqa: E402
import nodes  # noqa: E402
import peer  # noqa: E402
import stats  # noqa: E402
import testbed  # noqa: E402

CASES = (
    ("nongpu", "non-GPU container"),
    ("leak", "leak case (env all, k8s, no allocation)"),
    ("gpu1", "GPU 0"),
    ("gpu1big", "GPU 0, big image (3,000 libraries)"),
)
EDITED = ("edited", "plain runc on gpuhook's GPU-0 spec")
NVIDIA = "nvidia"


def node_config(config: str, work: str, socket: str) -> str:
    """A copy of the node's config with the bench's service socket, log level info, its own
    state folder (the decision records' links go there, not among the node's) and its own kubelet
    checkpoint (other pods hold every GPU: the leak case's pod has no allocation), reading the
    node's inventory where it is."""
    with open(config) as fh:
        data: dict[str, Any] = yaml.safe_load(fh) or {}
    inventory = data.setdefault("inventory", {})
    state = data.get("state_dir") or "/var/lib/gpuhook"
    inventory["path"] = inventory.get("path") or os.path.join(state, "inventory.json")
    data["state_dir"] = os.path.join(work, "state")
    with open(inventory["path"]) as fh:
        gpus = [g["uuid"] for g in json.load(fh).get("gpus", [])]
    checkpoint = os.path.join(work, "kubelet_internal_checkpoint")  # other pods hold every GPU
    nodes.write_checkpoint(checkpoint, gpus)
    policy = data.setdefault("policy", {}).setdefault("kubernetes", {})
    policy["checkpoint"] = checkpoint
    data.setdefault("runtime", {})["service"] = socket
    data.setdefault("log", {})["level"] = "info"
    path = os.path.join(work, "gpuhook.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    return path


def nvidia_config(opts: argparse.Namespace, driver_root: str, dev_root: str, work: str) -> str:
    """NVIDIA's CDI spec for this node, written by its own ``nvidia-ctk cdi generate``, and the
    runtime's config.toml (CDI mode, that spec folder, this runc); XDG_CONFIG_HOME for it."""
    spec_dir = os.path.join(work, "nvidia-cdi")
    xdg = os.path.join(work, "nvidia-xdg")
    os.makedirs(spec_dir)
    argv = [opts.nvidia_ctk, "cdi", "generate", "--output", os.path.join(spec_dir, "nvidia.yaml")]
    argv += ["--driver-root", driver_root, "--dev-root", dev_root]
    argv += ["--nvidia-cdi-hook-path", opts.nvidia_cdi_hook, "--ldconfig-path", "/sbin/ldconfig"]
    for folder in ("lib64", "lib", "lib/x86_64-linux-gnu"):
        if os.path.isdir(os.path.join(driver_root, folder)):
            argv += ["--library-search-path", os.path.join(driver_root, folder)]
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise bundles.BenchError(f"nvidia-ctk cdi generate failed: {why}")
    return peer.write_runtime_config(xdg, driver_root, opts.runc, spec_dir)


class RealBench:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.rng = random.Random(opts.seed)  # noqa: S311 - an order, not a secret
        os.makedirs(opts.work, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="gpuhook-realbench-", dir=opts.work)
        self.ids = 0
        self.service: subprocess.Popen[bytes] | None = None
        self.runtimes: list[bundles.Runtime] = []
        self.bundles: dict[tuple[str, str], bundles.Bundle] = {}
        self.cases = [c for c, _ in CASES if c != "gpu1big" or shutil.which("gcc")]

    def next_id(self) -> str:
        self.ids += 1
        return f"grb{os.getpid()}-{self.ids}"

    def setup(self) -> None:
        o = self.opts
        socket = os.path.join(self.work, "runtime.sock")
        config = node_config(o.config, self.work, socket)
        cache = os.path.join(self.work, "config-cache")
        base = {"PATH": nodes.BASE_PATH, "LANG": "C"}
        ours = {**base, "GPUHOOK_CONFIG": config, "GPUHOOK_CACHE_DIR": cache}
        truth = {"bench_config": config, "env": {"GPUHOOK_CACHE_DIR": cache}}
        log = os.path.join(self.work, "svc.log")
        self.service = nodes.start_service(o.hook, socket, truth, log)
        self.runtimes = [
            bundles.Runtime("runc", o.runc, base),
            bundles.Runtime(cases.GPUHOOK, o.runtime, ours),
        ]
        if o.nvidia_runtime:
            with open(config) as fh:
                data = yaml.safe_load(fh) or {}
            xdg = nvidia_config(
                o, data.get("driver_root", "/"), data.get("dev_root", "/"), self.work
            )
            self.runtimes.append(
                bundles.Runtime(NVIDIA, o.nvidia_runtime, {**base, "XDG_CONFIG_HOME": xdg})
            )
        rootfs = testbed.build_rootfs(os.path.join(self.work, "rootfs"))
        big = ""
        if "gpu1big" in self.cases:
            big = testbed.build_rootfs(os.path.join(self.work, "rootfs-big"))
            testbed.add_libraries(big, cases.BIG_IMAGE_LIBRARIES)
        template = testbed.base_spec(os.path.join(self.work, "spec"))
        for case in self.cases:
            kw = cases.case_spec_kwargs(case if case != "gpu1big" else "gpu1", {})
            for rt in self.runtimes:
                fs = big if case == "gpu1big" else rootfs
                self.bundles[(case, rt.name)] = self._bundle(
                    f"{case}-{rt.name}", rt, fs, kw, template
                )
        self.edited = self._edited(rootfs, template)

    def _bundle(
        self,
        name: str,
        rt: bundles.Runtime,
        rootfs: str,
        kw: dict[str, Any],
        template: dict[str, Any],
    ) -> bundles.Bundle:
        path = os.path.join(self.work, "bundles", name)
        testbed.make_bundle(path, rootfs, args=("/bin/true",), spec_template=template, **kw)
        with open(os.path.join(path, "config.json"), "rb") as fh:
            original = fh.read()
        state = os.path.join(self.work, "state", rt.name)
        os.makedirs(state, exist_ok=True)
        return bundles.Bundle(path, original, rt, state)

    def _edited(self, rootfs: str, template: dict[str, Any]) -> bundles.Bundle:
        """Plain runc on the spec gpuhook-runtime wrote for GPU 0 (its bundle path swapped)."""
        b = self._bundle(
            "edited-runc", self.runtimes[0], rootfs, cases.case_spec_kwargs("gpu1", {}), template
        )
        bundles.take_edited_spec(self.bundles[("gpu1", cases.GPUHOOK)], b, self.next_id())
        return b

    def check_spec(self, case: str, b: bundles.Bundle) -> None:
        """A GPU case's spec must hold GPU 0's node; gpuhook's leak case must hold none (and
        ``void``): a runtime that did less is not measured doing the case's work."""
        with open(b.config, "rb") as fh:
            spec = json.loads(fh.read())
        devices = [d.get("path") for d in spec.get("linux", {}).get("devices", []) or []]
        if case == "leak":
            env = spec.get("process", {}).get("env", [])
            if b.runtime.name == cases.GPUHOOK and (
                "NVIDIA_VISIBLE_DEVICES=void" not in env or "/dev/nvidia0" in devices
            ):
                raise bundles.BenchError(f"gpuhook's leak-case spec grants a GPU: {b.config}")
        elif "/dev/nvidia0" not in devices:
            raise bundles.BenchError(f"{b.runtime.name}'s GPU spec lacks /dev/nvidia0: {b.config}")

    def run(self, iterations: int, warmup: int) -> dict[str, dict[str, list[float]]]:
        samples: dict[str, dict[str, list[float]]] = {}
        jobs = [(c, rt.name) for c in self.cases for rt in self.runtimes] + [(EDITED[0], "runc")]
        for it in range(warmup + iterations):
            self.rng.shuffle(jobs)
            for case, name in jobs:
                b = self.edited if case == EDITED[0] else self.bundles[(case, name)]
                cid = self.next_id()
                try:
                    create, start, delete, cpu = bundles.lifecycle(b, cid)
                except bundles.BenchError:
                    bundles.force_delete(b.runtime, b.state, cid)
                    raise
                if it == 0 and case != "nongpu" and name != "runc":
                    self.check_spec(case, b)
                if it >= warmup:
                    samples.setdefault(case, {}).setdefault(name, []).append(
                        create + start + delete
                    )
                    samples.setdefault(case + ":cpu", {}).setdefault(name, []).append(cpu)
            if self.service is not None and self.service.poll() is not None:
                raise bundles.BenchError("the runtime service exited during the run")
        return samples

    def cleanup(self) -> None:
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
            self.service.wait(timeout=30)
        for rt in self.runtimes:
            state = os.path.join(self.work, "state", rt.name)
            for cid in os.listdir(state) if os.path.isdir(state) else []:
                bundles.force_delete(rt, state, cid)
        shutil.rmtree(self.work, ignore_errors=True)


def report(bench: RealBench, samples: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    labels = dict(CASES)
    rows = []
    for case in bench.cases:
        base = stats.summary(samples[case]["runc"])
        base_cpu = stats.median(samples[case + ":cpu"]["runc"])
        for rt in bench.runtimes:
            s = stats.summary(samples[case][rt.name])
            cpu = stats.median(samples[case + ":cpu"][rt.name])
            rows.append(
                {
                    "case": case,
                    "label": labels[case],
                    "runtime": rt.name,
                    **s,
                    "overhead_ms": s["median"] - base["median"],
                    "ratio": s["median"] / base["median"],
                    "cpu_overhead_ms": cpu - base_cpu,
                }
            )
    edited = stats.summary(samples[EDITED[0]]["runc"])
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "iterations": bench.opts.iterations,
        "runtimes": {rt.name: rt.path for rt in bench.runtimes},
        "cases": rows,
        "runc_on_edited_gpu1": edited,
    }


def markdown(rep: dict[str, Any]) -> str:
    names = list(rep["runtimes"])
    head = "| case | " + " | ".join(f"{n} median (p95), overhead" for n in names) + " |\n"
    lines = [head, "|---" * (len(names) + 1) + "|\n"]
    for case in dict.fromkeys(r["case"] for r in rep["cases"]):
        cells = []
        for r in (r for r in rep["cases"] if r["case"] == case):
            extra = "" if r["runtime"] == "runc" else f", **{r['overhead_ms']:+.1f}**"
            cells.append(f"{r['median']:.1f} ({r['p95']:.1f}){extra}")
        label = next(r["label"] for r in rep["cases"] if r["case"] == case)
        lines.append(f"| {label} | " + " | ".join(cells) + " |\n")
    e = rep["runc_on_edited_gpu1"]
    lines.append(f"\n{EDITED[1]}: median {e['median']:.1f} ms (p95 {e['p95']:.1f}).\n")
    return "".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--config", required=True, help="this node's gpuhook config (inventory refreshed)"
    )
    p.add_argument("-n", "--iterations", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runtime", default=os.path.join(here, "build", "bin", "gpuhook-runtime"))
    p.add_argument("--hook", default=os.path.join(here, "build", "bin", "gpuhook"))
    p.add_argument("--runc", default=shutil.which("runc") or "/usr/sbin/runc")
    p.add_argument("--nvidia-runtime", metavar="PATH", help="NVIDIA's nvidia-container-runtime")
    p.add_argument("--nvidia-ctk", metavar="PATH", help="NVIDIA's nvidia-ctk (writes its CDI spec)")
    p.add_argument("--nvidia-cdi-hook", metavar="PATH", help="NVIDIA's nvidia-cdi-hook")
    p.add_argument("--work", default="/dev/shm", help="where the bundles go (tmpfs: /dev/shm)")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--markdown", metavar="PATH")
    p.add_argument("--seed", type=int, default=8)
    opts = p.parse_args(argv)
    if opts.nvidia_runtime and not (opts.nvidia_ctk and opts.nvidia_cdi_hook):
        p.error("--nvidia-runtime needs --nvidia-ctk and --nvidia-cdi-hook")
    return opts


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    for name in ("json", "markdown", "config", "work"):
        value = getattr(opts, name)
        setattr(opts, name, os.path.abspath(value) if value else value)
    if os.geteuid() != 0:
        sys.stderr.write("realnode: needs root (runc)\n")
        return 2
    if ctypes.CDLL(None).prctl(bundles.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.stderr.write("realnode: cannot become a child subreaper\n")
        return 2
    bench = RealBench(opts)
    try:
        bench.setup()
        rep = report(bench, bench.run(opts.iterations, opts.warmup))
    except (bundles.BenchError, subprocess.CalledProcessError) as exc:
        sys.stderr.write(f"realnode: {exc}\n")
        return 1
    finally:
        bench.cleanup()
    table = markdown(rep)
    sys.stdout.write(table)
    for path, text in ((opts.json, json.dumps(rep, indent=2) + "\n"), (opts.markdown, table)):
        if path:
            with open(path, "w") as fh:
                fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

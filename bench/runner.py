"""One run: its fake nodes, runtimes and bundles set up, the interleaved lifecycles of every case
and runtime, the concurrent creates, and the clean-up."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

import testbed
from bundles import (
    BenchError,
    Bundle,
    Runtime,
    call,
    force_delete,
    interpreter_start,
    lifecycle,
    reap,
    take_edited_spec,
)
from cases import (
    BIG_IMAGE_CASES,
    BIG_IMAGE_LIBRARIES,
    CASES,
    EDITED,
    GPUHOOK,
    GPUHOOK_PYTHON,
    INTERP,
    NOHOOK,
    OURS,
    PASSTHROUGH,
    PER_FILE,
    RUNC_PARTS,
    case_spec_kwargs,
)
from nodes import BASE_PATH, cache_env, make_node, start_service, tail, write_checkpoint
from peer import write_peer_config

if TYPE_CHECKING:
    import argparse


class Bench:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.load_at_start = os.getloadavg()
        self.rng = random.Random(opts.seed)  # noqa: S311 - an order, not a secret
        base = "/run" if _is_tmpfs("/run") else "/dev/shm"
        self.work = tempfile.mkdtemp(prefix="gpuhook-bench-", dir=base)
        if opts.nodes:
            self.nodes = os.path.abspath(opts.nodes)
            os.makedirs(self.nodes, exist_ok=True)
        else:
            # On the same tmpfs: a node's state folder (records, exec-env markers) on a disk of
            # its own costs ~10 us a file; $TMPDIR may be a busy ext4 without a journal, where
            # a new file costs 0.1-0.9 ms (ext4 skips every recently deleted inode), varying
            # from run to run with whatever else churns files there.
            self.nodes = tempfile.mkdtemp(prefix="gpuhook-bench-nodes-", dir=base)
        self.ids = 0
        self.runtimes: list[Runtime] = []
        self.states: dict[str, str] = {}
        self.service: subprocess.Popen[bytes] | None = None
        self.socket: str | None = None  # the runtime service's, when one runs
        self.service_log = os.path.join(self.work, "runtime-service.log")
        self.created: list[tuple[Runtime, str, str]] = []

    def log(self, message: str) -> None:
        if not self.opts.quiet:
            sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
            sys.stderr.flush()

    def next_id(self) -> str:
        self.ids += 1
        return f"gb{os.getpid()}-{self.ids}"

    def setup(self) -> None:
        o = self.opts
        self.log(f"bundles and runtime state on {self.work}; fake nodes in {self.nodes}")
        checkpoint = os.path.join(self.nodes, "kubelet_internal_checkpoint")
        socket = "" if o.no_service else os.path.join(self.work, "runtime.sock")
        self.node_a = make_node(
            os.path.join(self.nodes, "a"), o.hook, o.runc, checkpoint, socket, "--gpus", "8"
        )
        self.node_b = make_node(
            os.path.join(self.nodes, "b"),
            o.hook,
            o.runc,
            checkpoint,
            socket,
            "--gpus",
            "8",
            "--mig-gpus",
            "0,1,2,3,4,5,6,7",
            "--mig-devices",
            "7",
        )
        write_checkpoint(checkpoint, [g["uuid"] for g in self.node_a["gpus"]])
        base_env = {"PATH": BASE_PATH, "LANG": "C"}
        self.runtimes = [Runtime("runc", o.runc, dict(base_env))]
        self.runtimes.append(Runtime(GPUHOOK, o.runtime, dict(base_env)))
        if socket:
            self.service = start_service(o.hook, socket, self.node_a, self.service_log)
            self.socket = socket
            self.log(f"runtime service listening on {socket} (pid {self.service.pid})")
            if o.compare_python:
                self.runtimes.append(Runtime(GPUHOOK_PYTHON, o.runtime, dict(base_env)))
        peer_env = dict(base_env)
        for item in o.peer_env:
            key, _, value = item.partition("=")
            peer_env[key] = value
        self.peer_xdg: dict[str, str] = {}
        if o.peer_cdi_hook:  # NVIDIA's runtime in CDI mode: a generated spec per fake node
            for node, truth in (("a", self.node_a), ("b", self.node_b)):
                folder = os.path.join(self.nodes, f"peer-{node}")
                self.peer_xdg[node] = write_peer_config(folder, truth, o.runc, o.peer_cdi_hook)
        for peer in o.peer:
            name, eq, path = peer.partition("=")
            if not eq:
                name, path = os.path.basename(peer), peer
            self.runtimes.append(Runtime(name, os.path.abspath(path), dict(peer_env)))
        for rt in self.runtimes:
            if not os.access(rt.path, os.X_OK):
                raise BenchError(f"runtime {rt.path} is not executable")
            self.states[rt.name] = os.path.join(self.work, "state", rt.name)
            os.makedirs(self.states[rt.name])
        self.rootfs = testbed.build_rootfs(os.path.join(self.work, "rootfs-template"))
        self.big_rootfs = testbed.build_rootfs(os.path.join(self.work, "rootfs-big"))
        testbed.add_libraries(self.big_rootfs, BIG_IMAGE_LIBRARIES)
        self.spec_template = testbed.base_spec(os.path.join(self.work, "spec"))
        self.bundles: dict[tuple[str, str], Bundle] = {}
        for case, _, node in CASES:
            rootfs = self.big_rootfs if case in BIG_IMAGE_CASES else self.rootfs
            for rt in self.runtimes:
                self.bundles[(case, rt.name)] = self._bundle(
                    f"{case}-{rt.name}", rt, node, case_spec_kwargs(case, self.node_b), rootfs
                )
        self.edited = self.edited_bundle()
        self.parts = {
            EDITED[0]: self.edited,
            NOHOOK[0]: self.derived_bundle("nohook-runc", without_hooks(self.edited.original)),
            PER_FILE[0]: self.per_file_bundle(),
        }
        widths = [int(n) for n in o.concurrency.split(",") if n.strip()] if o.concurrency else []
        self.widths = widths
        self.pool: dict[str, list[Bundle]] = {rt.name: [] for rt in self.runtimes}
        for rt in self.runtimes:
            for i in range(max(widths, default=0)):
                self.pool[rt.name].append(
                    self._bundle(
                        f"conc{i}-{rt.name}", rt, "a", case_spec_kwargs("gpu1", self.node_b)
                    )
                )

    def check_service(self) -> None:
        """The runtime service must still run: without it the dispatcher falls back to Python,
        still correct, so the gpuhook rows would silently measure that fallback instead."""
        if self.service is None:
            return
        code = self.service.poll()
        if code is not None:
            raise BenchError(
                f"the runtime service (pid {self.service.pid}) exited with {code} during the run; "
                f"gpuhook's rows would measure the Python fallback. Its output: "
                f"{tail(self.service_log)}"
            )

    def edited_bundle(self) -> Bundle:
        """A runc bundle whose config.json is what gpuhook-runtime wrote for the 1-GPU case
        (its own paths swapped in): one gpuhook create, the spec read back, then delete."""
        runc = next(rt for rt in self.runtimes if rt.name == "runc")
        b = self._bundle("edited-runc", runc, "a", case_spec_kwargs("gpu1", self.node_b))
        take_edited_spec(self.bundles[("gpu1", GPUHOOK)], b, self.next_id())
        return b

    def derived_bundle(self, name: str, spec: bytes) -> Bundle:
        """A runc bundle of the 1-GPU case whose config.json is ``spec``, its path swapped in."""
        runc = next(rt for rt in self.runtimes if rt.name == "runc")
        b = self._bundle(name, runc, "a", case_spec_kwargs("gpu1", self.node_b))
        b.original = spec.replace(self.edited.path.encode(), b.path.encode())
        return b

    def per_file_bundle(self) -> Bundle:
        """A runc bundle whose spec is gpuhook's 1-GPU spec with the driver's libraries bound
        per file: gpuhook's create on node a while its inventory names no prepared folder (as
        the inventory of a gpuhook before them), the inventory restored after."""
        runc = next(rt for rt in self.runtimes if rt.name == "runc")
        b = self._bundle("perfile-runc", runc, "a", case_spec_kwargs("gpu1", self.node_b))
        path = os.path.join(self.node_a["state_dir"], "inventory.json")
        with open(path, "rb") as fh:
            original = fh.read()
        inventory = json.loads(original)
        if not inventory.pop("prepared", None):
            raise BenchError(f"node a's inventory names no prepared driver folder: {path}")
        try:
            with open(path, "w") as fh:
                json.dump(inventory, fh)
            take_edited_spec(self.bundles[("gpu1", GPUHOOK)], b, self.next_id())
        finally:
            with open(path, "wb") as fh:
                fh.write(original)
        if b.original.count(b'"bind"') < 10:
            raise BenchError("gpuhook's per-file 1-GPU spec does not bind the libraries per file")
        return b

    def _bundle(
        self, name: str, rt: Runtime, node: str, kw: dict[str, Any], rootfs: str = ""
    ) -> Bundle:
        path = os.path.join(self.work, "bundles", name)
        testbed.make_bundle(
            path, rootfs or self.rootfs, args=("/bin/true",), spec_template=self.spec_template, **kw
        )
        with open(os.path.join(path, "config.json"), "rb") as fh:
            original = fh.read()
        truth = self.node_a if node == "a" else self.node_b
        env = {**rt.env, **cache_env(truth)}
        env["GPUHOOK_CONFIG"] = truth["bench_config"]
        if rt.name == GPUHOOK_PYTHON:
            env["GPUHOOK_CONFIG"] = truth["bench_config_python"]
        if rt.name not in ("runc", *OURS) and node in self.peer_xdg:
            env["XDG_CONFIG_HOME"] = self.peer_xdg[node]
        runtime = Runtime(rt.name, rt.path, env)
        return Bundle(path, original, runtime, self.states[rt.name])

    def run_single(self, iterations: int, warmup: int) -> dict[str, dict[str, list[float]]]:
        """samples[case][runtime] -> lifecycle ms (and case+':create' etc. for the phases)."""
        samples: dict[str, dict[str, list[float]]] = {}
        jobs = [(case, rt.name) for case, _, _ in CASES for rt in self.runtimes]
        jobs += [(PASSTHROUGH[0], rt.name) for rt in self.runtimes]
        jobs += [(INTERP[0], "python")] + [(key, "runc") for key, _ in RUNC_PARTS]
        total = warmup + iterations
        started = time.monotonic()
        for it in range(total):
            self.rng.shuffle(jobs)
            for case, rt_name in jobs:
                if case in self.parts:
                    b = self.parts[case]
                    create, start, delete, cpu = lifecycle(b, self.next_id())
                    if it >= warmup:
                        samples.setdefault(case, {}).setdefault(rt_name, []).append(
                            create + start + delete
                        )
                    continue
                if case == INTERP[0]:
                    ms = interpreter_start()
                    if it >= warmup:
                        samples.setdefault(case, {}).setdefault(rt_name, []).append(ms)
                    continue
                if case == PASSTHROUGH[0]:
                    b = self.bundles[("nongpu", rt_name)]
                    ms, cpu = call(b, b.argv("list"), "list")
                    if it >= warmup:
                        samples.setdefault(case, {}).setdefault(rt_name, []).append(ms)
                        samples.setdefault(case + ":cpu", {}).setdefault(rt_name, []).append(cpu)
                    continue
                b = self.bundles[(case, rt_name)]
                cid = self.next_id()
                try:
                    create, start, delete, cpu = lifecycle(b, cid)
                except BenchError:
                    force_delete(b.runtime, b.state, cid)
                    raise
                if it in (0, total - 1):
                    self.check_spec(case, b)
                if it < warmup:
                    continue
                per = samples.setdefault(case, {})
                per.setdefault(rt_name, []).append(create + start + delete)
                samples.setdefault(case + ":create", {}).setdefault(rt_name, []).append(create)
                samples.setdefault(case + ":start", {}).setdefault(rt_name, []).append(start)
                samples.setdefault(case + ":delete", {}).setdefault(rt_name, []).append(delete)
                samples.setdefault(case + ":cpu", {}).setdefault(rt_name, []).append(cpu)
            self.check_service()
            if (it + 1) % max(1, total // 10) == 0:
                self.log(
                    f"lifecycles: iteration {it + 1}/{total} ({time.monotonic() - started:.0f}s)"
                )
        return samples

    def check_spec(self, case: str, b: Bundle) -> None:
        """After a create: the spec must be whole JSON; gpuhook's must carry what the case
        expects, and a peer's GPU cases the GPU's device nodes (a peer that left them out did
        not do the work its timings are compared with). (The spec is read back after the
        container was deleted; the bundle stays.)"""
        spec = _read_spec(b)
        env = spec.get("process", {}).get("env", [])
        devices = [d.get("path") for d in spec.get("linux", {}).get("devices", []) or []]
        if b.runtime.name == "runc":
            return
        if b.runtime.name not in OURS:
            if case in ("gpu1", "gpu8", "mig56") and not _has_gpu_devices(case, devices):
                raise BenchError(
                    f"{b.runtime.name}'s spec for case {case} lacks the GPU's device nodes "
                    f"(has {devices}): {b.config}"
                )
            return
        if case in ("nongpu",):
            ok = spec == json.loads(b.original)
        elif case == "leak":
            ok = "NVIDIA_VISIBLE_DEVICES=void" in env and not any(
                "nvidia" in str(d) for d in devices
            )
        elif case in ("gpu1", "gpu1big"):
            ok = f"NVIDIA_VISIBLE_DEVICES={self.node_a['gpus'][0]['uuid']}" in env
        else:
            ok = _has_gpu_devices(case, devices)
        if not ok:
            raise BenchError(
                f"gpuhook's spec for case {case} is not what the case expects: {b.config}"
            )

    def run_concurrent(self, rounds: int) -> dict[str, dict[str, Any]]:
        results: dict[str, dict[str, Any]] = {}
        for width in self.widths:
            per: dict[str, Any] = {
                rt.name: {"latencies": [], "failures": 0, "corrupt": 0} for rt in self.runtimes
            }
            for r in range(rounds):
                order = list(self.runtimes)
                self.rng.shuffle(order)
                for rt in order:
                    lat, fails, corrupt = self._concurrent_round(rt, width)
                    entry = per[rt.name]
                    entry["latencies"].extend(lat)
                    entry["failures"] += fails
                    entry["corrupt"] += corrupt
                self.check_service()
                self.log(f"concurrent creates: N={width} round {r + 1}/{rounds}")
            results[str(width)] = per
        return results

    def _concurrent_round(self, rt: Runtime, width: int) -> tuple[list[float], int, int]:
        bundles = self.pool[rt.name][:width]
        ids = [self.next_id() for _ in bundles]
        for b in bundles:
            b.reset()
        times: list[float] = [0.0] * width
        codes: list[int] = [0] * width
        procs: list[subprocess.Popen[bytes]] = []
        starts: list[float] = []
        errs = []

        def wait(i: int) -> None:
            codes[i] = procs[i].wait()
            times[i] = (time.perf_counter() - starts[i]) * 1000.0

        threads = []
        for i, b in enumerate(bundles):
            err = open(b.stderr, "wb")  # noqa: SIM115 - closed below
            errs.append(err)
            starts.append(time.perf_counter())
            procs.append(
                subprocess.Popen(
                    b.argv("create", "--bundle", b.path, "--pid-file", b.pid_file, ids[i]),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=b.runtime.env,
                    cwd=b.path,
                )
            )
            t = threading.Thread(target=wait, args=(i,))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        for err in errs:
            err.close()
        failures = sum(1 for c in codes if c != 0)
        corrupt = 0
        for b, code in zip(bundles, codes, strict=True):
            if code != 0:
                continue
            try:
                spec = _read_spec(b)
                if rt.name in OURS:
                    env = spec["process"]["env"]
                    if f"NVIDIA_VISIBLE_DEVICES={self.node_a['gpus'][0]['uuid']}" not in env:
                        corrupt += 1
                elif rt.name == "runc" and spec != json.loads(b.original):
                    corrupt += 1
                if any(".gpuhook-tmp-" in n for n in os.listdir(b.path)):
                    corrupt += 1
            except (ValueError, KeyError, TypeError, OSError):
                corrupt += 1
        # Clean up (not timed): delete every container, concurrently.
        killers = [
            subprocess.Popen(
                [rt.path, "--root", b.state, "delete", "--force", cid],
                env=b.runtime.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for b, cid in zip(bundles, ids, strict=True)
        ]
        for k in killers:
            k.wait()
        for b in bundles:
            try:
                with open(b.pid_file) as fh:
                    reap(int(fh.read().strip()), 5.0)
            except (OSError, ValueError):
                pass
        if failures and not self.opts.quiet:
            b = bundles[codes.index(next(c for c in codes if c != 0))]
            with open(b.stderr, "rb") as errf:
                detail = errf.read().decode(errors="replace").strip()
            self.log(f"{rt.name}: a concurrent create failed: {detail}")
        return [t for t, c in zip(times, codes, strict=True) if c == 0], failures, corrupt

    def cleanup(self) -> None:
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
            self.service.wait(timeout=30)
        for rt in self.runtimes:
            state = self.states.get(rt.name)
            if not state or not os.path.isdir(state):
                continue
            for cid in os.listdir(state):
                force_delete(rt, state, cid)
        if not self.opts.keep:
            shutil.rmtree(self.work, ignore_errors=True)
            if not self.opts.nodes:
                shutil.rmtree(self.nodes, ignore_errors=True)
        else:
            self.log(f"kept {self.work} and {self.nodes}")


def _has_gpu_devices(case: str, devices: list[Any]) -> bool:
    """Whether a spec's device paths hold the GPU case's nodes: GPU 0 (gpu1), all 8 (gpu8), the
    last GPU and its MIG caps nodes (mig56)."""
    if case in ("gpu1", "gpu1big"):
        return "/dev/nvidia0" in devices
    if case == "gpu8":
        return all(f"/dev/nvidia{i}" in devices for i in range(8))
    if case == "mig56":
        return "/dev/nvidia7" in devices and any("nvidia-caps" in str(d) for d in devices)
    raise ValueError(case)


def without_hooks(spec: bytes) -> bytes:
    """``spec`` without its hooks."""
    data = json.loads(spec)
    data.pop("hooks", None)
    return json.dumps(data).encode()


def _read_spec(b: Bundle) -> dict[str, Any]:
    with open(b.config, "rb") as fh:
        spec: dict[str, Any] = json.loads(fh.read())
    return spec


def _is_tmpfs(path: str) -> bool:
    try:
        with open("/proc/self/mounts") as fh:
            return any(line.split()[1] == path and line.split()[2] == "tmpfs" for line in fh)
    except OSError:
        return False

#!/usr/bin/python3
"""Container-start overhead of gpuhook-runtime over plain runc, measured in one interleaved run.

    make bench                      # or: bench/lifecycle.py [-n 100] [--peer PATH] ...

Each case is a real OCI bundle (a busybox rootfs running /bin/true, the spec ``runc spec``
writes) on tmpfs, driven through the lifecycle an engine's shim drives: ``create`` (with
``--log``, ``--log-format json`` and ``--pid-file``), ``start``, reap the container's init (this
process is a child subreaper, as containerd-shim is), ``delete``. The three runtime calls are
timed; the container's own run time is not. Every runtime (plain runc, the gpuhook-runtime
dispatcher an operator installs, any ``--peer``) runs every case in every iteration, in a
shuffled order, so drift on a busy machine hits them alike. The bundle's config.json is restored
before each lifecycle (an engine writes a fresh one per container).

Cases: a non-GPU container; the default-"all" leak case (image env NVIDIA_VISIBLE_DEVICES=all,
Kubernetes CRI annotations, a kubelet checkpoint that allocates nothing to it); 1 GPU; 1 GPU in a
big image (3,000 ELF libraries across 12 ld.so.conf.d folders, and its own ld.so.cache, as CUDA
and PyTorch images carry them); 8 GPUs; one MIG device on a node with 8 GPUs and 56 MIG devices;
one passthrough call (``list``); and N concurrent creates of 1-GPU containers (every create must
succeed and every spec must be whole). Each lifecycle starts from the image's own ld.so.cache (an
engine's fresh snapshot), restored with the spec.

Output: a table (min/median/p95 per case and runtime, overhead over runc in ms and as a ratio),
the targets of issue 8 with their verdicts, and the same as JSON (``--json``, default
build/bench/latest.json). Needs root, runc, busybox-static and gcc (tools/fake-node).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

import testbed  # noqa: E402
from peer import write_peer_config  # noqa: E402

FAKE_NODE = os.path.join(REPO, "tools", "fake-node")
PR_SET_CHILD_SUBREAPER = 36
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# (key, label, node, what the spec carries). node "a": 8 GPUs; node "b": 8 GPUs x 7 MIG devices.
CASES: tuple[tuple[str, str, str], ...] = (
    ("nongpu", "non-GPU container", "a"),
    ("leak", "leak case (env all, k8s, no allocation)", "a"),
    ("gpu1", "1 GPU", "a"),
    ("gpu1big", "1 GPU, big image (3,000 libraries)", "a"),
    ("gpu8", "8 GPUs", "a"),
    ("mig56", "1 MIG device, 56-MIG inventory", "b"),
)
# The cases whose bundles get the big image's rootfs, and its size.
BIG_IMAGE_CASES = frozenset({"gpu1big"})
BIG_IMAGE_LIBRARIES = 3000
PASSTHROUGH = ("passthrough", "passthrough call (list)")
# The machine's speed, for comparing runs across machines: the bare interpreter start that every
# create pays (the reference machine: 6.6 ms), measured interleaved with the cases.
INTERP = ("interp", "/usr/bin/python3 -I -S -c pass")
# What runc itself spends on the edits of a 1-GPU container (device nodes, bind mounts, the
# ld.so.cache hook): plain runc on the spec gpuhook wrote, so gpuhook's own share of the 1-GPU
# overhead is the rest.
EDITED = ("edited", "plain runc on gpuhook's 1-GPU spec")

# Targets (medians on the 2-core reference machine), checked on every run: issue 14's for the
# non-GPU and leak cases and the passthrough call, issue 28's for 1 GPU and the big image, issue
# 8's for the rest.
TARGET_OVERHEAD_MS = {"nongpu": 3.0, "leak": 12.0, "gpu1": 14.0, "gpu8": 15.0, "mig56": 15.0}
TARGET_BIG_IMAGE_MS = 2.0  # gpuhook's overhead on the big image over its overhead on the small
TARGET_PASSTHROUGH_MS = 0.7
# The gpuhook runtimes of a run: the dispatcher with the runtime service (the .deb's setup) and,
# with --compare-python, the same dispatcher whose config names no service (Python decides).
GPUHOOK = "gpuhook"
GPUHOOK_PYTHON = "gpuhook-python"
OURS = (GPUHOOK, GPUHOOK_PYTHON)
TARGET_MIG_VS_GPU1 = 1.1
TARGET_CONCURRENT_P95_FACTOR = 3.0

K8S_ANNOTATIONS = {
    "io.kubernetes.cri.container-type": "container",
    "io.kubernetes.cri.container-name": "trainer",
    "io.kubernetes.cri.sandbox-id": "5f2d1c0b9a8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928170",
    "io.kubernetes.cri.sandbox-name": "trainer-7d9f8c6b5-x2x4q",
    "io.kubernetes.cri.sandbox-namespace": "ml",
    "io.kubernetes.cri.sandbox-uid": "0b6c3e1a-6f0e-4c55-9a55-3f1b2a7c9d10",
    "io.kubernetes.cri.image-name": "registry.example/ml/trainer:1.0",
}


class BenchError(Exception):
    """A runtime call failed or a spec came out wrong: the bench stops with one line."""


# --- statistics ---------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "min": min(values),
        "median": median(values),
        "p95": percentile(values, 95),
        "max": max(values),
    }


# --- runtimes and bundles -----------------------------------------------------------------------


class Runtime:
    def __init__(self, name: str, path: str, env: dict[str, str]) -> None:
        self.name = name
        self.path = path
        self.env = env


class Bundle:
    """A bundle whose config.json is restored from ``original`` before each use."""

    def __init__(self, path: str, original: bytes, runtime: Runtime, state: str) -> None:
        self.path = path
        self.original = original
        self.ldcache = os.path.join(path, "rootfs", "etc", "ld.so.cache")
        with open(self.ldcache, "rb") as fh:
            self.image_ldcache = fh.read()  # the image's own, as each container starts with it
        self.runtime = runtime
        self.state = state
        self.config = os.path.join(path, "config.json")
        self.stderr = os.path.join(path, "runtime.stderr")
        self.pid_file = os.path.join(path, "init.pid")
        self.log = os.path.join(path, "runtime-log.json")

    def reset(self) -> None:
        with open(self.config, "wb") as fh:
            fh.write(self.original)
        with open(self.ldcache, "wb") as fh:
            fh.write(self.image_ldcache)
        for name in ("init.pid", "gpuhook-decision.json", "runtime-log.json"):
            try:
                os.unlink(os.path.join(self.path, name))
            except FileNotFoundError:
                pass

    def argv(self, *args: str) -> list[str]:
        rt = self.runtime.path
        return [rt, "--root", self.state, "--log", self.log, "--log-format", "json", *args]


def call(bundle: Bundle, argv: list[str], what: str) -> tuple[float, float]:
    """Run one runtime call as a shim does (stdin and stdout /dev/null, cwd the bundle); return
    its wall time and CPU time (user+sys of it and the children it waited for) in ms. Raises
    BenchError when it fails. posix_spawn + wait4: the least harness work around the call."""
    os.chdir(bundle.path)
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, bundle.stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
    ]
    t0 = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, bundle.runtime.env, file_actions=actions)
    _, status, usage = os.wait4(pid, 0)
    elapsed = (time.perf_counter() - t0) * 1000.0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        with open(bundle.stderr, "rb") as fh:
            detail = fh.read().decode(errors="replace").strip().splitlines()
        raise BenchError(
            f"{bundle.runtime.name} {what} failed with {code} in {bundle.path}: "
            f"{detail[-1] if detail else '(no stderr)'}"
        )
    return elapsed, (usage.ru_utime + usage.ru_stime) * 1000.0


def interpreter_start() -> float:
    """Wall ms of ``python3 -I -S -c pass`` (the interpreter gpuhook-runtime starts)."""
    argv = ["/usr/bin/python3", "-I", "-S", "-c", "pass"]
    t0 = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, {})
    os.waitpid(pid, 0)
    return (time.perf_counter() - t0) * 1000.0


def reap(pid: int, timeout_s: float = 10.0) -> float:
    """Wait for the container's init (reparented to this subreaper) to exit; return its CPU
    time in ms (runc init's own work in the container, and the hooks it ran and waited for)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _, usage = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            return 0.0  # not our child (no subreaper): runc delete copes with a stopped container
        if done:
            return (usage.ru_utime + usage.ru_stime) * 1000.0
        if time.monotonic() > deadline:
            raise BenchError(f"container init {pid} did not exit within {timeout_s:.0f}s")
        time.sleep(0.0005)


def lifecycle(bundle: Bundle, container_id: str) -> tuple[float, float, float, float]:
    """create -> start -> (reap) -> delete; returns the three call times and the CPU time of
    the whole lifecycle (the calls, the container's init and its hooks), in ms."""
    bundle.reset()
    create, cpu_create = call(
        bundle,
        bundle.argv("create", "--bundle", bundle.path, "--pid-file", bundle.pid_file, container_id),
        "create",
    )
    with open(bundle.pid_file) as fh:
        pid = int(fh.read().strip())
    start, cpu_start = call(bundle, bundle.argv("start", container_id), "start")
    cpu_init = reap(pid)
    delete, cpu_delete = call(bundle, bundle.argv("delete", container_id), "delete")
    return create, start, delete, cpu_create + cpu_start + cpu_init + cpu_delete


def take_edited_spec(src: Bundle, dest: Bundle, container_id: str) -> None:
    """Give ``dest`` (a plain runc bundle) the spec that ``src``'s gpuhook-runtime writes on
    create (one create, the spec read back, the container deleted), ``src``'s path swapped for
    ``dest``'s: runc's own share of a GPU container's start is then measured on ``dest``. Raises
    BenchError when that spec does not name its bundle or lacks the ldcache hook."""
    src.reset()
    argv = src.argv("create", "--bundle", src.path, "--pid-file", src.pid_file, container_id)
    call(src, argv, "create")
    with open(src.config, "rb") as fh:
        spec = fh.read()
    force_delete(src.runtime, src.state, container_id)
    dest.original = spec.replace(src.path.encode(), dest.path.encode())
    if dest.original == spec or b"update-ldcache" not in spec:
        raise BenchError("gpuhook's 1-GPU spec does not name its bundle or lacks its hook")


def force_delete(runtime: Runtime, state: str, container_id: str) -> None:
    subprocess.run(
        [runtime.path, "--root", state, "delete", "--force", container_id],
        env=runtime.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


# --- the fake nodes -----------------------------------------------------------------------------


def make_node(
    folder: str, hook: str, runc: str, checkpoint: str, service: str, *args: str
) -> dict[str, Any]:
    """A fake GPU node (tools/fake-node) with a production-like gpuhook config (log level info,
    the bench's kubelet checkpoint, the bench's runtime service), its inventory refreshed; and a
    copy of that config without the service (``bench_config_python``)."""
    out = subprocess.run(
        [
            sys.executable,
            FAKE_NODE,
            folder,
            "--force",
            "--hook-path",
            hook,
            "--runtime",
            runc,
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise BenchError(f"tools/fake-node failed: {out.stderr.strip()}")
    with open(os.path.join(folder, "node.json")) as fh:
        truth: dict[str, Any] = json.load(fh)
    config = os.path.join(folder, "bench-config.yaml")
    cdi_dir = os.path.join(folder, "cdi")  # never the host's CDI folders
    for path, socket in ((config, service), (os.path.join(folder, "bench-python.yaml"), "")):
        with open(path, "w") as fh:
            fh.write(
                "# gpuhook config of the bench's fake node (as an operator's: log level info)\n"
                f"driver_root: {json.dumps(truth['driver_root'])}\n"
                f"dev_root: {json.dumps(truth['dev_root'])}\n"
                f"state_dir: {json.dumps(truth['state_dir'])}\n"
                f"runtime:\n  path: {json.dumps(runc)}\n  service: {json.dumps(socket)}\n"
                f"log:\n  level: info\n  file: {json.dumps(truth['log_file'])}\n"
                f"hook:\n  path: {json.dumps(hook)}\n"
                f"cdi:\n  output: {json.dumps(os.path.join(cdi_dir, 'gpuhook-nvidia.json'))}\n"
                f"  spec_dirs: [{json.dumps(cdi_dir)}]\n"
                "policy:\n  kubernetes:\n    env_requests: verify\n"
                f"    checkpoint: {json.dumps(checkpoint)}\n"
            )
    refresh = subprocess.run(
        [hook, "inventory", "refresh"],
        env={"PATH": BASE_PATH, "GPUHOOK_CONFIG": config, **cache_env(truth)},
        capture_output=True,
        text=True,
        check=False,
    )
    if refresh.returncode != 0:
        raise BenchError(f"gpuhook inventory refresh failed: {refresh.stderr.strip()}")
    truth["bench_config"] = config
    truth["bench_config_python"] = os.path.join(folder, "bench-python.yaml")
    return truth


def cache_env(truth: dict[str, Any]) -> dict[str, str]:
    """The fake node's own gpuhook config cache (GPUHOOK_CACHE_DIR), never the host's /run."""
    return {"GPUHOOK_CACHE_DIR": truth["env"]["GPUHOOK_CACHE_DIR"]}


def start_service(
    hook: str, socket: str, truth: dict[str, Any], output: str, timeout_s: float = 60.0
) -> subprocess.Popen[bytes]:
    """``gpuhook runtime serve`` on ``socket`` for the fake node ``truth``, once it listens. Its
    stdout and stderr go to the file ``output`` (a pipe nobody reads would block it once full)."""
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [hook, "runtime", "serve", "--socket", socket],
            env={"PATH": BASE_PATH, "GPUHOOK_CONFIG": truth["bench_config"], **cache_env(truth)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + timeout_s
    while True:
        with open(output, "rb") as fh:
            first, newline, _ = fh.read().partition(b"\n")
        if newline and b"listening" in first:
            return proc
        if newline or proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise BenchError(f"gpuhook runtime serve did not start: {tail(output)}")
        time.sleep(0.02)


def tail(path: str, lines: int = 5) -> str:
    """The last ``lines`` lines of the file ``path``, on one line."""
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError as exc:
        return f"({path}: {exc.strerror})"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"


def write_checkpoint(path: str, gpu_uuids: list[str]) -> None:
    """A kubelet device checkpoint in which other pods hold every GPU (nothing for the bench's
    pod), in the NUMA-map layout of Kubernetes >= 1.20."""
    entries = [
        {
            "PodUID": f"7a1e0c55-0000-4000-8000-{i:012d}",
            "ContainerName": "worker",
            "ResourceName": "nvidia.com/gpu",
            "DeviceIDs": {"0": [gpu]},
            "AllocResp": "CiQKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSCkdQVS0wMDAwMDA=",
        }
        for i, gpu in enumerate(gpu_uuids)
    ]
    with open(path, "w") as fh:
        json.dump(
            {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 1}, fh
        )


def case_spec_kwargs(case: str, node_b: dict[str, Any]) -> dict[str, Any]:
    if case == "nongpu":
        return {}
    if case == "leak":
        return {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "annotations": K8S_ANNOTATIONS}
    if case in ("gpu1", "gpu1big"):
        return {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}
    if case == "gpu8":
        return {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}
    if case == "mig56":
        last = node_b["gpus"][-1]["mig_devices"][-1]["uuid"]  # the last of the 56
        return {"env": [f"NVIDIA_VISIBLE_DEVICES={last}"]}
    raise ValueError(case)


# --- the run ------------------------------------------------------------------------------------


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
        jobs += [(INTERP[0], "python"), (EDITED[0], "runc")]
        total = warmup + iterations
        started = time.monotonic()
        for it in range(total):
            self.rng.shuffle(jobs)
            for case, rt_name in jobs:
                if case == EDITED[0]:
                    b = self.edited
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


# --- report -------------------------------------------------------------------------------------


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
    targets = evaluate_targets(rows, conc_rows, GPUHOOK)
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
    rows: list[dict[str, Any]], conc: list[dict[str, Any]], name: str
) -> list[dict[str, Any]]:
    by = {(r["case"], r["runtime"]): r for r in rows}
    out: list[dict[str, Any]] = []

    def add(label: str, value: float | None, limit: float, unit: str, extra: bool = True) -> None:
        ok = value is not None and value <= limit and extra
        out.append({"target": label, "value": value, "limit": limit, "unit": unit, "ok": ok})

    for case, limit in TARGET_OVERHEAD_MS.items():
        add(f"{case} lifecycle overhead", by[(case, name)]["overhead_ms"], limit, "ms")
    gpu1 = by[("gpu1", name)]["overhead_ms"]
    mig = by[("mig56", name)]["overhead_ms"]
    add("mig56 overhead / gpu1 overhead", mig / gpu1 if gpu1 > 0 else None, TARGET_MIG_VS_GPU1, "x")
    big = by[("gpu1big", name)]["overhead_ms"]
    add("gpu1big overhead - gpu1 overhead (big image)", big - gpu1, TARGET_BIG_IMAGE_MS, "ms")
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
        f"overhead: {gpuhook_gpu1 - edited:+.1f} ms.\n"
        "\ntargets (gpuhook):\n"
    )
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
    ]
    ratios = peer_ratios(report)
    if ratios:
        lines += ["", "```text", *[x.strip("\n") for x in ratios], "```"]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "-n",
        "--iterations",
        type=int,
        default=100,
        help="measured lifecycles per case and runtime (interleaved; >= 40 for a report)",
    )
    p.add_argument("--warmup", type=int, default=3, help="unmeasured lifecycles first")
    p.add_argument(
        "--concurrency", default="32,64", help="widths of the concurrent-create case ('' for none)"
    )
    p.add_argument(
        "--rounds", type=int, default=5, help="rounds of each concurrent width per runtime"
    )
    p.add_argument("--runtime", default=testbed.RUNTIME, help="gpuhook-runtime to measure")
    p.add_argument(
        "--hook", default=testbed.GPUHOOK, help="the gpuhook executable (hooks, inventory)"
    )
    p.add_argument("--runc", default=shutil.which("runc") or "/usr/sbin/runc")
    p.add_argument(
        "--no-service",
        action="store_true",
        help="start no runtime service: gpuhook's GPU creates start Python",
    )
    p.add_argument(
        "--compare-python",
        action="store_true",
        help=f"also run the dispatcher with a config naming no service ({GPUHOOK_PYTHON})",
    )
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        help="another runc-compatible runtime: PATH or NAME=PATH",
    )
    p.add_argument(
        "--peer-env", action="append", default=[], help="KEY=VALUE in the peers' environment"
    )
    p.add_argument(
        "--peer-cdi-hook",
        metavar="PATH",
        help="NVIDIA's nvidia-cdi-hook: write, for each fake node, the CDI spec nvidia-ctk cdi "
        "generate would write (hooks included) and a config.toml for nvidia-container-runtime "
        "in CDI mode, and give the peers XDG_CONFIG_HOME pointing at it",
    )
    p.add_argument(
        "--nodes",
        metavar="DIR",
        help="build the fake nodes in DIR/a and DIR/b and keep them (same paths and UUIDs on "
        "every run, e.g. for a peer runtime's CDI spec)",
    )
    p.add_argument("--json", default=os.path.join(REPO, "build", "bench", "latest.json"))
    p.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown")
    p.add_argument("--seed", type=int, default=8)
    p.add_argument("--keep", action="store_true", help="keep the bundles and fake nodes")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    # the runs chdir into bundles: output paths are taken against the caller's folder now
    opts.json = os.path.abspath(opts.json) if opts.json else opts.json
    opts.markdown = os.path.abspath(opts.markdown) if opts.markdown else opts.markdown
    if os.geteuid() != 0:
        sys.stderr.write("bench: needs root (runc, mknod)\n")
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.stderr.write("bench: cannot become a child subreaper\n")
        return 2
    bench = Bench(opts)
    t0 = time.monotonic()
    try:
        bench.setup()
        bench.log(f"setup done in {time.monotonic() - t0:.0f}s; {opts.iterations} iterations")
        samples = bench.run_single(opts.iterations, opts.warmup)
        concurrent = bench.run_concurrent(opts.rounds)
        bench.check_service()  # still there at the end, before cleanup stops it
        report = build_report(bench, samples, concurrent, time.monotonic() - t0)
    except BenchError as exc:
        sys.stderr.write(f"bench: {exc}\n")
        return 1
    finally:
        bench.cleanup()
    print_report(report)
    if opts.json:
        os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
        with open(opts.json, "w") as fh:
            json.dump(report, fh, indent=2)
            fh.write("\n")
        sys.stdout.write(f"\nJSON: {opts.json}\n")
    if opts.markdown:
        with open(opts.markdown, "w") as fh:
            fh.write(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A node's long run in tests: a loop of container creates (GPU, the leak case, MIG) through the
compiled gpuhook-runtime dispatcher, each followed by the engine's ``delete`` (or by a crash: its
bundle removed without one), counting every create that failed.

The runtime behind the dispatcher is a stand-in that exits 0 (:func:`fake_runtime`): what is
measured is gpuhook's part of a create (the dispatcher, the runtime service or the Python shim,
the spec, the record and its link), thousands of times in a few minutes, which real runc
containers would not fit in CI's time. Each create gets a bundle of its own (config.json; the
rootfs is one shared folder, named by an absolute ``root.path``), removed after its delete, as
an engine removes it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from gpuhook.runtime import dispatch  # noqa: E402

FAKE_RUNTIME = "#!/bin/sh\nexit 0\n"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def fake_runtime(folder: Path) -> Path:
    """A runtime that accepts every call (create, delete, state) and exits 0."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ok-runtime"
    path.write_text(FAKE_RUNTIME)
    path.chmod(0o755)
    return path


def dispatcher(folder: Path) -> Path:
    """build/bin/gpuhook-runtime, its interpreter this Python with this checkout's src."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gpuhook-runtime"
    command = dispatch.python_command(sys.executable, str(REPO / "src"))
    path.write_bytes(dispatch.relocate((REPO / "build/bin/gpuhook-runtime").read_bytes(), command))
    path.chmod(0o755)
    return path


def service_processes(pid: int) -> list[int]:
    """The service's process and its workers (its children)."""
    found = [pid]
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except (OSError, ValueError):
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def signal_all(pid: int, sig: int) -> list[int]:
    """``sig`` to the service and every worker at once, as systemd signals a unit's cgroup
    (``systemctl restart``: SIGTERM; ``systemctl kill -s KILL``, an OOM kill: SIGKILL). The
    service is stopped first so it forks no worker between the listing and the signal."""
    os.kill(pid, signal.SIGSTOP)
    procs = service_processes(pid)
    for p in procs:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    return procs


@dataclass
class Case:
    """A container the loop creates: its spec's env and annotations, and what its create must
    give (NVIDIA_VISIBLE_DEVICES and the GPU device nodes), learned from the first create."""

    name: str
    env: list[str]
    annotations: dict[str, str] = field(default_factory=dict)


# what a create must have given: (its case, its id, when it started (monotonic), its spec) ->
# "" or the failure
Judge = Callable[[Case, str, float, dict[str, Any]], str]


@dataclass
class Result:
    """What the loop saw: creates and deletes done, failures (one line each), latencies (s)."""

    creates: int = 0
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, latency: float, failure: str) -> None:
        with self.lock:
            self.creates += 1
            self.latencies.append(latency)
            if failure:
                self.failures.append(failure)


def granted(spec: dict[str, Any]) -> tuple[str, list[str]]:
    """What a rewritten spec grants: NVIDIA_VISIBLE_DEVICES and the /dev/nvidia* nodes."""
    env = [e for e in spec["process"]["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    nodes = sorted(d["path"] for d in spec["linux"].get("devices", []) if "nvidia" in d["path"])
    return (env[-1] if env else ""), nodes


class Loop:
    """Creates through ``runtime`` (the dispatcher) with ``env`` (the node's config), in
    ``threads`` threads, until :meth:`stop`; every ``crash_every``-th container is not deleted
    through the dispatcher (its bundle is removed, as after a crash)."""

    def __init__(
        self,
        runtime: Path,
        env: Mapping[str, str],
        base: Path,
        spec: dict[str, Any],
        rootfs: str,
        cases: list[Case],
        crash_every: int = 0,
        judge: Judge | None = None,
    ) -> None:
        self.runtime = str(runtime)
        self.env = {"PATH": SYSTEM_PATH, **env}
        self.base = base
        self.spec = spec
        self.rootfs = rootfs
        self.cases = cases
        self.crash_every = crash_every
        self.judge = judge or self._same_as_first
        self.expected: dict[str, tuple[str, list[str]]] = {}
        self.result = Result()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._next = 0
        self._counter = threading.Lock()
        base.mkdir(parents=True, exist_ok=True)

    def bundle(self, case: Case, name: str) -> Path:
        path = self.base / name
        path.mkdir()
        spec = json.loads(json.dumps(self.spec))
        spec["process"]["args"] = ["/bin/true"]
        spec["process"]["env"] = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", *case.env]
        spec["root"] = {"path": self.rootfs, "readonly": True}
        if case.annotations:
            spec["annotations"] = dict(case.annotations)
        (path / "config.json").write_text(json.dumps(spec))
        return path

    def call(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.runtime, "--root", str(self.base / "runc-state"), *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def one(self, k: int) -> tuple[float, str]:
        """Create (and delete) container ``k``; (the create's latency, its failure or "")."""
        case = self.cases[k % len(self.cases)]
        cid = f"lr-{case.name}-{k}"
        bundle = self.bundle(case, cid)
        start = time.monotonic()
        out = self.call("create", "--bundle", str(bundle), cid)
        latency = time.monotonic() - start
        failure = ""
        if out.returncode != 0 or out.stderr:
            failure = f"{cid}: exit {out.returncode}: {out.stderr.strip()}"
        else:
            spec = json.loads((bundle / "config.json").read_text())
            failure = self.judge(case, cid, start, spec)
        if not (self.crash_every and k % self.crash_every == 0):
            deleted = self.call("delete", cid)
            if deleted.returncode != 0 and not failure:
                failure = f"{cid}: delete exit {deleted.returncode}: {deleted.stderr.strip()}"
        shutil.rmtree(bundle)
        return latency, failure

    def _same_as_first(self, case: Case, cid: str, _start: float, spec: dict[str, Any]) -> str:
        seen = granted(spec)
        want = self.expected.setdefault(case.name, seen)
        return f"{cid}: granted {seen}, not {want}" if seen != want else ""

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._counter:
                k = self._next
                self._next += 1
            self.result.add(*self.one(k))

    def learn(self) -> None:
        """One create of each case, before the load: what every later one must give."""
        for _ in self.cases:
            with self._counter:
                k = self._next
                self._next += 1
            _, failure = self.one(k)
            assert not failure, failure

    def start(self, threads: int = 3) -> None:
        self._threads = [threading.Thread(target=self._run) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def wait_creates(self, count: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.result.creates < count:
            assert time.monotonic() < deadline, f"{self.result.creates} creates in {timeout}s"
            time.sleep(0.05)

    def stop(self) -> Result:
        self._stop.set()
        for t in self._threads:
            t.join(180)
        return self.result

#!/usr/bin/python3
"""A GPU create on a node that ran 100,000 containers, against one on a new node (issue 36).

    bench/leftovers.py [-n 60] [--links 100000] [--json PATH]

A node's state folder holds one record link per container gpuhook-runtime created with a GPU
marker. A container deleted through gpuhook-runtime takes its link with it; one deleted without
(a crash, an engine calling runc itself, a node that ran an older gpuhook) leaves a dangling link
that the creates' bounded sweeps remove (gpuhook.records.sweep). This bench gives the state
folder ``--links`` dangling links and times ``-n`` creates right after, against ``-n`` creates on
an empty folder, interleaved: a 1-GPU create, and an MPS client's create (MPS admission reads
the records folder under the node-wide accounting lock). Same-run ratios are the result.

Each create goes through the installed path: the compiled dispatcher (build/bin/gpuhook-runtime)
and the runtime service, with a stand-in runtime that exits 0 (what is timed is gpuhook's part),
on a fake node (tools/fake-node) on tmpfs. Needs root and ``make build``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_NODE = os.path.join(REPO, "tools", "fake-node")
RUNTIME = os.path.join(REPO, "build", "bin", "gpuhook-runtime")
GPUHOOK = os.path.join(REPO, "build", "bin", "gpuhook")
BASE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CASES = (("gpu1", "1 GPU", "0"), ("mps", "MPS client (admission)", "1"))


class Node:
    """A fake node with two configs sharing its inventory: one per state folder (new, old)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        out = self.run([sys.executable, FAKE_NODE, f"{folder}/node", "--gpus", "2", "--force",
                        "--hook-path", GPUHOOK])  # fmt: skip
        self.env = {"PATH": BASE_PATH}
        for line in out.splitlines():
            if line.startswith("export "):
                key, _, value = line[len("export ") :].partition("=")
                self.env[key] = value.strip("'\"")
        with open(f"{folder}/node/node.json") as fh:
            self.truth: dict[str, Any] = json.load(fh)
        self.runtime = f"{folder}/ok-runtime"
        fd = os.open(self.runtime, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
        os.write(fd, b"#!/bin/sh\nexit 0\n")
        os.close(fd)
        self.run([GPUHOOK, "inventory", "refresh"], self.env)

    def run(self, argv: list[str], env: dict[str, str] | None = None) -> str:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {out.stderr.strip()}")
        return out.stdout

    def config(self, name: str) -> dict[str, str]:
        """A config of the node with its own state folder and runtime service, GPU 1 MPS-shared."""
        import yaml

        with open(f"{self.folder}/node/config.yaml") as fh:
            data = yaml.safe_load(fh)
        state = f"{self.folder}/{name}"
        data.update(
            state_dir=state,
            inventory={"path": f"{self.folder}/node/state/inventory.json"},
            runtime={"path": self.runtime, "service": f"{state}/runtime.sock"},
            log={"level": "info", "file": f"{state}/gpuhook.log"},
            mps={"root": f"{state}/mps", "gpus": [1]},
        )
        os.makedirs(f"{state}/containers")
        path = f"{self.folder}/{name}.yaml"
        with open(path, "w") as fh:
            yaml.safe_dump(data, fh)
        env = {**self.env, "GPUHOOK_CONFIG": path}
        self.run([GPUHOOK, "mps", "start"], env)
        return env


def spec(gpu: str, rootfs: str) -> bytes:
    return json.dumps({
        "ociVersion": "1.0.2",
        "process": {"args": ["/bin/true"], "cwd": "/", "user": {"uid": 0, "gid": 0},
                    "env": ["PATH=/bin", f"NVIDIA_VISIBLE_DEVICES={gpu}"]},
        "root": {"path": rootfs, "readonly": True},
        "linux": {"namespaces": [{"type": "mount"}]},
    }).encode()  # fmt: skip


def create(env: dict[str, str], bundle: str, cid: str, body: bytes) -> float:
    os.makedirs(bundle)
    with open(f"{bundle}/config.json", "wb") as fh:
        fh.write(body)
    start = time.perf_counter()
    out = subprocess.run([RUNTIME, "create", "--bundle", bundle, cid], env=env,
                         capture_output=True, text=True, check=False)  # fmt: skip
    took = time.perf_counter() - start
    with open(f"{bundle}/config.json", "rb") as fh:
        edited = b"/dev/nvidia" in fh.read()
    if out.returncode != 0 or not edited:
        raise SystemExit(f"create {cid} failed: {out.stderr.strip()}")
    subprocess.run([RUNTIME, "delete", cid], env=env, capture_output=True, check=False)
    shutil.rmtree(bundle)
    return took


def leave_links(state: str, count: int, prefix: str) -> None:
    folder = f"{state}/containers"
    for i in range(count):
        target = f"{state}/deleted/{prefix}-{i}/gpuhook-decision.json"
        os.symlink(target, f"{folder}/{prefix}-{i:06d}.json")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def measure(n: int, links: int, folder: str) -> dict[str, Any]:
    """Interleaved with creates on the new node: on the old one, ``links`` leftover links left
    while its service runs (``during``: the creates' bounded sweeps work them down; at most 10
    creates a case, MPS admission then reads them all), and left before its service starts (as
    after an upgrade: the service sweeps them in the background when it starts)."""
    node = Node(folder)
    rootfs = f"{folder}/rootfs"
    os.makedirs(f"{rootfs}/bin")
    envs = {name: node.config(name) for name in ("new", "old")}
    services = {name: serve(env) for name, env in envs.items()}
    times: dict[str, list[float]] = {}
    count = iter(range(1 << 30))

    def timed(row: str, name: str, gpu: str) -> None:
        i = next(count)
        bundle = f"{folder}/b-{name}-{i}"
        times.setdefault(row, []).append(create(envs[name], bundle, f"c-{i}", spec(gpu, rootfs)))

    old = f"{folder}/old/containers"
    try:
        leave_links(f"{folder}/old", links, "running")
        for _ in range(min(n, 10)):
            for key, _, gpu in CASES:
                timed(f"{key}/new", "new", gpu)
                timed(f"{key}/during", "old", gpu)
        drained = 0
        while len(os.listdir(old)) > 100:
            timed("drain", "old", "0")
            drained += 1
        services["old"].terminate()
        services["old"].wait()
        leave_links(f"{folder}/old", links, "upgraded")
        services["old"] = serve(envs["old"])
        for _ in range(n):
            for key, _, gpu in CASES:
                timed(f"{key}/new_after", "new", gpu)
                timed(f"{key}/after", "old", gpu)
        left = len(os.listdir(old))
    finally:
        for proc in services.values():
            proc.terminate()
            proc.wait()
        for env in envs.values():
            subprocess.run([GPUHOOK, "mps", "stop"], env=env, capture_output=True, check=False)
    rows = []
    for key, label, _ in CASES:
        new, during = (median(times[f"{key}/{r}"]) * 1000 for r in ("new", "during"))
        new_after, after = (median(times[f"{key}/{r}"]) * 1000 for r in ("new_after", "after"))
        rows.append({"case": key, "label": label, "new_node_ms": round(new, 2),
                     "leftovers_ms": round(during, 2), "ratio_leftovers": round(during / new, 2),
                     "new_node_after_ms": round(new_after, 2), "upgraded_ms": round(after, 2),
                     "ratio_upgraded": round(after / new_after, 2)})  # fmt: skip
    return {
        "creates_per_row": n,
        "leftover_links": links,
        "creates_to_drain": drained + 10 * len(CASES),
        "entries_left_after_upgrade_rows": left,
        "rows": rows,
    }


def serve(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``gpuhook runtime serve`` on the config's socket, once it listens."""
    proc = subprocess.Popen([GPUHOOK, "runtime", "serve"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline()
    return proc


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=60, help="creates per case and state folder")
    parser.add_argument("--links", type=int, default=100_000, help="leftover links")
    parser.add_argument("--json", default=os.path.join(REPO, "build", "bench", "leftovers.json"))
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="gpuhook-bench-leftovers-",
                              dir="/dev/shm" if os.path.isdir("/dev/shm") else None)  # fmt: skip
    try:
        report = measure(args.n, args.links, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{args.n} creates per row, interleaved (median ms); a new node's state folder against "
          f"one with {args.links:,} leftover links left while the service runs (10 creates "
          f"a row; {report['creates_to_drain']} creates swept them), and left before the service "
          f"started, as after an upgrade ({report['entries_left_after_upgrade_rows']} entries "
          "left after)")  # fmt: skip
    print(f"{'case':<26}{'new node':>10}{'running':>10}{'ratio':>7}{'new node':>10}"
          f"{'upgraded':>10}{'ratio':>7}")  # fmt: skip
    for row in report["rows"]:
        print(
            f"{row['label']:<26}{row['new_node_ms']:>10.2f}{row['leftovers_ms']:>10.2f}"
            f"{row['ratio_leftovers']:>7.2f}{row['new_node_after_ms']:>10.2f}"
            f"{row['upgraded_ms']:>10.2f}{row['ratio_upgraded']:>7.2f}"
        )
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(report, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

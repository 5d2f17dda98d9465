"""Faults (SECURITY.md, class D): gpuhook never corrupts a spec and never blocks a container that
did not ask for a GPU. A failure between writing the temp spec and renaming it, ``kill -9`` of the
shim at random points, a full or read-only bundle filesystem, a missing or unreadable inventory,
state dir, log dir or checkpoint, and many concurrent creates during inventory refreshes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import testbed

from gpuhook.errors import SpecError
from gpuhook.fsutil import TMP_MARK
from gpuhook.runtime import ocispec
from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.hostile import one_line_failure
from tests.integration.test_leak_matrix import gpus, uuid, write_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.root]

# One fake runtime for both phases, so both use the same config (the spec gpuhook writes names
# the config file in the hook's env): it sleeps (after leaving its pid in {started}) while the
# file {started}/SLEEP exists, else it exits 0 at once.
SLEEPER = """#!/bin/sh
if [ -e "{started}/SLEEP" ]; then
  : > "{started}/$$"
  exec sleep 60
fi
exit 0
"""


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TMP_MARK in p.name or p.name.endswith(".tmp"))


def shim(bundle: Path, env: dict[str, str], cid: str = "c1") -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [testbed.RUNTIME, "--root", "/nonexistent", "create", "--bundle", str(bundle), cid],
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


# --- a failure between the temp file and the rename --------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [KeyboardInterrupt(), SystemExit(9), OSError(28, "No space left on device"), MemoryError()],
    ids=["interrupt", "exit", "enospc", "memory"],
)
def test_failure_before_rename_keeps_the_old_spec(tmp_path: Path, fault: BaseException) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    old = json.dumps(f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"])).encode()
    (bundle / "config.json").write_bytes(old)
    (bundle / "config.json").chmod(0o640)
    seen: list[list[str]] = []

    def crash() -> None:
        seen.append(sorted(p.name for p in bundle.iterdir()))  # the temp is complete here
        raise fault

    with pytest.raises((type(fault), SpecError)):  # an OSError leaves as one SpecError line
        ocispec.write(str(bundle), {"new": True}, before_replace=crash)
    assert len(seen[0]) == 2 and TMP_MARK in seen[0][0]
    assert (bundle / "config.json").read_bytes() == old
    assert temps(bundle) == []
    assert (bundle / "config.json").stat().st_mode & 0o777 == 0o640


def test_writer_killed_before_rename_leaves_a_temp_the_next_write_removes(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"old": true}')
    code = (
        "import os, signal, sys; from gpuhook.runtime import ocispec\n"
        "ocispec.write(sys.argv[1], {'new': True},\n"
        "              before_replace=lambda: os.kill(os.getpid(), signal.SIGKILL))\n"
    )
    out = subprocess.run(["python3", "-c", code, str(bundle)], check=False, env=_py_env())
    assert out.returncode == -signal.SIGKILL
    assert len(temps(bundle)) == 1  # what a kill -9 leaves: a complete temp, never renamed
    assert (bundle / "config.json").read_text() == '{"old": true}'
    ocispec.write(str(bundle), {"newer": True})
    assert temps(bundle) == []
    assert json.loads((bundle / "config.json").read_text()) == {"newer": True}


def _py_env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src}


# --- kill -9 of the shim at random points -----------------------------------------------------


def test_kill_9_at_random_points_never_leaves_a_partial_spec(
    node: FakeNode, tmp_path: Path, spec_template: dict[str, Any]
) -> None:
    """100 GPU creates through the real shim, each killed with SIGKILL after a random delay
    (somewhere in: interpreter start, parse, decision, temp write, rename, record, exec of the
    runtime, which is a sleeping fake). config.json is always exactly the old or the new spec,
    and after the next create of the same bundle no temp file is left. Where the kills land
    depends on the machine's load: the test asserts what every kill leaves, never how many landed
    where."""
    started = tmp_path / "started"
    started.mkdir()
    env = node.variant(
        tmp_path, runtime={"path": script(tmp_path / "runtime", SLEEPER.format(started=started))}
    )
    sleep_flag = started / "SLEEP"
    spec = json.loads(json.dumps(spec_template))
    spec["process"]["env"] = ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=1"]
    old = json.dumps(spec, indent=2).encode()

    def fresh_bundle(name: str) -> Path:
        bundle = tmp_path / name
        (bundle / "rootfs").mkdir(parents=True)
        (bundle / "config.json").write_bytes(old)
        return bundle

    # compile the config's cache once, as a node's first create does
    assert node.gpuhook("inspect", "node", "-o", "json", env=env).returncode == 0
    reference = fresh_bundle("reference")
    durations = []
    for _ in range(3):
        (reference / "config.json").write_bytes(old)
        t0 = time.monotonic()
        assert shim(reference, env).wait(60) == 0
        durations.append(time.monotonic() - t0)
    new = (reference / "config.json").read_bytes()
    assert f"NVIDIA_VISIBLE_DEVICES={uuid(node, 1)}" in json.loads(new)["process"]["env"]
    span = max(durations) * 1.3

    rnd = random.Random(int(os.environ.get("GPUHOOK_KILL_SEED", "0")) or None)
    for i in range(100):
        bundle = fresh_bundle(f"b{i}")
        sleep_flag.touch()
        proc = shim(bundle, env, cid=f"c{i}")
        time.sleep(rnd.uniform(0, span))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        now = (bundle / "config.json").read_bytes()
        assert now in (old, new), f"run {i}: config.json is neither the old nor the new spec"
        if (started / str(proc.pid)).exists():  # killed after the exec: the runtime got the new
            assert now == new, f"run {i}: the runtime ran on the old spec"
        sleep_flag.unlink()
        assert shim(bundle, env, cid=f"c{i}").wait(60) == 0  # the next create
        assert (bundle / "config.json").read_bytes() == new
        assert temps(bundle) == [], f"run {i}: {temps(bundle)}"
        assert temps(node.root / "state" / "containers") == []


# --- the bundle's filesystem full or read-only ---------------------------------------------------


@contextmanager
def small_fs(where: Path, mode: str) -> Iterator[Path]:
    """A tmpfs of 256 KiB at ``where``: ``full`` after the caller's files are written (filled up
    by ``fill()``), or remounted read-only (``readonly``)."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_or_freeze(fs: Path, mode: str) -> None:
    if mode == "readonly":
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        return
    try:
        with open(fs / "filler", "wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
    except OSError:
        pass


@pytest.mark.parametrize("mode", ["full", "readonly"])
def test_full_or_read_only_bundle_filesystem(
    node: FakeNode, containers: Containers, tmp_path: Path, mode: str
) -> None:
    """ENOSPC (a tiny tmpfs, filled) or EROFS on the bundle's filesystem: a GPU container fails
    in one line with config.json intact and no temp left; a plain container starts."""
    with small_fs(tmp_path / "fs", mode) as fs:
        bundles = {}
        for name, env in (("gpu", ["NVIDIA_VISIBLE_DEVICES=1"]), ("plain", [])):
            source = containers.bundle(args=("/bin/true",), env=env)
            spec = json.loads((source / "config.json").read_text())
            spec["root"]["path"] = str(source / "rootfs")  # the rootfs stays on the big disk
            bundle = fs / name
            bundle.mkdir()
            (bundle / "config.json").write_text(json.dumps(spec))
            bundles[name] = bundle
        old = (bundles["gpu"] / "config.json").read_bytes()
        fill_or_freeze(fs, mode)
        gpu = containers.run(bundles["gpu"], node.env)
        plain = containers.run(bundles["plain"], node.env)
        assert gpu.returncode == 1
        why = "No space left on device" if mode == "full" else "Read-only file system"
        path = bundles["gpu"] / "config.json"
        assert one_line_failure(gpu.stderr) == f"gpuhook: cannot write {path}: {why}"
        assert path.read_bytes() == old
        assert temps(bundles["gpu"]) == []
        assert plain.returncode == 0, plain.stderr


# --- gpuhook's own files missing or unreadable ---------------------------------------------------


def _fault_env(node: FakeNode, tmp_path: Path, fault: str) -> dict[str, str]:
    """The node's config, with one of gpuhook's own files or folders broken."""
    broken = tmp_path / "broken"
    broken.mkdir()
    a_file = broken / "a-file"
    a_file.write_text("not a folder\n")
    inventory = str(node.root / "state" / "inventory.json")
    checkpoint = str(write_checkpoint(broken / "cp", [("pod-uid-1", "main", [uuid(node, 2)])]))
    keys: dict[str, Any] = {
        "inventory": {"path": inventory},
        "policy": {"kubernetes": {"checkpoint": checkpoint}},
    }
    if fault == "inventory-missing":
        keys["inventory"] = {"path": str(broken / "none.json"), "auto_refresh": False}
    elif fault == "inventory-missing-refresh-fails":  # auto refresh, but its folder is a file
        keys["inventory"] = {"path": str(a_file / "inventory.json")}
    elif fault == "inventory-is-a-folder":
        keys["inventory"] = {"path": str(broken)}
    elif fault == "inventory-corrupt":
        (broken / "inv.json").write_text('{"schema_version": 1, "gpus": [')
        keys["inventory"] = {"path": str(broken / "inv.json"), "auto_refresh": False}
    elif fault == "state-dir-is-a-file":
        keys["state_dir"] = str(a_file)
    elif fault == "log-dir-is-a-file":
        keys["log"] = {"file": str(a_file / "gpuhook.log")}
    elif fault == "log-file-is-a-folder":
        keys["log"] = {"file": str(broken)}
    elif fault == "checkpoint-missing":
        keys["policy"] = {"kubernetes": {"checkpoint": str(broken / "none")}}
    elif fault == "checkpoint-is-a-folder":
        keys["policy"] = {"kubernetes": {"checkpoint": str(broken)}}
    elif fault == "checkpoint-corrupt":
        Path(checkpoint).write_text('{"Data": {"PodDeviceEntries": [{"PodUID": ')
    return node.variant(tmp_path, **keys)


# fault -> what a GPU container (env request of GPU 1, and a Kubernetes pod allocated GPU 2)
# gets: a device list, or the start of the one line it fails with.
FAULTS: dict[str, tuple[Any, Any]] = {
    "inventory-missing": ("gpuhook: no inventory at", "gpuhook: no inventory at"),
    "inventory-missing-refresh-fails": (
        "gpuhook: cannot write inventory",
        "gpuhook: cannot write inventory",
    ),
    "inventory-is-a-folder": ("gpuhook: cannot write inventory", "gpuhook: cannot write inventory"),
    "inventory-corrupt": ("gpuhook: inventory ", "gpuhook: inventory "),
    "state-dir-is-a-file": (gpus(1), gpus(2)),
    "log-dir-is-a-file": (gpus(1), gpus(2)),
    "log-file-is-a-folder": (gpus(1), gpus(2)),
    "checkpoint-missing": (gpus(1), []),  # refused: the allocation cannot be verified
    "checkpoint-is-a-folder": (gpus(1), []),
    "checkpoint-corrupt": (gpus(1), []),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_own_files_broken(
    node: FakeNode, containers: Containers, tmp_path: Path, fault: str
) -> None:
    env = _fault_env(node, tmp_path, fault)
    plain = containers.probe(env)
    assert plain["returncode"] == 0, plain["stderr"]  # never blocked by gpuhook's own faults
    assert plain["dev"] == []
    shapes: tuple[dict[str, Any], ...] = (
        {"env": ["NVIDIA_VISIBLE_DEVICES=1"]},
        {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "annotations": f.k8s()},
    )
    for want, kw in zip(FAULTS[fault], shapes, strict=True):
        seen = containers.probe(env, **kw)
        if isinstance(want, str):
            assert seen["returncode"] == 1
            assert one_line_failure(seen["stderr"]).startswith(want)
        else:
            assert seen["returncode"] == 0, seen["stderr"]
            assert seen["dev"] == want


# --- 64 concurrent creates while the inventory is refreshed in a loop -----------------------------


def test_64_concurrent_creates_during_inventory_refreshes(
    fake_node_factory: Any, containers: Containers, tmp_path: Path
) -> None:
    node: FakeNode = fake_node_factory("--gpus", "8")
    node.refresh()
    # kinds 2 (env) and 3 (CDI) are allocated their GPU: both are verified under `verify`
    pods = [(f"pod-{i}", "main", [uuid(node, i % 8)]) for i in range(64) if i % 4 in (2, 3)]
    checkpoint = write_checkpoint(tmp_path / "kubelet_internal_checkpoint", pods)
    env = node.variant(tmp_path, policy={"kubernetes": {"checkpoint": str(checkpoint)}})
    probe = "ls -1 /dev | grep '^nvidia' | sort"
    jobs: list[tuple[Path, list[str]]] = []
    for i in range(64):
        gpu = i % 8
        kind = i % 4
        if kind == 0:  # no GPU, even with the image's "all" under Kubernetes
            bundle = containers.bundle(
                args=("/bin/sh", "-c", probe),
                env=["NVIDIA_VISIBLE_DEVICES=all"],
                annotations=f.k8s(uid=f"pod-{i}"),
            )
            want: list[str] = []
        elif kind == 1:
            bundle = containers.bundle(
                args=("/bin/sh", "-c", probe), env=[f"NVIDIA_VISIBLE_DEVICES={gpu}"]
            )
            want = gpus(gpu)
        elif kind == 2:  # Kubernetes, verified against the checkpoint
            bundle = containers.bundle(
                args=("/bin/sh", "-c", probe),
                env=["NVIDIA_VISIBLE_DEVICES=all"],
                annotations=f.k8s(uid=f"pod-{i}"),
            )
            want = gpus(gpu)
        else:
            bundle = containers.bundle(
                args=("/bin/sh", "-c", probe),
                annotations={**f.k8s(uid=f"pod-{i}"), "cdi.k8s.io/p": f"nvidia.com/gpu={gpu}"},
            )
            want = gpus(gpu)
        jobs.append((bundle, want))

    stop = threading.Event()
    refreshes: list[int] = []

    def refresh_loop() -> None:
        while not stop.is_set():
            refreshes.append(node.gpuhook("inventory", "refresh", env=env).returncode)

    refresher = threading.Thread(target=refresh_loop)
    refresher.start()
    try:
        with ThreadPoolExecutor(max_workers=64) as pool:
            results = list(
                pool.map(
                    lambda job: containers.run(
                        job[0], env, container_id=f"cc-{uuidlib.uuid4().hex[:10]}"
                    ),
                    jobs,
                )
            )
    finally:
        stop.set()
        refresher.join()
    assert refreshes and set(refreshes) == {0}, refreshes
    for (bundle, want), out in zip(jobs, results, strict=True):
        assert out.returncode == 0, (bundle, out.stderr)
        assert sorted(line for line in out.stdout.split() if line) == [
            d.removeprefix("/dev/") for d in want
        ], (bundle, out.stdout)

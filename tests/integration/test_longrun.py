"""A node's long run (issue 36, items 6 and 7), on the fake node:

* the state folder stays bounded with no operator action: a container deleted through
  gpuhook-runtime takes its record link and exec-env marker with it (the compiled dispatcher and
  the Python shim), and 100,000 links left by containers deleted without one (crashes, an older
  gpuhook) are swept by the creates that follow, which all succeed;
* a create the runtime service accepted does not fail when the service dies (``kill -9`` of it
  and its workers) or restarts (SIGTERM to all, a new service on the socket) mid-load: the
  dispatcher decides it again in Python from the spec as the engine wrote it;
* a soak of the runtime service (slow): thousands of GPU, leak-case and MIG creates and their
  deletes, with a share of crashes; no failed create, its RSS, open fds and process count flat,
  latency not creeping, the state folder bounded; then ``kill -9`` mid-load: creates go on.

The loop (tests/longrun.py) runs gpuhook's part of each create through the compiled dispatcher,
with a stand-in runtime that exits 0 (real runc containers would not fit thousands in CI's time);
the delete tests run real runc.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuhook.config import loading as config_loading
from gpuhook.records import execenv, sweep, writer
from gpuhook.runtime.pool import POOL
from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.integration.test_leak_matrix import uuid, write_checkpoint
from tests.longrun import (
    SYSTEM_PATH,
    Case,
    Loop,
    dispatcher,
    fake_runtime,
    service_processes,
    signal_all,
)
from tests.runtime_service import RuntimeService

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
Start = Callable[..., RuntimeService]


def cases(node: FakeNode) -> list[Case]:
    """1 GPU, the leak case (image env all, a Kubernetes container the checkpoint allocates
    nothing), one MIG device."""
    return [
        Case("gpu", ["NVIDIA_VISIBLE_DEVICES=1"]),
        Case("leak", ["NVIDIA_VISIBLE_DEVICES=all"], f.k8s()),
        Case("mig", ["NVIDIA_VISIBLE_DEVICES=6:1"]),
    ]


def check_expected(node: FakeNode, loop: Loop) -> None:
    """The first create of each case gave what the node grants it."""
    mig = node.truth["gpus"][6]["mig_devices"][1]["uuid"]
    assert loop.expected["gpu"][0] == f"NVIDIA_VISIBLE_DEVICES={uuid(node, 1)}"
    assert "/dev/nvidia1" in loop.expected["gpu"][1]
    assert loop.expected["leak"] == ("NVIDIA_VISIBLE_DEVICES=void", [])
    assert loop.expected["mig"][0] == f"NVIDIA_VISIBLE_DEVICES={mig}"


def node_env(
    node: FakeNode, folder: Path, socket: Path | None, state_dir: Path, **sections: Any
) -> dict[str, str]:
    """A config of ``node`` with the stand-in runtime, a private state folder, the leak case's
    checkpoint and (``socket``) the runtime service; its cache and pointer written, as any
    gpuhook call writes them (the dispatcher reads the pointer)."""
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = write_checkpoint(
        folder / "kubelet_internal_checkpoint", [("other-pod", "main", [uuid(node, 0)])]
    )
    runtime: dict[str, Any] = {"path": str(fake_runtime(folder))}
    if socket is not None:
        runtime["service"] = str(socket)
    env = node.variant(
        folder,
        runtime=runtime,
        state_dir=str(state_dir),
        inventory={"path": str(node.root / "state" / "inventory.json")},
        policy={"kubernetes": {"checkpoint": str(checkpoint)}},
        log={"level": "info", "file": str(folder / "gpuhook.log")},
        **sections,
    )
    config_loading.load(env["GPUHOOK_CONFIG"])
    return env


def record_entries(state_dir: Path) -> list[str]:
    folder = state_dir / "containers"
    return sorted(os.listdir(folder)) if folder.exists() else []


@pytest.fixture
def rootfs(rootfs_template: str) -> str:
    return rootfs_template


@pytest.fixture
def memory_dir() -> Iterator[Path]:
    """A folder on tmpfs for a state folder of 100,000 links (a node's /run; on a shared,
    busy disk their journal writes cost minutes that say nothing about gpuhook)."""
    parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
    folder = Path(tempfile.mkdtemp(prefix="gpuhook-test-longrun-", dir=parent))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# --- item 6: delete takes the record link with it -----------------------------------------------


def python_shim(folder: Path) -> Path:
    """gpuhook-runtime as the Python shim alone (no dispatcher), as pip installs it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gpuhook-runtime-py"
    entry = REPO / "src" / "gpuhook" / "_shim_entry.py"
    path.write_text(f"#!/bin/sh\nexec '{sys.executable}' -I -S '{entry}' \"$@\"\n")
    path.chmod(0o755)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("how", ["dispatcher", "python"])
def test_a_deleted_container_leaves_nothing_in_the_state_folder(
    node: FakeNode, containers: Containers, tmp_path: Path, how: str
) -> None:
    """Real runc: 12 GPU containers created, started and deleted through gpuhook-runtime, as an
    engine drives them; the state folder has no record link and no exec-env marker left (it had
    one more link per container before)."""
    state = tmp_path / "state"
    env = node.variant(
        tmp_path / "cfg",
        state_dir=str(state),
        inventory={"path": str(node.root / "state" / "inventory.json")},
    )
    config_loading.load(env["GPUHOOK_CONFIG"])
    path = dispatcher(tmp_path / "d") if how == "dispatcher" else python_shim(tmp_path / "p")
    runtime = str(path)
    for i in range(12):
        bundle = containers.bundle(args=("/bin/true",), env=[f"NVIDIA_VISIBLE_DEVICES={i % 4}"])
        cid, code, err = containers.create(bundle, env, runtime=runtime)
        assert (code, err) == (0, "")
        link = state / "containers" / f"{cid}.json"
        assert os.readlink(link) == str(bundle / writer.RECORD_NAME)
        assert os.path.exists(execenv.marker_path(str(state), cid))
        assert containers.runc("start", cid).returncode == 0
        for _ in range(100):
            if containers.status(cid) == "stopped":
                break
            time.sleep(0.05)
        deleted = subprocess.run(
            [runtime, "--root", str(containers.state), "delete", cid],
            env={"PATH": SYSTEM_PATH, **env},
            capture_output=True,
            text=True,
            check=False,
        )
        assert (deleted.returncode, deleted.stderr) == (0, "")
        assert not os.path.lexists(link)
        assert not os.path.exists(execenv.marker_path(str(state), cid))
    assert record_entries(state) == []
    assert os.listdir(state / execenv.DIR) == []


# --- item 6: 100,000 leftover links -------------------------------------------------------------


@pytest.mark.slow
def test_100000_leftover_links_are_swept_by_the_creates_that_follow(
    node: FakeNode, tmp_path: Path, memory_dir: Path, runtime_service: Start, rootfs: str,
    spec_template: dict[str, Any],
) -> None:  # fmt: skip
    """A state folder with 100,000 links of containers deleted without a delete through
    gpuhook-runtime: GPU creates through the service all succeed, and the sweeps they run (one
    per BACKLOG_S while a backlog remains) leave the links of the containers that exist."""
    state = memory_dir / "state"
    folder = state / "containers"
    folder.mkdir(parents=True)
    for i in range(100_000):
        os.symlink(f"{memory_dir}/deleted/{i}/{writer.RECORD_NAME}", f"{folder}/old-{i:06d}.json")
    sock = Path(tempfile.mkdtemp(prefix="gh-lr-", dir="/tmp")) / "runtime.sock"
    env = node_env(node, tmp_path / "cfg", sock, state)
    runtime_service(env, socket=sock)
    loop = Loop(dispatcher(tmp_path / "d"), env, memory_dir / "bundles", spec_template, rootfs,
                cases(node))  # fmt: skip
    loop.learn()
    check_expected(node, loop)
    loop.start(threads=2)
    deadline = time.monotonic() + 240
    while len(record_entries(state)) > 50 and time.monotonic() < deadline:
        time.sleep(1)
    result = loop.stop()
    shutil.rmtree(sock.parent, ignore_errors=True)
    assert result.failures == []
    assert result.creates > 0
    left = record_entries(state)
    assert len(left) <= 50, f"{len(left)} entries left after {result.creates} creates"
    assert not any(n.startswith("old-") for n in left)


# --- item 7: creates survive the service's death and restart -----------------------------------


# how the service ends: every process of it at once (SIGKILL: ``kill -9``, an OOM kill; SIGTERM:
# a unit with KillMode=control-group, a DaemonSet pod's termination), or its main process alone
# (``systemctl restart`` of gpuhook-runtime.service, KillMode=process: busy workers finish, the
# calls queued on the listening socket are reset when it closes)
ENDINGS = {
    "kill -9": (signal.SIGKILL, True),
    "SIGTERM to all": (signal.SIGTERM, True),
    "systemctl restart": (signal.SIGTERM, False),
}


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(ENDINGS))
def test_creates_go_on_when_the_service_dies_or_restarts_mid_load(
    node: FakeNode, tmp_path: Path, runtime_service: Start, socket_folder: Path, rootfs: str,
    spec_template: dict[str, Any], how: str,
) -> None:  # fmt: skip
    """A loop of GPU, leak-case and MIG creates through the dispatcher and the service; three
    times, the service ends (see ENDINGS; after ``kill -9`` creates go on in Python for a while)
    and a new service takes the socket: no create fails, each gets what it got before."""
    sock = socket_folder / "svc" / "runtime.sock"
    env = node_env(node, tmp_path / "cfg", sock, tmp_path / "state")
    svc = runtime_service(env, socket=sock)
    loop = Loop(dispatcher(tmp_path / "d"), env, tmp_path / "bundles", spec_template, rootfs,
                cases(node))  # fmt: skip
    loop.learn()
    check_expected(node, loop)
    loop.start(threads=3)
    sig, everyone = ENDINGS[how]
    for round_ in range(3):
        loop.wait_creates(30 * (round_ + 1))
        if everyone:
            signal_all(svc.process.pid, sig)
        else:
            svc.process.send_signal(sig)
        svc.process.wait(30)
        if how == "kill -9":
            loop.wait_creates(loop.result.creates + 10)  # no service: Python decides
        svc = runtime_service(env, socket=sock)
    loop.wait_creates(loop.result.creates + 20)
    result = loop.stop()
    assert result.failures == []
    assert result.creates >= 110


# --- the soak -----------------------------------------------------------------------------------


def sample(pid: int) -> tuple[int, int, int]:
    """The service's RSS (KiB), its open descriptors, its process count (itself and workers)."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return rss, len(os.listdir(f"/proc/{pid}/fd")), len(service_processes(pid))


SOAK_CREATES = 4800  # GPU, leak-case and MIG creates (and their deletes) through the service
SOAK_CRASH_EVERY = 10  # one container in ten is deleted without gpuhook-runtime (a crash)


@pytest.mark.slow
def test_soak_of_the_runtime_service(
    node: FakeNode, tmp_path: Path, runtime_service: Start, socket_folder: Path, rootfs: str,
    spec_template: dict[str, Any],
) -> None:  # fmt: skip
    """Thousands of creates through one service: none fails; after warm-up its RSS, open fds
    and idle process count do not grow; the median latency of the last tenth is within twice
    that of the first; the state folder holds the live and the crashed-since-the-last-sweep
    containers only; then kill -9 of the service mid-load: creates go on."""
    state = tmp_path / "state"
    sock = socket_folder / "svc" / "runtime.sock"
    env = node_env(node, tmp_path / "cfg", sock, state)
    svc = runtime_service(env, socket=sock)
    loop = Loop(dispatcher(tmp_path / "d"), env, tmp_path / "bundles", spec_template, rootfs,
                cases(node), crash_every=SOAK_CRASH_EVERY)  # fmt: skip
    loop.learn()
    check_expected(node, loop)
    loop.start(threads=3)
    samples, sizes = [], []
    step = SOAK_CREATES // 12
    stamp = state / sweep.STAMP
    for n in range(step, SOAK_CREATES + 1, step):
        loop.wait_creates(n, timeout=600)
        samples.append(sample(svc.process.pid))
        sizes.append(len(record_entries(state)))
        # a sweep interval passes every `step` creates (the soak is shorter than INTERVAL_S):
        # the folder holds the crashes of one interval, and the containers being created
        os.utime(stamp, (time.time() - sweep.INTERVAL_S,) * 2)
    os.utime(stamp, (time.time() - sweep.INTERVAL_S,) * 2)  # as if the interval had passed
    deadline = time.monotonic() + 30  # the next create sweeps (while the others go on)
    while len(record_entries(state)) >= 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    after_sweep = len(record_entries(state))
    old = time.time() - sweep.GRACE_S - 1
    for marker in (state / execenv.DIR).iterdir():  # as if the markers were a minute old
        with contextlib.suppress(FileNotFoundError):  # a delete or a sweep took it meanwhile
            os.utime(marker, (old, old))
    os.utime(stamp, (time.time() - sweep.INTERVAL_S,) * 2)
    while len(os.listdir(state / execenv.DIR)) >= 20 and time.monotonic() < deadline + 30:
        time.sleep(0.1)
    markers_after = len(os.listdir(state / execenv.DIR))
    signal_all(svc.process.pid, signal.SIGKILL)
    svc.process.wait(30)
    loop.wait_creates(loop.result.creates + 30)
    result = loop.stop()
    assert result.failures == []
    warm = samples[2:]  # the first creates fault in what workers write (prefault learns it)
    rss = [s[0] for s in warm]
    assert max(rss) - min(rss) < 4096, f"service RSS (KiB) over the run: {rss}"
    assert len({s[1] for s in warm}) == 1, f"service fds over the run: {[s[1] for s in warm]}"
    assert max(s[2] for s in warm) <= 1 + POOL + 3, f"processes: {[s[2] for s in warm]}"
    latencies = result.latencies[: SOAK_CREATES]
    tenth = len(latencies) // 10
    first, last = statistics.median(latencies[:tenth]), statistics.median(latencies[-tenth:])
    print(  # what the soak saw, for its reader (pytest -s)
        f"soak: {result.creates} creates, 0 failed; service RSS {rss[0]}..{rss[-1]} KiB, fds "
        f"{warm[0][1]}, processes <= {max(s[2] for s in warm)}; median create "
        f"{first * 1000:.1f} ms first tenth, {last * 1000:.1f} ms last; state folder entries "
        f"{sizes}, {after_sweep} after a due sweep"
    )
    assert last < 2 * first, f"median create {first * 1000:.1f} ms, then {last * 1000:.1f} ms"
    bound = 2 * step // SOAK_CRASH_EVERY + 20  # the crashes of two intervals, and the creates
    assert max(sizes) < bound, f"state folder entries over the run: {sizes}"
    assert markers_after < 20, f"{markers_after} exec-env markers after a due sweep"
    assert after_sweep < 20, (
        f"{after_sweep} entries after a due sweep: {record_entries(state)[:5]}, stamp "
        f"{time.time() - stamp.stat().st_mtime:.1f}s old, "
        f"{[n for n in record_entries(state) if os.path.exists(state / 'containers' / n)][:5]}"
    )


# --- item 7: a driver upgrade under load -------------------------------------------------------


def driver_versions(spec: dict[str, Any]) -> set[str]:
    """The driver versions of the libcuda files a spec bind-mounts: one by one, or in a driver
    library folder prepared at inventory refresh (one bind of the whole folder)."""
    found = set()
    for mount in spec.get("mounts", []):
        source = str(mount.get("source", ""))
        names = os.listdir(source) if os.path.isdir(source) else [os.path.basename(source)]
        for name in names:
            if name.startswith("libcuda.so.") and name.count(".") >= 4:
                found.add(name.removeprefix("libcuda.so."))
    return found


@pytest.mark.slow
def test_a_driver_upgrade_under_load_gives_new_creates_the_new_files(
    fake_node_factory: Any, tmp_path: Path, runtime_service: Start, socket_folder: Path,
    rootfs: str, spec_template: dict[str, Any],
) -> None:  # fmt: skip
    """GPU creates through the service while the driver goes from 550.54.15 to 560.35.03 (the
    node's driver folder replaced in one rename, as a package manager's last step leaves it, then
    ``gpuhook inventory refresh``, as gpuhook-inventory.path runs it): no create fails, every
    create mounts files of one driver, those of every create that started after the upgrade
    exist (before the refresh, the create path finds the inventory stale and refreshes it), and
    every create that started after the refresh mounts the new driver's. (A create deciding at
    the instant of the rename may name the old files: the window of any runtime.)"""
    old = fake_node_factory("--gpus", "2", "--driver-version", "550.54.15")
    new = fake_node_factory("--gpus", "2", "--driver-version", "560.35.03")
    current = tmp_path / "current"
    current.symlink_to(old.root)
    libdir = f"{current}/driver/usr/lib/{old.truth['libdir'].rsplit('/', 1)[-1]}"
    sock = socket_folder / "svc" / "runtime.sock"
    folder = tmp_path / "cfg"
    folder.mkdir()
    env = old.variant(
        folder,
        driver_root=f"{current}/driver",
        state_dir=str(tmp_path / "state"),
        runtime={"path": str(fake_runtime(folder)), "service": str(sock)},
    )
    env["LD_LIBRARY_PATH"] = libdir
    config_loading.load(env["GPUHOOK_CONFIG"])
    assert old.gpuhook("inventory", "refresh", env=env).returncode == 0
    swapped: list[float] = []
    refreshed: list[float] = []
    seen: list[tuple[float, str]] = []

    def judge(case: Case, cid: str, start: float, spec: dict[str, Any]) -> str:
        versions = driver_versions(spec)
        missing = [
            m["source"] for m in spec.get("mounts", [])
            if m.get("type") == "bind" and not os.path.exists(m["source"])
        ]  # fmt: skip
        seen.append((start, ",".join(sorted(versions))))
        if len(versions) != 1:
            return f"{cid}: driver files of {sorted(versions)}"
        if swapped and start > swapped[0] and missing:  # one started before may name the old
            return f"{cid}: started after the upgrade, mounts missing {missing[:3]}"
        if refreshed and start > refreshed[0] and versions != {"560.35.03"}:
            return f"{cid}: started after the refresh, got driver {versions}"
        return ""

    runtime_service(env, socket=sock)
    loop = Loop(dispatcher(tmp_path / "d"), env, tmp_path / "bundles", spec_template, rootfs,
                [Case("gpu", ["NVIDIA_VISIBLE_DEVICES=1"])], judge=judge)  # fmt: skip
    loop.start(threads=3)
    loop.wait_creates(40)
    swap = tmp_path / "current.new"
    swap.symlink_to(new.root)
    swapped.append(time.monotonic())
    os.replace(swap, current)  # the new driver's files, all at once
    out = old.gpuhook("inventory", "refresh", env=env)
    assert out.returncode == 0, out.stderr
    refreshed.append(time.monotonic())
    loop.wait_creates(loop.result.creates + 40)
    result = loop.stop()
    assert result.failures == []
    versions = [v for _, v in seen]
    assert versions[0] == "550.54.15" and versions[-1] == "560.35.03"


# --- the bench ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_leftovers_bench_runs_and_reports_its_rows(tmp_path: Path) -> None:
    """bench/leftovers.py, small: both cases, the three state folders, its JSON; the leftovers
    left before the service started are gone after its rows (the service's start sweep)."""
    report = tmp_path / "leftovers.json"
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "leftovers.py"), "-n", "2", "--links", "3000",
         "--json", str(report)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(report.read_text())
    assert [r["case"] for r in data["rows"]] == ["gpu1", "mps"]
    assert all(r["new_node_ms"] > 0 and r["upgraded_ms"] > 0 for r in data["rows"])
    assert data["entries_left_after_upgrade_rows"] < 10
    assert "MPS client (admission)" in out.stdout

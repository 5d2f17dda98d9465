"""MPS tenancy on a fake node (issue 24): EXCLUSIVE_PROCESS compute mode by default and after
crashes, admission by what MPS enforces (the group's share, not an annotation), containers that
exited stop counting, and non-root clients reaching a server of their own uid. Real runc
containers through gpuhook-runtime; the fake CUDA client (tools/fakenode/fake_cuda_client.c)
attaches to the fake control daemon as libcuda would and prints what it got."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import testbed

from gpuhook.pipeline.sharing import format_size
from tests.conftest import Containers, FakeNode
from tests.integration.test_mps import ANN_PINNED, MIB, Mps, memory, mnode, mps  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.root]

CLIENT = "/bin/cuda-client"


def mode_file(node: FakeNode, index: int) -> Path:
    """Where the fake NVML keeps a GPU's compute mode (0 DEFAULT, 3 EXCLUSIVE_PROCESS)."""
    return Path(node.truth["nvml_data"] + f".computemode.{index}")


def wait_until(probe: Any, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := probe()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def client_bundle(node: FakeNode, containers: Containers, script: str, **kw: Any) -> Path:
    """A bundle running ``script`` with the fake CUDA client at /bin/cuda-client."""
    bundle = containers.bundle(args=("/bin/sh", "-c", script), **kw)
    shutil.copy2(node.truth["cuda_client"], bundle / "rootfs" / CLIENT.lstrip("/"))
    return bundle


def as_user(bundle: Path, uid: int) -> Path:
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["user"] = {"uid": uid, "gid": uid}
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def got(stdout: str) -> dict[str, str]:
    """The fake client's 'key value' lines."""
    return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)


@pytest.fixture
def open_root() -> Iterator[Path]:
    """An MPS root every uid can search (pytest's own temp folders are not: 0700). List it
    before ``mps``: it is then removed after ``mps`` stopped the daemons under it."""
    folder = Path(tempfile.mkdtemp(prefix="gh-mps-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# --- 1. compute mode ------------------------------------------------------------------------------


def test_exclusive_process_by_default_and_a_start_converges_after_crashes(
    mnode: FakeNode,  # noqa: F811 - the fixture of test_mps
    mps: Mps,  # noqa: F811 - the fixture of test_mps
) -> None:
    mps.configure(gpus=[3], replicas=2)  # no exclusive_process key: the default
    mode = mode_file(mnode, 3)
    out = mps.gpuhook("mps", "start")
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith(", compute mode EXCLUSIVE_PROCESS\n")
    assert mode.read_text().strip() == "3"
    (status,) = mps.status()
    assert status["compute_modes"] == {"3": "EXCLUSIVE_PROCESS"} and status["exclusive_process"]
    assert "compute_mode_note" not in status
    table = mps.gpuhook("mps", "status", "-o", "table").stdout
    assert "COMPUTE MODE" in table and "EXCLUSIVE_PROCESS" in table

    # the daemon crashes: the GPU stays exclusive (no context for anyone) and status says so
    (pid,) = mps.daemons()
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: pid not in mps.daemons())
    (status,) = mps.status()
    assert status["state"] == "down" and mode.read_text().strip() == "3"
    assert status["compute_mode_note"].startswith(
        "GPU 3 is in EXCLUSIVE_PROCESS compute mode with no MPS daemon: no CUDA process can use it"
    )
    assert mps.gpuhook("mps", "start").returncode == 0
    assert mps.status()[0]["state"] == "running" and mode.read_text().strip() == "3"

    # the mode is lost while the daemon runs (reset by hand): status says so, a start converges
    reset = subprocess.run(
        [mnode.truth["driver_root"] + "/usr/bin/nvidia-smi", "-i", "3", "-c", "DEFAULT"],
        env={**os.environ, **mps.env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert reset.returncode == 0, reset.stderr
    assert mode.read_text().strip() == "0"
    (status,) = mps.status()
    assert status["compute_mode_note"] == (
        "GPU 3 is not in EXCLUSIVE_PROCESS compute mode while its MPS daemon runs: a tenant that "
        "unsets CUDA_MPS_PIPE_DIRECTORY gets the whole GPU; run: gpuhook mps start gpu3"
    )
    again = mps.gpuhook("mps", "start")
    assert again.stdout.startswith("gpu3 (GPU 3): already running (pid ")
    assert mode.read_text().strip() == "3"

    # gpuhook killed after it recorded and set the mode, before the daemon came up
    out = mps.gpuhook("mps", "stop")
    assert out.stdout.endswith(", compute mode DEFAULT\n") and mode.read_text().strip() == "0"
    record = mps.root / "gpu3" / "compute-mode"
    assert not record.exists()
    record.write_text("EXCLUSIVE_PROCESS\n")
    mode.write_text("3\n")
    # the operator turns exclusive_process off meanwhile: gpuhook's record still restores DEFAULT
    mps.configure(gpus=[3], replicas=2, exclusive_process=False)
    out = mps.gpuhook("mps", "start")
    assert out.stdout.endswith(", compute mode DEFAULT\n") and mode.read_text().strip() == "0"
    assert not record.exists()
    mps.gpuhook("mps", "stop")
    untouched = mps.gpuhook("mps", "start")  # off, nothing recorded: the mode is left alone
    assert "compute mode" not in untouched.stdout and mode.read_text().strip() == "0"


def test_doctor_warns_with_the_consequence_when_exclusive_process_is_off(
    open_root: Path,
    mnode: FakeNode,  # noqa: F811 - the fixture of test_mps
    mps: Mps,  # noqa: F811 - the fixture of test_mps
) -> None:
    mps.root = open_root / "mps"  # searchable by every uid: no warning about non-root clients
    mps.configure(gpus=[1], exclusive_process=False)
    mps.start()
    out = mps.gpuhook("doctor", "-o", "json")
    checks = [c for c in json.loads(out.stdout)["checks"] if c["check"] == "mps"]
    assert [c["status"] for c in checks] == ["pass", "warn"], checks
    assert checks[1]["message"] == (
        "mps.exclusive_process is false: the MPS-shared GPUs stay in DEFAULT compute mode, so a "
        "tenant that unsets CUDA_MPS_PIPE_DIRECTORY leaves MPS and gets the whole GPU (all its "
        "SMs and memory, outside its limits)"
    )
    assert checks[1]["fix"] == (
        f"set mps.exclusive_process: true in {mps.env['GPUHOOK_CONFIG']}, then: gpuhook mps start"
    )
    mps.configure(gpus=[1])  # the default: no warning once the start converged
    mps.start()
    out = mps.gpuhook("doctor", "-o", "json")
    checks = [c for c in json.loads(out.stdout)["checks"] if c["check"] == "mps"]
    assert [c["status"] for c in checks] == ["pass"], checks


# --- 2. admission counts what MPS enforces --------------------------------------------------------


def test_an_annotation_that_lowers_the_env_does_not_lower_the_reservation(
    mnode: FakeNode,  # noqa: F811 - the fixture of test_mps
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    containers: Containers,
) -> None:
    """replicas 2 under reject: four containers annotated 1M, refused at the third (each can
    take half the GPU: a process raises its own limit up to the daemon's default)."""
    env = mps.configure(gpus=[0], replicas=2)
    mps.start()
    share = memory(mnode, 0) // 2 // MIB
    results = []
    for _ in range(4):
        bundle = client_bundle(
            mnode,
            containers,
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=999G {CLIENT}",
            env=["NVIDIA_VISIBLE_DEVICES=0"],
            annotations={ANN_PINNED: "1M"},
        )
        results.append((bundle, *containers.create(bundle, env)))
    assert [code for _, _, code, _ in results] == [0, 0, 1, 1]
    r, mem = share * MIB, memory(mnode, 0)
    assert results[2][3] == (
        f"gpuhook: MPS pinned memory reservations on GPU 0 would add up to {format_size(3 * r)} "
        f"of its {format_size(mem)} ({format_size(r)} for this container (the group's share: "
        f"its processes may raise their 1M limit up to it), {format_size(2 * r)} for 2 live "
        "container(s)); mps.oversubscription is reject\n"
    )
    assert results[3][3] == results[2][3]
    # why: the first container's process, given 1M, raises its limit to the daemon's default
    first, first_id = results[0][0], results[0][1]
    assert containers.runc("start", first_id).returncode == 0
    assert wait_until(lambda: containers.status(first_id) == "stopped")
    seen = got((containers.base / f"{first_id}.out").read_text())
    assert seen["pinned_mem_limit"] == f"0={share}M" and seen["mps"] == "yes"
    # inspect says what is reserved, and that the limits apply per process
    view = json.loads(mps.gpuhook("inspect", "spec", "--bundle", str(first), "-o", "json").stdout)
    assert view["mps"]["pinned_memory_limits"][0]["reserved"] == share * MIB
    assert view["mps"]["pinned_memory_limits"][0]["limit"] == "1M"
    assert view["mps"]["per_process"].startswith(
        "MPS applies these limits to each CUDA process of the container (each is an MPS client)"
    )
    table = mps.gpuhook("inspect", "spec", "--bundle", str(first), "-o", "table").stdout
    assert f"device 0 (GPU 0): {share}M" in table and "per process" in table


# --- 3. exited containers stop counting -----------------------------------------------------------


def test_a_container_that_exited_stops_counting_while_its_bundle_stays(
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    containers: Containers,
) -> None:
    env = mps.configure(gpus=[0], replicas=2)
    mps.start()
    done = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"])
    done_id, code, err = containers.create(done, env)
    assert (code, err) == (0, "")
    busy = containers.bundle(args=("/bin/sleep", "60"), env=["NVIDIA_VISIBLE_DEVICES=0"])
    busy_id, code, err = containers.create(busy, env)
    assert (code, err) == (0, "")
    assert containers.runc("start", busy_id).returncode == 0
    third = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"])
    refused = containers.run(third, env)
    assert refused.returncode == 1 and "for 2 live container(s)" in refused.stderr
    assert containers.status(busy_id) == "running" and containers.status(done_id) == "created"

    # the first one runs and exits: state stopped, its bundle and record kept (as podman,
    # CRI-O do until the container is removed)
    assert containers.runc("start", done_id).returncode == 0
    assert wait_until(lambda: containers.status(done_id) == "stopped")
    assert (done / "gpuhook-decision.json").exists()
    kept_id, code, err = containers.create(third, env)
    assert (code, err) == (0, "")
    # the runtime forgot it too (runc delete; the bundle stays): still not counted
    assert containers.runc("delete", done_id).returncode == 0
    fourth = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"])
    full = containers.run(fourth, env)
    assert full.returncode == 1 and "for 2 live container(s)" in full.stderr
    assert containers.runc("delete", "-f", kept_id).returncode == 0
    assert containers.run(fourth, env).returncode == 0


# --- 4. non-root clients --------------------------------------------------------------------------


def test_a_non_root_container_reaches_a_server_of_its_uid_with_the_same_limits(
    open_root: Path,
    mnode: FakeNode,  # noqa: F811 - the fixture of test_mps
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    containers: Containers,
) -> None:
    mps.root = open_root / "mps"
    env = mps.configure(gpus=[1], replicas=4)
    start = mps.gpuhook("mps", "start")
    assert (start.returncode, start.stderr) == (0, "")
    share = memory(mnode, 1) // 4 // MIB
    seen = {}
    for uid in (0, 1000):
        bundle = as_user(
            client_bundle(mnode, containers, f"id -u; {CLIENT}", env=["NVIDIA_VISIBLE_DEVICES=1"]),
            uid,
        )
        out = containers.run(bundle, env)
        assert out.returncode == 0, (out.stdout, out.stderr)
        seen[uid] = got(out.stdout)
        assert out.stdout.splitlines()[0] == str(uid)
    for uid in (0, 1000):
        assert seen[uid]["mps"] == "yes" and seen[uid]["server_uid"] == str(uid)
        assert seen[uid]["active_thread_percentage"] == "25"
        assert seen[uid]["pinned_mem_limit"] == f"0={share}M"
    log = (open_root / "mps" / "gpu1" / "log" / "control.log").read_text()
    assert "from user 1000" in log and "Server" in log and "for uid 1000 started" in log

    # one server at a time: while a root client's container lives, a uid 1000 one is refused
    root_id, code, _ = containers.create(
        client_bundle(mnode, containers, CLIENT, env=["NVIDIA_VISIBLE_DEVICES=1"]),
        env,
    )
    assert code == 0
    other = as_user(
        client_bundle(mnode, containers, CLIENT, env=["NVIDIA_VISIBLE_DEVICES=1"]), 1000
    )
    refused = containers.run(other, env)
    assert (refused.returncode, refused.stderr) == (
        1,
        "gpuhook: MPS group gpu1 serves uid 0 (1 live container(s)) and its control daemon runs "
        "one MPS server at a time, as its clients' uid: the CUDA processes of this container "
        "(uid 1000) would wait until those exit; run the containers of a group as one uid, or "
        "give this one other GPUs\n",
    )
    assert containers.runc("delete", "-f", root_id).returncode == 0
    assert containers.run(other, env).returncode == 0


def test_a_non_root_container_is_refused_when_its_server_cannot_reach_the_pipe_folder(
    mnode: FakeNode,  # noqa: F811 - the fixture of test_mps
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    containers: Containers,
    tmp_path: Path,
) -> None:
    """mps.root under pytest's 0700 temp folder: a server started as uid 1000 could not reach
    it (the fake daemon's server fails as the real one does); gpuhook says so at start, in
    doctor, and refuses the non-root container with the folder to fix. Root is served."""
    env = mps.configure(gpus=[1])
    start = mps.gpuhook("mps", "start")
    blocked = next(p for p in [*reversed(mps.root.parents)] if not p.stat().st_mode & 0o001)
    assert start.returncode == 0
    assert start.stderr == (
        f"gpuhook: warning: group gpu1: {blocked} is not searchable by other users, so "
        "containers whose process runs as a non-root uid are refused (the control daemon starts "
        "an MPS server as each client's uid, which must reach the pipe folder): chmod o+x it, or "
        "set mps.root\n"
    )
    doctor = json.loads(mps.gpuhook("doctor", "-o", "json").stdout)["checks"]
    warned = [c for c in doctor if c["check"] == "mps" and c["status"] == "warn"]
    assert [str(blocked) in c["message"] for c in warned] == [True]
    bundle = as_user(
        client_bundle(mnode, containers, CLIENT, env=["NVIDIA_VISIBLE_DEVICES=1"]), 1000
    )
    before = (bundle / "config.json").read_bytes()
    out = containers.run(bundle, env)
    assert (out.returncode, out.stderr) == (
        1,
        f"gpuhook: the MPS server for uid 1000 (this container's process; the control daemon "
        f"starts one as each client's uid) cannot reach {mps.pipe('gpu1')}: {blocked} is not "
        "searchable by it; make it so (chmod o+x), or set mps.root to a folder every uid can "
        "search\n",
    )
    assert (bundle / "config.json").read_bytes() == before
    # the refusal is warranted: the fake daemon's server for uid 1000 cannot reach it either
    control = subprocess.run(
        [mnode.truth["driver_root"] + "/usr/bin/nvidia-cuda-mps-control"],
        input="start_server -uid 1000\n",
        env={"CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe("gpu1"))},
        capture_output=True,
        text=True,
        check=True,
    )
    assert control.stdout.startswith(f"cannot reach {mps.pipe('gpu1')}/control as uid 1000: ")
    root = client_bundle(mnode, containers, CLIENT, env=["NVIDIA_VISIBLE_DEVICES=1"])
    served = containers.run(root, env)
    assert served.returncode == 0 and got(served.stdout)["server_uid"] == "0"


# --- the creator: counted before the runtime knows the container ----------------------------------


@pytest.mark.parametrize("through", ["process", "service"])
def test_the_record_names_the_process_that_runs_the_runtimes_create(
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    containers: Containers,
    tmp_path: Path,
    runtime_service: Any,
    through: str,
) -> None:
    """MPS admission counts a container while the process that runs its runtime's create lives
    (the runtime may not know it yet): the shim's own process, or the runtime service's caller,
    which execs the runtime after the service decided."""
    from gpuhook.runtime import wire
    from tests.runtime_service import dispatcher_script

    env = mps.configure(gpus=[0], replicas=2)
    mps.start()
    runtime = testbed.RUNTIME
    if through == "service":
        svc = runtime_service({**os.environ, **env})
        runtime = str(dispatcher_script(tmp_path / "gpuhook-runtime", svc.socket, tmp_path / "r"))
    bundle = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"])
    with open(tmp_path / "out", "wb") as out:
        proc = subprocess.Popen(
            [runtime, "--root", str(containers.state), "create", "--bundle", str(bundle), "c1"],
            env={"PATH": os.environ["PATH"], **env},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
        assert proc.wait(60) == 0, (tmp_path / "out").read_text()
    record = json.loads((bundle / "gpuhook-decision.json").read_text())
    creator = record["runtime"]["creator"]
    assert creator["pid"] == proc.pid and creator["start"] > 0
    if through == "service":
        assert (tmp_path / "r").read_bytes().startswith(wire.EXEC)  # the service decided

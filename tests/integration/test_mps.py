"""CUDA MPS end to end on a fake node: `gpuhook mps start|stop|status` against the fake
nvidia-cuda-mps-control (its control.log holds the exact env and commands it got), and real runc
containers through gpuhook-runtime that see the pipe directory, the env and their limits."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Containers, FakeNode, mps_daemons_under

pytestmark = [pytest.mark.slow, pytest.mark.root]

ANN_PCT = "gpuhook.io/mps-active-thread-percentage"
ANN_PINNED = "gpuhook.io/mps-pinned-memory-limit"
MIB = 1 << 20


@pytest.fixture(scope="module")
def mnode(fake_node_factory: Any) -> FakeNode:
    """4 GPUs, GPU 2 in MIG mode."""
    n: FakeNode = fake_node_factory("--gpus", "4", "--mig-gpus", "2", "--mig-devices", "2")
    n.refresh()
    return n


class Mps:
    """A config variant of the node with mps.* set, a private MPS root and state dir; every
    daemon it started is stopped afterwards."""

    def __init__(self, node: FakeNode, folder: Path) -> None:
        self.node = node
        self.folder = folder
        self.root = folder / "mps"
        self.env: dict[str, str] = {}

    def configure(self, **mps: Any) -> dict[str, str]:
        self.env = self.node.variant(
            self.folder,
            mps={"root": str(self.root), **mps},
            state_dir=str(self.folder / "state"),
            inventory={"path": str(self.node.root / "state" / "inventory.json")},
        )
        return self.env

    def gpuhook(self, *args: str, env: dict[str, str] | None = None, **kw: Any) -> Any:
        return self.node.gpuhook(*args, env={**self.env, **(env or {})}, **kw)

    def start(self, *gpus: str) -> None:
        out = self.gpuhook("mps", "start", *gpus)
        assert out.returncode == 0, out.stderr

    def status(self, *gpus: str) -> list[dict[str, Any]]:
        out = self.gpuhook("mps", "status", "-o", "json", *gpus)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["groups"]  # type: ignore[no-any-return]

    def pipe(self, group: str) -> Path:
        return self.root / group / "pipe"

    def log(self, group: str) -> list[str]:
        """control.log without the timestamp prefix: 'Env:...', 'Cmd:...', ..."""
        lines = (self.root / group / "log" / "control.log").read_text().splitlines()
        return [line.split("] ", 1)[1] for line in lines]

    def daemons(self) -> list[int]:
        """Live nvidia-cuda-mps-control processes whose pipe directory is under this root."""
        return mps_daemons_under(self.root)

    def cleanup(self) -> None:
        if self.env:
            self.gpuhook("mps", "stop")
        for pid in self.daemons():  # only daemons of this test's root: ones it started
            os.kill(pid, signal.SIGKILL)
        for mount in mounts_under(self.root):  # the groups' tmpfs of groups no longer configured
            subprocess.run(["umount", "-l", mount], check=False)


def mounts_under(root: Path) -> list[str]:
    """The mount points under ``root`` in this mount namespace, deepest first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(f"{root}/"):
            found.append(point)
    return sorted(found, key=len, reverse=True)


@pytest.fixture
def mps(mnode: FakeNode, tmp_path: Path) -> Iterator[Mps]:
    m = Mps(mnode, tmp_path / "mps-test")
    yield m
    m.cleanup()


def uuid(node: FakeNode, index: int) -> str:
    return str(node.truth["gpus"][index]["uuid"])


def memory(node: FakeNode, index: int) -> int:
    return int(node.truth["gpus"][index]["memory"])


def run_script(
    containers: Containers, runtime_env: dict[str, str], script: str, **kw: Any
) -> tuple[Any, Path]:
    """Run ``script`` in a container (``kw`` shapes the bundle: env, annotations)."""
    bundle = containers.bundle(args=("/bin/sh", "-c", script), **kw)
    return containers.run(bundle, runtime_env), bundle


def container_env(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if line.startswith("CUDA_MPS_"))


# --- the daemons ----------------------------------------------------------------------------------


def test_start_twice_is_idempotent_with_the_real_command_lines(mnode: FakeNode, mps: Mps) -> None:
    mps.configure(gpus=[0, 3], replicas=4)
    first = mps.gpuhook("mps", "start", env={"SECRET_FROM_CALLER": "1"})
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    pid0 = (mps.pipe("gpu0") / "nvidia-cuda-mps-control.pid").read_text().strip()
    mode = "compute mode EXCLUSIVE_PROCESS"  # mps.exclusive_process is true by default
    assert lines[0] == f"gpu0 (GPU 0): started (pid {pid0}), pipe {mps.pipe('gpu0')}, {mode}"
    assert lines[1].startswith("gpu3 (GPU 3): started (pid ")
    second = mps.gpuhook("mps", "start", "0")
    assert second.returncode == 0, second.stderr
    assert second.stdout == (
        f"gpu0 (GPU 0): already running (pid {pid0}), pipe {mps.pipe('gpu0')}, {mode}\n"
    )
    assert len(mps.daemons()) == 2  # one per GPU, no second daemon for GPU 0

    log = mps.log("gpu0")
    env = sorted(line[4:] for line in log if line.startswith("Env:"))
    share = memory(mnode, 0) // 4 // MIB
    assert env == sorted(
        [
            f"PATH={mnode.truth['driver_root']}/usr/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            f"CUDA_VISIBLE_DEVICES={uuid(mnode, 0)}",
            f"CUDA_MPS_PIPE_DIRECTORY={mps.pipe('gpu0')}",
            f"CUDA_MPS_LOG_DIRECTORY={mps.root}/gpu0/log",
            f"LD_LIBRARY_PATH={mnode.truth['driver_root']}/usr/lib/x86_64-linux-gnu",
        ]
    )  # explicit env: nothing of the caller's (SECRET_FROM_CALLER) leaks into the daemon
    assert [line for line in log if line.startswith(("Argv:", "Cmd:"))] == [
        f"Argv:{mnode.truth['driver_root']}/usr/bin/nvidia-cuda-mps-control",
        "Argv:-d",
        "Cmd:set_default_active_thread_percentage 25",
        f"Cmd:set_default_device_pinned_mem_limit 0 {share}M",
        "Cmd:set_default_active_thread_percentage 25",  # the second start re-applies the share
        f"Cmd:set_default_device_pinned_mem_limit 0 {share}M",
    ]


def test_status_reports_defaults_servers_and_stop_leaves_no_daemon(
    mnode: FakeNode, mps: Mps
) -> None:
    mps.configure(groups={"pair": {"gpus": [3, 0], "active_thread_percentage": 30}})
    mps.start("pair")
    (status,) = mps.status()
    assert status["state"] == "running" and status["pid"] == mps.daemons()[0]
    assert [g["index"] for g in status["gpus"]] == [0, 3]
    assert status["pipe_dir"] == str(mps.pipe("pair"))
    assert status["defaults"] == {
        "active_thread_percentage": "30.0",
        "pinned_memory_limit": {"0": "none", "1": "none"},
    }
    assert status["servers"] == []
    assert f"CUDA_VISIBLE_DEVICES={uuid(mnode, 0)},{uuid(mnode, 3)}" in [
        line[4:] for line in mps.log("pair")
    ]
    # an MPS server (the real daemon starts one per client uid), through the control interface
    control = subprocess.run(
        [mnode.truth["driver_root"] + "/usr/bin/nvidia-cuda-mps-control"],
        input="start_server -uid 0\n",
        env={"CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe("pair"))},
        capture_output=True,
        text=True,
        check=True,
    )
    assert control.stderr == ""
    (status,) = mps.status("0")
    assert len(status["servers"]) == 1 and status["servers"][0]["clients"] == []
    table = mps.gpuhook("mps", "status", "-o", "table").stdout
    assert "pair   0,3   running" in table.replace("  ", "  ")

    out = mps.gpuhook("mps", "stop", "pair")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"pair (GPUs 0,3): stopped (pid {status['pid']})")
    assert mps.daemons() == []
    assert not (mps.pipe("pair") / "nvidia-cuda-mps-control.pid").exists()
    assert [line for line in mps.log("pair") if line.startswith("Cmd:")][-1] == "Cmd:quit"
    assert mps.status()[0]["state"] == "down"
    again = mps.gpuhook("mps", "stop")
    assert again.returncode == 0 and "pair (GPUs 0,3): not running" in again.stdout


def test_daemon_killed_by_hand_is_reported_down_and_refuses_containers(
    mnode: FakeNode, mps: Mps, containers: Containers
) -> None:
    env = mps.configure(gpus=[1])
    mps.start()
    (pid,) = mps.daemons()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pid in mps.daemons() and time.monotonic() < deadline:
        time.sleep(0.05)
    (status,) = mps.status("1")
    assert status["state"] == "down" and status["pid"] is None
    record = mps.root / "gpu1" / "control.pid"
    assert status["note"] == f"stale pid record {record}: process {pid} is gone"
    node_view = json.loads(mps.gpuhook("inspect", "node", "-o", "json").stdout)
    assert node_view["gpus"][1]["mps"] == {
        "shared": True,
        "group": "gpu1",
        "daemon": "down",
        "pid": None,
        "pipe_dir": str(mps.pipe("gpu1")),
    }

    bundle = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=1"])
    before = (bundle / "config.json").read_bytes()
    out = containers.run(bundle, env)
    assert out.returncode == 1
    assert out.stderr == (
        "gpuhook: the MPS control daemon of GPU 1 (group gpu1) is not running; "
        "start it: gpuhook mps start gpu1\n"
    )
    assert (bundle / "config.json").read_bytes() == before
    mps.start("gpu1")  # a fresh daemon over the stale pid file
    assert mps.status("1")[0]["state"] == "running"
    assert containers.run(bundle, env).returncode == 0


def test_mig_gpu_cannot_be_shared(mnode: FakeNode, mps: Mps, containers: Containers) -> None:
    env = mps.configure(gpus=[0, 2])
    out = mps.gpuhook("mps", "start")
    config = env["GPUHOOK_CONFIG"]
    line = (
        f"gpuhook: invalid config {config}: mps.gpus[1]: GPU 2 ({uuid(mnode, 2)}) is in MIG "
        "mode; MIG devices cannot be MPS-shared\n"
    )
    assert (out.returncode, out.stderr) == (2, line)
    result = containers.run(
        containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"]), env
    )
    assert (result.returncode, result.stderr) == (2, line)
    mps.configure(gpus=["all"])  # all: every GPU not in MIG mode
    assert [g["group"] for g in mps.status()] == ["gpu0", "gpu1", "gpu3"]


def test_no_shared_gpu_and_unknown_names(mps: Mps) -> None:
    mps.configure()
    out = mps.gpuhook("mps", "status")
    assert out.returncode == 1
    assert out.stderr.startswith("gpuhook: no GPU is MPS-shared: set mps.gpus or mps.groups in ")
    mps.configure(gpus=[0])
    out = mps.gpuhook("mps", "start", "3")
    assert (out.returncode, out.stderr) == (
        2,
        "gpuhook: '3' is not an MPS-shared GPU or share group (shared: gpu0 (GPU 0))\n",
    )


@pytest.mark.parametrize("plant", ["file", "symlink"])
def test_a_client_container_cannot_steer_stop_or_create_through_the_pipe_dir(
    mps: Mps, containers: Containers, tmp_path: Path, plant: str
) -> None:
    """An MPS client container (root inside, the pipe folder mounted read-write) replaces the
    daemon's pid file with the pid of another group's daemon (as a file, or as a link to a host
    file holding it), and plants links where a record might be looked for. Its own daemon then
    dies. gpuhook reads none of it: creates for that group are refused (daemon down),
    `gpuhook mps stop` signals no other process, and the next start gets an empty pipe folder."""
    env = mps.configure(gpus=[0, 1])
    mps.start()
    other, own = mps.status("0")[0]["pid"], mps.status("1")[0]["pid"]
    host_file = tmp_path / "other-pid"
    host_file.write_text(f"{other}\n")
    pid_file = "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
    write = {"file": f"echo {other} > {pid_file}", "symlink": f"ln -sf {host_file} {pid_file}"}
    script = (
        f"rm -f {pid_file} && {write[plant]} && "
        f"ln -s {host_file} $CUDA_MPS_PIPE_DIRECTORY/control.pid && "
        "ln -s / $CUDA_MPS_PIPE_DIRECTORY/root && ls $CUDA_MPS_PIPE_DIRECTORY"
    )
    out, _ = run_script(containers, env, script, env=["NVIDIA_VISIBLE_DEVICES=1"])
    assert out.returncode == 0, out.stderr
    assert "control.pid" in out.stdout.split()
    os.kill(own, signal.SIGKILL)  # the group's daemon dies; the planted pid file stays
    deadline = time.monotonic() + 5
    while own in mps.daemons() and time.monotonic() < deadline:
        time.sleep(0.05)

    refused = containers.run(
        containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=1"]), env
    )
    assert (refused.returncode, refused.stderr) == (
        1,
        "gpuhook: the MPS control daemon of GPU 1 (group gpu1) is not running; "
        "start it: gpuhook mps start gpu1\n",
    )
    assert mps.status("1")[0]["state"] == "down"
    stopped = mps.gpuhook("mps", "stop", "1")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("gpu1 (GPU 1): not running, pipe ")
    assert mps.daemons() == [other]  # the other group's daemon was never signalled
    assert mps.status("0")[0]["state"] == "running"

    mps.start("1")
    planted = {"control.pid", "root"}
    assert planted.isdisjoint(os.listdir(mps.pipe("gpu1")))  # a new, empty pipe folder
    own = mps.status("1")[0]["pid"]
    assert (mps.pipe("gpu1") / "nvidia-cuda-mps-control.pid").read_text().strip() == str(own)
    assert sorted(mps.daemons()) == sorted([other, own])
    assert host_file.read_text() == f"{other}\n"


def test_a_look_alike_in_another_pid_namespace_is_never_taken_for_the_daemon(
    mps: Mps, tmp_path: Path
) -> None:
    """A process with the daemon's argv (`nvidia-cuda-mps-control -d`) and its pipe folder in
    its env, as a container's root can start one, but in another pid namespace: gpuhook never
    adopts it (status: down), never signals it (stop: not running). The same process in gpuhook's
    own pid namespace is found, so the test can fail."""
    mps.configure(gpus=[1])
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe("gpu1"))}
    argv = ["nvidia-cuda-mps-control", "-d", "-c", "import time; time.sleep(60)"]
    code = f"import os, sys; os.execve(sys.executable, {argv!r}, {env!r})"
    impostor = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", code]
    )
    try:
        deadline = time.monotonic() + 10
        while not mps.daemons() and time.monotonic() < deadline:
            time.sleep(0.05)
        (pid,) = mps.daemons()  # visible from the host, with the daemon's argv and env
        assert mps.status("1")[0]["state"] == "down"
        out = mps.gpuhook("mps", "stop", "1")
        assert out.returncode == 0 and out.stdout.startswith("gpu1 (GPU 1): not running")
        assert mps.daemons() == [pid]
    finally:
        impostor.kill()
        impostor.wait(10)
    twin = subprocess.Popen([sys.executable, "-c", code])  # the control: gpuhook's pid namespace
    try:
        deadline = time.monotonic() + 10
        while mps.status("1")[0]["state"] != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mps.status("1")[0]["pid"] == twin.pid
    finally:
        twin.kill()
        twin.wait(10)


# --- containers -----------------------------------------------------------------------------------

PROBE = (
    "env | grep ^CUDA_MPS_ | sort; "
    'echo "--- pipe"; ls "$CUDA_MPS_PIPE_DIRECTORY"; '
    'echo "--- daemon"; echo get_default_active_thread_percentage | nvidia-cuda-mps-control; '
    'echo "--- shm"; ls /dev/shm'
)


def sections(stdout: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"env": []}
    current = "env"
    for line in stdout.splitlines():
        if line.startswith("--- "):
            current = line[4:]
            out[current] = []
        elif line.strip():
            out[current].append(line.strip())
    return out


def test_container_sees_the_pipe_dir_the_env_and_its_limits(
    mnode: FakeNode, mps: Mps, containers: Containers, tmp_path: Path
) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "from-the-host").write_text("x")
    env = mps.configure(gpus=[1], replicas=2, shm=str(shm), log_dir=True)
    mps.start()
    image_env = [
        "NVIDIA_VISIBLE_DEVICES=1",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",  # the image's values never widen a limit
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=999G",
    ]
    out, bundle = run_script(containers, env, PROBE, env=image_env)
    assert out.returncode == 0, out.stderr
    seen = sections(out.stdout)
    share = memory(mnode, 1) // 2 // MIB
    assert container_env(out.stdout) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/gpuhook/mps/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/run/gpuhook/mps/log",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={share}M",
    }
    assert seen["pipe"] == ["control", "nvidia-cuda-mps-control.pid"]
    assert seen["daemon"] == ["50.0"]  # the host daemon answered through the mounted pipe dir
    assert seen["shm"] == []  # the group's own shm folder, never the host folder named (issue 36.2)
    record = json.loads((bundle / "gpuhook-decision.json").read_text())
    assert record["mps"]["pinned_memory_limits"][0]["bytes"] == share * MIB


def test_two_containers_with_different_annotations_get_different_limits(
    mps: Mps, containers: Containers
) -> None:
    env = mps.configure(gpus=[0], replicas=2)
    mps.start()
    got = []
    for pct, pinned in (("20", "8G"), ("45", "512M")):
        out, _ = run_script(
            containers,
            env,
            "env | grep ^CUDA_MPS_",
            env=["NVIDIA_VISIBLE_DEVICES=0"],
            annotations={ANN_PCT: pct, ANN_PINNED: pinned},
        )
        assert out.returncode == 0, out.stderr
        got.append(container_env(out.stdout))
    assert [
        (g["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], g["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]) for g in got
    ] == [
        ("20", "0=8192M"),
        ("45", "0=512M"),
    ]


def test_gpus_0_and_3_in_one_group_get_container_indices_0_and_1(
    mnode: FakeNode, mps: Mps, containers: Containers
) -> None:
    env = mps.configure(groups={"pair": {"gpus": [0, 3], "pinned_memory_limit": "30G"}})
    mps.start("pair")
    out, _ = run_script(
        containers,
        env,
        "env | grep ^CUDA_MPS_; ls /dev | grep '^nvidia[0-9]'",
        env=[f"NVIDIA_VISIBLE_DEVICES={uuid(mnode, 3)},0"],
        annotations={ANN_PINNED: "1=10G"},
    )
    assert out.returncode == 0, out.stderr
    assert container_env(out.stdout)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=30720M,1=10240M"
    assert [line for line in out.stdout.splitlines() if line.startswith("nvidia")] == [
        "nvidia0",
        "nvidia3",
    ]
    assert "Cmd:set_default_device_pinned_mem_limit 1 30720M" in mps.log("pair")
    # the same two GPUs behind two daemons cannot be one CUDA process's
    env = mps.configure(gpus=[0, 3])
    out, _ = run_script(containers, env, "true", env=["NVIDIA_VISIBLE_DEVICES=0,3"])
    assert out.returncode == 1
    assert out.stderr.startswith(
        "gpuhook: GPUs 0,3 are MPS-shared by different control daemons (groups gpu0, gpu3)"
    )


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({ANN_PCT: "0"}, f"annotation {ANN_PCT}: '0' is not a percentage from 1 to 100"),
        ({ANN_PCT: "101"}, f"annotation {ANN_PCT}: '101' is not a percentage from 1 to 100"),
        (
            {ANN_PINNED: "8X"},
            f"annotation {ANN_PINNED}: '8X' is not a size (a number and a unit K, M, G or T: "
            "512M, 20G)",
        ),
    ],
)
def test_bad_values_are_refused_and_nothing_is_applied(
    mps: Mps, containers: Containers, annotations: dict[str, str], message: str
) -> None:
    env = mps.configure(gpus=[0])
    mps.start()
    bundle = containers.bundle(
        args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"], annotations=annotations
    )
    before = (bundle / "config.json").read_bytes()
    out = containers.run(bundle, env, container_id="bad-values")
    assert (out.returncode, out.stderr) == (1, f"gpuhook: {message}\n")
    assert (bundle / "config.json").read_bytes() == before
    assert not (bundle / "gpuhook-decision.json").exists()


def test_pinned_reservations_over_the_gpu_memory_are_refused_under_reject(
    mnode: FakeNode, mps: Mps, containers: Containers
) -> None:
    """The sum is over the live containers on the GPU: those their runtime has not finished
    with (created here), whose record (in their bundle) still exists."""
    env = mps.configure(gpus=[0], pinned_memory_limit="50G")
    mps.start()
    first = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"])
    first_id, code, err = containers.create(first, env)
    assert (code, err) == (0, "")
    second = containers.bundle(
        args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"], annotations={ANN_PINNED: "40G"}
    )
    before = (second / "config.json").read_bytes()
    out = containers.run(second, env)
    assert out.returncode == 1
    assert out.stderr == (
        "gpuhook: MPS pinned memory reservations on GPU 0 would add up to 100G of its 79.6G "
        "(50G for this container (the group's share: its processes may raise their 40G limit "
        "up to it), 50G for 1 live container(s)); mps.oversubscription is reject\n"
    )
    assert (second / "config.json").read_bytes() == before
    # a dry run over the live container's own bundle does not count it twice
    dry = mps.gpuhook("inspect", "spec", "--bundle", str(first), "-o", "json")
    assert dry.returncode == 0, dry.stderr
    dry = mps.gpuhook("inspect", "spec", "--bundle", str(second), "-o", "json")
    assert (dry.returncode, dry.stderr) == (1, out.stderr)
    other_gpu = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=1"])
    assert containers.run(other_gpu, env).returncode == 0  # not shared: not counted
    assert containers.runc("delete", first_id).returncode == 0
    shutil.rmtree(first)  # the engine deletes the container with its bundle
    out = containers.run(second, env)
    assert out.returncode == 0, out.stderr
    allow = mps.configure(gpus=[0], pinned_memory_limit="50G", oversubscription="allow")
    kept = [containers.create(containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"]), allow)]
    kept.append(containers.create(containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"]), allow))
    assert [(code, err) for _, code, err in kept] == [(0, ""), (0, "")]


def test_inspect_spec_shows_the_limits_and_their_sources(
    mnode: FakeNode, mps: Mps, containers: Containers
) -> None:
    mps.configure(gpus=[3], replicas=4)
    mps.start()
    bundle = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=3"], annotations={ANN_PCT: "10"})
    out = mps.gpuhook("inspect", "spec", "--bundle", str(bundle), "-o", "json")
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)["mps"]
    share = memory(mnode, 3) // 4 // MIB
    assert view["group"] == "gpu3" and view["pipe_dir"] == str(mps.pipe("gpu3"))
    assert view["active_thread_percentage"] == {"value": 10, "source": f"annotation {ANN_PCT}"}
    assert [
        (d["index"], d["gpu"], d["limit"], d["source"]) for d in view["pinned_memory_limits"]
    ] == [(0, 3, f"{share}M", "1/4 of 79.6G from mps.replicas")]
    table = mps.gpuhook("inspect", "spec", "--bundle", str(bundle), "-o", "table").stdout
    assert "active threads  10%" in table and f"annotation {ANN_PCT}" in table
    assert "1/4 of 79.6G from mps.replicas" in table

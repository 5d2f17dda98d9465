"""Hostile MPS tenants (issue 36, items 1-5) on a fake node with real runc: an ordinary pod author
(any image, env and command, no privilege) cannot stall another tenant's create, reach another
tenant's or the host's shared memory, fill a filesystem the node needs, use a GPU outside MPS,
or break the recovery of its group. Each test fails on the code before its rule (SECURITY.md,
"Hostile MPS tenants")."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests import hostile_elf
from tests.conftest import Containers, FakeNode
from tests.integration.test_mps import Mps, mnode, mounts_under, mps  # noqa: F401
from tests.integration.test_mps_tenancy import CLIENT, client_bundle, got, mode_file

pytestmark = [pytest.mark.slow, pytest.mark.root]

COMPAT = "usr/local/cuda/compat"


def wait_until(probe: Any, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := probe()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def create_in_background(
    containers: Containers, bundle: Path, env: dict[str, str], **kw: Any
) -> Any:
    """``<runtime> create`` of ``bundle``, not waited for (its output in <id>.out/.err)."""
    cid = kw.pop("container_id", bundle.name)
    out = open(containers.base / f"{cid}.out", "wb")  # noqa: SIM115 - the child's
    proc = subprocess.Popen(
        [kw.pop("runtime", testbed.RUNTIME), "--root", str(containers.state), "create",
         "--bundle", str(bundle), cid],
        env={"PATH": os.environ["PATH"], **env},
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    out.close()
    return proc


def lock_busy(path: Path) -> bool:
    """Whether another process holds the flock on ``path`` (taken and let go at once if not)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# --- 1. an image read is bounded and never under the node-wide lock --------------------------


def test_a_crafted_compat_library_stalls_neither_its_create_nor_another_tenants(
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    containers: Containers,
) -> None:
    """The issue's ELF32 (16.8 MB, 419,430 sections by extended numbering, each named by a
    65,535-byte name) as the image's forward compatibility libcuda, on MPS-shared GPU 0; a
    second tenant creates on GPU 1 while the first create runs. Before: the first create read
    the file for a minute holding the MPS accounting lock, and the second failed after 30 s
    (timed out waiting for the MPS accounting lock). Now the first create's decision takes a
    few reads, and the library is refused in one reason line."""
    env = mps.configure(gpus=[0, 1], replicas=2)
    mps.start()
    crafted = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"])
    folder = crafted / "rootfs" / COMPAT
    folder.mkdir(parents=True)
    assert hostile_elf.write(folder / "libcuda.so.999.1") == 16_842_788
    other = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=1"])
    lock = mps.folder / "state" / "mps-usage.lock"

    started = time.monotonic()
    first = create_in_background(containers, crafted, env)
    # the second tenant comes while the first create holds the lock (or once it is done)
    wait_until(lambda: first.poll() is not None or lock_busy(lock), timeout=60)
    _, code, err = containers.create(other, env)
    assert (code, err) == (0, "")
    assert first.wait(60) == 0, (containers.base / f"{crafted.name}.out").read_text()
    assert time.monotonic() - started < 20  # a minute before; a few reads now

    view = mps.gpuhook("inspect", "spec", "--bundle", str(crafted), "-o", "json")
    assert (
        "/usr/local/cuda/compat/libcuda.so.999.1 unreadable: 419430 section headers is more "
        "than a shared library has (at most 1024)"
    ) in view.stdout


def service_workers_with(service_pid: int, path: Path) -> list[int]:
    """The service's children that have ``path`` open (a worker waiting for, or holding, a lock)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rpartition(")")[2].split()[1]) != service_pid:
                continue
            fds = os.listdir(f"/proc/{entry}/fd")
            targets = [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in fds]
        except OSError:
            continue
        if str(path) in targets:
            found.append(int(entry))
    return found


def test_a_worker_whose_caller_is_killed_stops_and_lets_go(
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    containers: Containers,
    runtime_service: Any,
    tmp_path: Path,
) -> None:
    """A create through the runtime service waits for the MPS accounting lock (held here); its
    caller (gpuhook-runtime) is killed, as a kubelet's timeout does. Its worker stops at once:
    before, it waited for the lock and went on with a create nobody waited for."""
    from tests.runtime_service import dispatcher_script

    env = mps.configure(gpus=[0], replicas=2)
    mps.start()
    svc = runtime_service({**os.environ, **env})
    runtime = str(dispatcher_script(tmp_path / "gpuhook-runtime", svc.socket))
    lock = mps.folder / "state" / "mps-usage.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        bundle = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"])
        caller = create_in_background(containers, bundle, env, runtime=runtime)
        workers = wait_until(lambda: service_workers_with(svc.process.pid, lock), timeout=30)
        assert len(workers) == 1, "the create never reached the lock"
        caller.kill()
        caller.wait(10)
        assert wait_until(lambda: not service_workers_with(svc.process.pid, lock), timeout=10)
        assert (
            not Path(f"/proc/{workers[0]}").exists()
            or "Z" in Path(f"/proc/{workers[0]}/stat").read_text().rpartition(")")[2].split()[0]
        )
    finally:
        os.close(held)
    # the service goes on serving
    again = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=0"])
    _, code, err = containers.create(again, env, runtime=runtime)
    assert (code, err) == (0, "")


# --- 4. a grant on an MPS-shared GPU is MPS or no CUDA ---------------------------------------


def test_a_utility_container_on_an_mps_shared_gpu_gets_no_cuda_device_node(
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    containers: Containers,
) -> None:
    """``NVIDIA_DRIVER_CAPABILITIES=utility`` (a GPU monitor) on MPS-shared GPU 0: no MPS plan,
    and now no unified memory node either (NVIDIA's libnvidia-container gives it only to
    compute), so a libcuda the image ships cannot make a context outside MPS; NVML's nodes stay
    and nvidia-smi works. Before: /dev/nvidia-uvm and /dev/nvidia-uvm-tools were injected."""
    env = mps.configure(gpus=[0], replicas=2)
    mps.start()
    probe = "ls /dev | grep ^nvidia; env | grep ^CUDA_MPS_ || true; nvidia-smi -L"
    seen = {}
    for caps in ("utility", "compute,utility"):
        bundle = containers.bundle(
            args=("/bin/sh", "-c", probe),
            env=["NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_DRIVER_CAPABILITIES={caps}"],
        )
        out = containers.run(bundle, env)
        assert (out.returncode, out.stderr) == (0, ""), caps
        seen[caps] = out.stdout.splitlines()
    monitor, client = seen["utility"], seen["compute,utility"]
    assert [line for line in monitor if line.startswith(("nvidia", "CUDA_MPS_"))] == [
        "nvidia0",
        "nvidiactl",
    ]
    assert monitor[-1].startswith("GPU 0: ")  # NVML still works
    assert {"nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"} <= set(client)
    assert "CUDA_MPS_PIPE_DIRECTORY=/run/gpuhook/mps/pipe" in client  # compute: an MPS client


# --- 2. mps.shm: the group's own folder, never a host one -------------------------------------


def test_tenants_of_two_groups_share_no_memory_folder_and_never_the_hosts(
    mnode: FakeNode,  # noqa: F811 - the fixture of test_mps
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    containers: Containers,
) -> None:
    """``mps.shm: /dev/shm`` (README's example). Tenant A (GPU 0) writes a file in its
    /dev/shm; tenant B (GPU 1, another group) can neither see, read, overwrite nor delete it,
    and neither sees the host's segments. MPS still works: A's fake CUDA client finds its
    server's memory file in its own /dev/shm (the daemon's /dev/shm is the group's folder too).
    Before: both had the host's /dev/shm, read-write."""
    env = mps.configure(gpus=[0, 1], shm="/dev/shm")
    mps.start()
    secret, host = (
        f"gh-t36-a-{uuid.uuid4().hex[:8]}",
        Path(f"/dev/shm/gh-t36-host-{uuid.uuid4().hex[:8]}"),
    )
    host.write_text("host segment\n")
    try:
        a = client_bundle(
            mnode,
            containers,
            f"{CLIENT} && echo from-a > /dev/shm/{secret} && ls /dev/shm",
            env=["NVIDIA_VISIBLE_DEVICES=0"],
        )
        out = containers.run(a, env)
        assert out.returncode == 0, out.stderr
        assert got(out.stdout)["shm"] == "yes", out.stdout  # the server's file, seen by its client
        assert secret in out.stdout.split() and host.name not in out.stdout.split()
        b = containers.bundle(
            args=("/bin/sh", "-c", f"ls /dev/shm; cat /dev/shm/{secret}; rm /dev/shm/{secret}; "
                  f"echo from-b > /dev/shm/{secret}; true"),
            env=["NVIDIA_VISIBLE_DEVICES=1"],
        )  # fmt: skip
        seen = containers.run(b, env)
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.split() == []  # nothing of A's, nothing of the host's
        assert "No such file" in seen.stderr
        assert (mps.root / "gpu0" / "shm" / secret).read_text() == "from-a\n"  # A's is intact
        assert host.read_text() == "host segment\n"
        # within a group the folder is shared (MPS needs it): a second container of GPU 0 sees it
        again = containers.bundle(
            args=("/bin/cat", f"/dev/shm/{secret}"), env=["NVIDIA_VISIBLE_DEVICES=0"]
        )
        assert containers.run(again, env).stdout == "from-a\n"
    finally:
        host.unlink()
        Path(f"/dev/shm/{secret}").unlink(missing_ok=True)  # where the code before wrote it


# --- 3. a full pipe folder fills the group's filesystem, not the node's ------------------------


def test_a_tenant_that_fills_its_pipe_folder_leaves_the_node_creating(
    mnode: FakeNode,  # noqa: F811 - the fixture of test_mps
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    containers: Containers,
    tmp_path: Path,
) -> None:
    """A 48M tmpfs stands for /run: runc's state and mps.root (its default /run/gpuhook/mps)
    both live there. A client container writes /dev/zero into its pipe folder until it is
    full: it stops at the group's 16M (mps.pipe_size), and containers on the node still start.
    Before: the pipe folder was a folder of /run, which the tenant filled, and every later
    create failed (runc: unable to store init state)."""
    run = tmp_path / "run"
    run.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48M", "tmpfs", str(run)], check=True)
    try:
        containers.state = run / "runc"
        mps.root = run / "gpuhook" / "mps"
        env = mps.configure(gpus=[0, 1])  # mps.pipe_size: 16M by default
        mps.start()
        fill = containers.bundle(
            args=("/bin/sh", "-c", "dd if=/dev/zero of=$CUDA_MPS_PIPE_DIRECTORY/fill bs=4k "
                  "count=16384 2>&1; echo filled; sleep 60"),
            env=["NVIDIA_VISIBLE_DEVICES=0"],
        )  # fmt: skip
        filler, code, err = containers.create(fill, env)  # it stays: its state stays in /run
        assert (code, err) == (0, "")
        assert containers.runc("start", filler).returncode == 0
        output = containers.base / f"{filler}.out"
        assert wait_until(lambda: "filled" in output.read_text(), timeout=60)
        assert "No space left on device" in output.read_text()
        for env_line in ("NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_VISIBLE_DEVICES=none"):
            later = containers.run(containers.bundle(args=("/bin/true",), env=[env_line]), env)
            assert (later.returncode, later.stderr) == (0, ""), env_line
        assert (mps.pipe("gpu0") / "fill").stat().st_size <= 16 << 20
        assert os.statvfs(run).f_bavail * os.statvfs(run).f_frsize > 40 << 20  # /run: untouched
        # the group's next daemon gets a new, empty pipe folder
        assert mps.gpuhook("mps", "stop", "0").returncode == 0
        mps.start("0")
        assert "fill" not in os.listdir(mps.pipe("gpu0"))
    finally:
        subprocess.run(
            f"for c in $(runc --root {containers.state} list -q); do "
            f"runc --root {containers.state} delete -f $c; done",
            shell=True,
            check=False,
        )
        mps.cleanup()
        subprocess.run(["umount", "-l", str(run)], check=False)


# --- 5. recovery cannot be broken from inside -------------------------------------------------


def nest(top: Path, depth: int, link_to: Path) -> None:
    """``depth`` nested folders under ``top``, a link to ``link_to`` at the bottom."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.symlink(link_to, "host", dir_fd=fd)
    os.close(fd)


def test_nested_folders_in_a_pipe_folder_do_not_break_stop_and_start(
    mnode: FakeNode,  # noqa: F811 - the fixture of test_mps
    mps: Mps,  # noqa: F811 - the fixture of test_mps
    containers: Containers,
    tmp_path: Path,
) -> None:
    """A client makes 1,200 nested folders (and a link to a host folder at the bottom) in its
    pipe folder; `gpuhook mps stop && gpuhook mps start` works: a running daemon, the GPU in
    EXCLUSIVE_PROCESS, no pipe.old-* left, the host folder untouched. The same for a pipe folder
    an older gpuhook made (a folder, not a mount), which is removed without recursion. Before:
    internal error (RecursionError), pipe.old-<pid> left, the GPU exclusive with no daemon."""
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    env = mps.configure(gpus=[1])
    mps.start()
    script = (
        "cd $CUDA_MPS_PIPE_DIRECTORY && i=0; while [ $i -lt 1200 ]; do mkdir d && cd d || exit 1; "
        f"i=$((i+1)); done; ln -s {keep} host"
    )
    out = containers.run(
        containers.bundle(args=("/bin/sh", "-c", script), env=["NVIDIA_VISIBLE_DEVICES=1"]), env
    )
    assert (out.returncode, out.stderr) == (0, "")

    def recovered() -> None:
        stop = mps.gpuhook("mps", "stop")
        start = mps.gpuhook("mps", "start")
        assert (stop.returncode, start.returncode) == (0, 0), stop.stderr + start.stderr
        assert "error" not in stop.stderr + start.stderr  # the non-root warning only
        (status,) = mps.status()
        assert status["state"] == "running" and mode_file(mnode, 1).read_text().strip() == "3"
        assert sorted(os.listdir(mps.root / "gpu1")) == [
            "compute-mode",
            "control.pid",
            "lock",
            "log",
            "pipe",
        ]
        assert os.listdir(mps.pipe("gpu1")) and "d" not in os.listdir(mps.pipe("gpu1"))
        assert (keep / "precious").read_text() == "x"

    recovered()
    # a pipe folder an older gpuhook made: a folder of mps.root's filesystem, walked to remove it
    assert mps.gpuhook("mps", "stop").returncode == 0
    assert not any(p.startswith(str(mps.pipe("gpu1"))) for p in mounts_under(mps.root))
    nest(mps.pipe("gpu1"), 1200, keep)
    recovered()


def test_a_daemon_an_older_gpuhook_started_is_named_with_the_fix(
    mps: Mps,  # noqa: F811 - the fixture of test_mps
) -> None:
    """A daemon that runs with a pipe folder on mps.root's filesystem (as an older gpuhook
    started it; here its tmpfs is detached under it): `mps start` leaves it running and says
    how to give it folders of its own."""
    mps.configure(gpus=[1], shm="group")
    mps.start()
    for folder in ("pipe", "shm"):
        subprocess.run(["umount", "-l", str(mps.root / "gpu1" / folder)], check=True)
    again = mps.gpuhook("mps", "start")
    assert again.returncode == 0 and again.stdout.startswith("gpu1 (GPU 1): already running")
    for folder in ("pipe", "shm"):
        assert (
            f"gpuhook: warning: gpu1 (GPU 1): {mps.root}/gpu1/{folder} is not a filesystem of the "
            "group's own (the daemon was started by an older gpuhook): restart it: gpuhook mps "
            "stop gpu1 && gpuhook mps start gpu1\n"
        ) in again.stderr

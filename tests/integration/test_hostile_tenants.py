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
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests import hostile_elf
from tests.conftest import Containers
from tests.integration.test_mps import Mps, mnode, mps  # noqa: F401

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

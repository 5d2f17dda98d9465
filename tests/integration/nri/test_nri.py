"""gpuhook as an NRI plugin of containerd 2.3.4 (the daemon and the plugin: conftest.py), with
no gpuhook runtime registered: containerd runs plain runc, and whatever GPU a container gets
comes from the plugin's adjustment of the spec containerd built.

Each test is a pod as the kubelet runs it (the device plugin's allocation in the kubelet's
checkpoint, RunPodSandbox, CreateContainer, StartContainer), then what the container sees
(ExecSync), what gpuhook recorded, and what containerd and the plugin logged.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import pytest

from tests.integration.cri.conftest import IMAGE, IMAGE_ALL, MPS_GPU
from tests.integration.cri.kubelet import Allocation, Pod
from tests.integration.nri.conftest import NriCri
from tests.integration.test_leak_matrix import gpus

pytestmark = [pytest.mark.slow, pytest.mark.root]


def envvar(nri: NriCri, uuid: str, container: str = "main") -> Allocation:
    """What NVIDIA's device plugin's Allocate answers with the envvar strategy (its default)."""
    return Allocation(container, "nvidia.com/gpu", (uuid,), envs={"NVIDIA_VISIBLE_DEVICES": uuid})


def grant(nri: NriCri, pod: Pod, *allocations: Allocation) -> tuple[Allocation, ...]:
    nri.allocate(*((pod, a) for a in allocations))
    return allocations


def test_the_plugin_registered_and_synchronized(nri: NriCri) -> None:
    log = nri.plugin.log.read_text()
    assert 'nri registered plugin="10-gpuhook"' in log
    assert 'nri configured runtime="containerd v2.3.4" request_timeout_ms=2000' in log
    assert "nri synchronized containers=" in log
    assert nri.ctd.registrations() >= 1


def test_the_leak_pod_gets_no_gpu(nri: NriCri) -> None:
    """Image env NVIDIA_VISIBLE_DEVICES=all, nothing allocated to the pod: no GPU node, the
    env says void, the record says refused and why."""
    nri.allocate((Pod(name="other"), envvar(nri, nri.uuid(0))))
    with nri.pod(Pod()) as pod:
        cid = pod.container(image=IMAGE_ALL)
        seen = pod.probe(cid)
        env = pod.process_env(cid)
        record = nri.record(cid)
        spec = nri.spec(cid)
    assert seen["dev"] == []
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert record["decision"]["refused"] is True
    assert (
        "no GPU resource is allocated to pod ml/trainer" in record["decision"]["reasons"][0]["why"]
    )
    assert "gpuhook" not in spec["process"]["args"][0]  # plain runc: no gpuhook runtime
    assert not [d for d in spec["linux"].get("devices", []) if "nvidia" in d["path"]]


def test_an_allocated_pod_gets_exactly_its_gpu(nri: NriCri) -> None:
    p = Pod()
    with nri.pod(p) as pod:
        cid = pod.container(image=IMAGE_ALL, allocations=grant(nri, p, envvar(nri, nri.uuid(1))))
        seen = pod.probe(cid)
        env = pod.process_env(cid)
        exec_env = pod.exec_env(cid)
        record = nri.record(cid)
    assert seen["dev"] == gpus(1)
    assert env["NVIDIA_VISIBLE_DEVICES"] == exec_env["NVIDIA_VISIBLE_DEVICES"] == nri.uuid(1)
    name = nri.node.truth["gpus"][1]["name"]
    assert seen["smi"] == [f"GPU 0: {name} (UUID: {nri.uuid(1)})", "rc=0"]
    # gpuhook's createContainer hook ran (NRI added it): the driver's libraries are in the cache
    assert any(line.startswith("libcuda.so.1 ") for line in seen["ldconfig"]), seen["ldconfig"]
    assert record["decision"]["refused"] is False
    assert record["kubernetes"]["pod_uid"] == p.uid


def test_a_mig_device(nri: NriCri) -> None:
    mig = nri.node.truth["gpus"][6]["mig_devices"][1]
    p = Pod()
    with nri.pod(p) as pod:
        cid = pod.container(allocations=grant(nri, p, envvar(nri, mig["uuid"])))
        seen = pod.probe(cid)
        env = pod.process_env(cid)
    caps = sorted(c["path"] for c in mig["caps_nodes"])
    assert seen["dev"] == sorted([*gpus(6), "/dev/nvidia-caps", *caps])
    assert env["NVIDIA_VISIBLE_DEVICES"] == mig["uuid"]


def test_a_container_without_a_request_is_left_alone(nri: NriCri) -> None:
    with nri.pod(Pod()) as pod:
        cid = pod.container(image=IMAGE)
        seen = pod.probe(cid)
        out = nri.gpuhook("inspect", "container", cid)
    assert seen["dev"] == []
    assert out.returncode != 0  # no GPU marker: no record, as the shim keeps none


def _wait(predicate: Callable[[], bool], what: str, nri: NriCri, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what + nri.why()
        time.sleep(0.1)


def test_synchronize_rebuilds_the_records_of_running_containers(nri: NriCri) -> None:
    """The plugin restarted while a GPU container runs and its record is lost: Synchronize
    writes it again; a record of a container containerd no longer has is removed."""
    p = Pod()
    with nri.pod(p) as pod:
        cid = pod.container(allocations=grant(nri, p, envvar(nri, nri.uuid(5))))
        folder = Path(nri.record(cid)["bundle"])
        stale = folder.parent / ("f" * 64)
        nri.plugin.kill()
        shutil.rmtree(folder)
        shutil.copytree(folder.parent, stale, dirs_exist_ok=True)
        before = nri.ctd.registrations()
        nri.plugin.start(wait=False)
        nri.plugin.wait_registered(before)
        _wait(lambda: (folder / "gpuhook-decision.json").exists(), "no record rebuilt", nri)
        record = nri.record(cid)
    assert record["decision"]["devices"][0]["uuid"] == nri.uuid(5)
    assert not stale.exists()
    assert "records_rebuilt=1" in nri.plugin.log.read_text()


def test_reconnects_after_a_containerd_restart(nri: NriCri) -> None:
    before = nri.ctd.registrations()
    nri.ctd.restart()
    nri.plugin.wait_registered(before)
    p = Pod()
    with nri.pod(p) as pod:
        seen = pod.probe(pod.container(allocations=grant(nri, p, envvar(nri, nri.uuid(3)))))
    assert seen["dev"] == gpus(3)
    assert "the engine closed the NRI connection" in nri.plugin.log.read_text()


def test_creates_are_refused_while_the_plugin_is_down_and_resume(nri: NriCri) -> None:
    """NRI's default validator requires the plugin: killed, a create fails with containerd's
    line; restarted, the next create gets its GPU."""
    closed = nri.ctd.closings()
    nri.plugin.kill()
    _wait(lambda: nri.ctd.closings() > closed, "containerd did not see the plugin go", nri)
    p = Pod()
    with nri.pod(p) as pod:
        allocations = grant(nri, p, envvar(nri, nri.uuid(1)))
        with pytest.raises(grpc.RpcError) as refused:
            pod.container(image=IMAGE_ALL, allocations=allocations)
        nri.plugin.start()
        seen = pod.probe(pod.container(image=IMAGE_ALL, allocations=allocations))
    assert 'required plugin "gpuhook" not present' in str(refused.value)
    assert seen["dev"] == gpus(1)


def test_a_plugin_killed_and_restarted_under_a_create_loop_never_leaks(nri: NriCri) -> None:
    """Creates of a leak pod and an allocated pod while the plugin is killed and restarted:
    every create is refused or gets at most its allocation, and creates resume."""
    p, leak = Pod(name="allocated"), Pod(name="leak")
    allocations = grant(nri, p, envvar(nri, nri.uuid(4)))
    stop = threading.Event()

    def flap() -> None:
        while not stop.is_set():
            time.sleep(0.7)
            nri.plugin.kill()
            time.sleep(0.7)
            nri.plugin.start(wait=False)

    outcomes: list[tuple[str, list[str]]] = []
    flapper = threading.Thread(target=flap, daemon=True)
    flapper.start()
    try:
        with nri.pod(p) as granted, nri.pod(leak) as leaking:
            for i in range(10):
                pod, owed = (granted, gpus(4)) if i % 2 else (leaking, [])
                try:
                    cid = pod.container(name=f"c{i}", image=IMAGE_ALL,
                                        allocations=allocations if owed else ())  # fmt: skip
                except grpc.RpcError as exc:
                    outcomes.append(("refused", [str(exc.details())]))
                    continue
                seen = pod.probe(cid)["dev"]
                assert seen in (owed, []), (i, seen)  # never more than allocated
                outcomes.append(("created", seen))
    finally:
        stop.set()
        flapper.join(10)
    nri.plugin.kill()
    nri.plugin.start()
    with nri.pod(p) as pod:
        seen = pod.probe(pod.container(allocations=allocations))
    assert seen["dev"] == gpus(4), outcomes
    assert any(o == "refused" for o, _ in outcomes), outcomes


PCT = "gpuhook.io/mps-active-thread-percentage"
MIB = 1 << 20


@pytest.fixture
def mps(nri: NriCri) -> Iterator[NriCri]:
    out = nri.gpuhook("mps", "start")
    assert out.returncode == 0, out.stderr
    yield nri
    nri.gpuhook("mps", "stop")


def test_mps_limits_in_the_container_and_in_an_exec(mps: NriCri) -> None:
    """The MPS-shared GPU, a gpuhook.io/* pod annotation (NRI hands the pod's annotations; no
    containerd pod_annotations setting): the container's process and an ExecSync'd process
    have the pipe folder and the limits, with no exec-env marker (the adjustment is part of the
    spec containerd stores), and MPS admission counts the container until it stops, across a
    plugin restart (Synchronize)."""
    p = Pod(annotations={PCT: "30"})
    with mps.pod(p) as pod:
        cid = pod.container(allocations=grant(mps, p, envvar(mps, mps.uuid(MPS_GPU))))
        env = pod.process_env(cid)
        exec_env = pod.exec_env(cid)
        seen = pod.probe(cid)
        running = mps.record(cid)["runtime"]
        assert mps.plugin.proc is not None
        first = mps.plugin.proc.pid
        mps.plugin.kill()  # a new plugin counts the running client again when it synchronizes
        mps.plugin.start()
        _wait(lambda: mps.record(cid)["runtime"].get("creator", {}).get("pid") != first,
              "the restarted plugin did not take over the record", mps)  # fmt: skip
        restarted = mps.record(cid)["runtime"]
        mps.client.stop_container(cid)
        stopped = mps.record(cid)["runtime"]
    share = int(mps.node.truth["gpus"][MPS_GPU]["memory"]) // 2 // MIB
    limits = {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/gpuhook/mps/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={share}M",
    }
    assert seen["dev"] == gpus(MPS_GPU)
    assert {k: v for k, v in env.items() if k.startswith("CUDA_MPS_")} == limits
    assert {k: v for k, v in exec_env.items() if k.startswith("CUDA_MPS_")} == limits
    assert mps.plugin.proc is not None
    assert running["creator"]["pid"] == first  # counted while it runs
    assert restarted["creator"]["pid"] == mps.plugin.proc.pid  # and after a plugin restart
    assert "creator" not in stopped


def test_inspect_pod_explains_each_container(nri: NriCri) -> None:
    """A pod with an allocated container and one whose image says all: `gpuhook inspect pod`
    shows both decisions and why, from the plugin's records."""
    p = Pod(name="explained", namespace="team-a")
    with nri.pod(p) as pod:
        main = pod.container(image=IMAGE_ALL, allocations=grant(nri, p, envvar(nri, nri.uuid(1))))
        side = pod.container(name="side", image=IMAGE_ALL)
        out = nri.gpuhook("inspect", "pod", "team-a/explained", "-o", "table")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"Pod team-a/explained (uid {p.uid})"
    granted = next(line for line in lines if main[:12] in line)
    refused = next(line for line in lines if side[:12] in line)
    assert "env" in granted and "granted 1" in granted and "verified against the kub" in granted
    assert "refused" in refused and "no GPU resource is allocated" in refused


def test_doctor_says_the_node_is_in_nri_mode(nri: NriCri) -> None:
    out = nri.gpuhook("doctor", "--containerd-config", str(nri.ctd.config), "-o", "json")
    checks = {c["check"]: c for c in json.loads(out.stdout)["checks"]}
    assert nri.plugin.proc is not None
    assert checks["nri"]["status"] == "pass", checks["nri"]
    assert checks["nri"]["message"] == (
        f"plugin 10-gpuhook (pid {nri.plugin.proc.pid}) on {nri.ctd.nri_socket}; "
        "containerd requires it (fail closed)"
    )
    assert checks["containerd"]["status"] == "pass"
    assert checks["containerd"]["message"].startswith("NRI mode: gpuhook's NRI plugin 10-gpuhook")

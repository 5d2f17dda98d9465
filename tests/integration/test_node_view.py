"""`gpuhook inspect node --usage` and `gpuhook metrics serve` on a fake node with real runc
containers: NVML (tools/fakenode/fake_nvml_procs.c) lists the host pids of processes in a
granted pod container, in a refused one, in a container created without gpuhook, in an MPS
client container, and of a host process; the view and the metrics name each one's pod or host
command line, and catch every unexpected user."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import testbed
import yaml

from gpuhook.runtime import wire
from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.integration.test_k8s_trust import kubelet
from tests.integration.test_leak_matrix import write_checkpoint
from tests.integration.test_mps import Mps
from tests.runtime_service import dispatcher_script

pytestmark = [pytest.mark.slow, pytest.mark.root]

MIB = 1 << 20
SLEEP = ("/bin/sleep", "600")


class Scene:
    """The node, its config, the containers (id -> host pid) and the host process."""

    def __init__(self, node: FakeNode, env: dict[str, str], box: Containers, tag: str) -> None:
        self.node, self.env, self.box, self.tag = node, env, box, tag
        self.pids: dict[str, int] = {}
        self.ids: dict[str, str] = {}
        self.host: subprocess.Popen[bytes] | None = None

    def uuid(self, dev: str) -> str:
        gpu, _, mig = dev.partition(":")
        g = self.node.truth["gpus"][int(gpu)]
        return str(g["mig_devices"][int(mig)]["uuid"] if mig else g["uuid"])

    def start(self, name: str, *, runtime: str = testbed.RUNTIME, **shape: Any) -> None:
        """A long-running container, created through ``runtime`` (gpuhook-runtime, else plain
        runc or a dispatcher of the runtime service)."""
        bundle = self.box.bundle(args=SLEEP, **shape)
        cid = f"{self.tag}-{name}"
        _, code, err = self.box.create(bundle, self.env, cid, runtime=runtime)
        assert code == 0, err
        assert self.box.runc("start", cid).returncode == 0
        state = json.loads(self.box.runc("state", cid).stdout)
        self.ids[name], self.pids[name] = cid, int(state["pid"])

    def nvml(self, lines: list[tuple[str, str, str, int]]) -> None:
        """What the fake NVML lists: (type, device, process name, MiB)."""
        path = Path(self.node.truth["nvml_data"] + ".procs")
        text = "".join(
            f"{kind} {self.uuid(dev)} {self.pid(who)} {mib * MIB}\n"
            for kind, dev, who, mib in lines
        )
        path.write_text(text)

    def pid(self, who: str) -> int:
        if who == "host":
            assert self.host is not None
            return self.host.pid
        return self.pids[who]

    def usage(self) -> tuple[int, dict[str, Any]]:
        out = self.node.gpuhook("inspect", "node", "--usage", "-o", "json", env=self.env)
        assert out.returncode in (0, 3), out.stderr
        return out.returncode, json.loads(out.stdout)


@pytest.fixture(scope="module")
def scene(
    fake_node_factory: Any,
    tmp_path_factory: pytest.TempPathFactory,
    rootfs_template: str,
    spec_template: dict[str, Any],
) -> Iterator[Scene]:
    node: FakeNode = fake_node_factory("--gpus", "3", "--mig-gpus", "2", "--mig-devices", "2")
    node.refresh()
    base = tmp_path_factory.mktemp("view")
    tag = uuidlib.uuid4().hex[:8]
    uid = f"uid-{tag}"
    root = kubelet(base, uid=uid)
    checkpoint = root / "device-plugins" / "kubelet_internal_checkpoint"
    write_checkpoint(checkpoint, [(uid, "main", [node.truth["gpus"][0]["uuid"]])])
    mps = Mps(node, base / "mps")
    mps.env = node.variant(
        base,
        mps={"root": str(mps.root), "gpus": [1], "replicas": 2},
        state_dir=str(base / "state"),
        policy={"kubernetes": {"kubelet_dir": str(root)}},
    )
    mps.start()
    box = Containers(base, rootfs_template, spec_template)
    s = Scene(node, mps.env, box, tag)
    pod = {"uid": uid, "name": f"trainer-{tag}", "namespace": "ml"}
    try:
        all_gpus = ["NVIDIA_VISIBLE_DEVICES=all"]
        s.start("main", env=all_gpus, annotations=f.k8s(**pod))  # granted GPU 0
        s.start("init", env=all_gpus, annotations=f.k8s(container="init", **pod))  # refused
        s.start("mps", env=["NVIDIA_VISIBLE_DEVICES=1"])  # an MPS client of group gpu1
        s.start("rogue", runtime="runc", privileged=True)  # no record
        s.host = subprocess.Popen(["sleep", "600"])
        yield s
    finally:
        if s.host is not None:
            s.host.kill()
            s.host.wait()
        for cid in s.ids.values():
            box.runc("delete", "-f", cid)
        Path(node.truth["nvml_data"] + ".procs").unlink(missing_ok=True)
        mps.cleanup()


FULL = [
    ("compute", "0", "main", 1000),
    ("compute", "0", "init", 300),
    ("compute", "2:0", "main", 20),  # a device the pod container was not granted
    ("graphics", "2:0", "host", 5),
    ("compute", "2:1", "rogue", 64),
    ("mps", "1", "mps", 512),
]


def test_the_view_names_each_process_and_catches_the_unexpected(scene: Scene) -> None:
    scene.nvml(FULL)
    code, view = scene.usage()
    assert code == 3  # unexpected users: the exit status says so
    devices = {d["id"]: d for d in view["devices"]}
    pod = f"ml/trainer-{scene.tag}"

    (granted,) = devices["0"]["granted"]
    assert (granted["container_id"], granted["pod"], granted["container"]) == (
        scene.ids["main"], pod, "main"
    )  # fmt: skip
    assert granted["channel"] == "env" and granted["state"] == "running"
    procs = {p["pid"]: p for p in devices["0"]["processes"]}
    main, init = procs[scene.pids["main"]], procs[scene.pids["init"]]
    assert (main["pod"], main["container_name"], main["expected"]) == (pod, "main", True)
    assert main["used_memory"] == 1000 * MIB and main["command"] == "/bin/sleep 600"
    assert (init["pod"], init["container_name"], init["expected"]) == (pod, "init", False)
    assert init["why"].startswith("its create was refused a GPU: ")

    (mps_grant,) = devices["1"]["granted"]
    assert mps_grant["mps"]["group"] == "gpu1" and mps_grant["mps"]["pinned_memory_limit"] > 0
    (client,) = view["mps_clients"]["gpu1"]
    assert (client["pid"], client["container_id"], client["expected"]) == (
        scene.pids["mps"], scene.ids["mps"], True
    )  # fmt: skip

    unexpected = {(u["device"], u["pid"]): u for u in view["unexpected"]}
    assert sorted(unexpected) == sorted(
        [
            ("0", scene.pids["init"]),
            ("2:0", scene.pids["main"]),
            ("2:0", scene.pid("host")),
            ("2:1", scene.pids["rogue"]),
        ]
    )
    assert unexpected[("2:0", scene.pids["main"])]["why"].startswith("not granted this device")
    host = unexpected[("2:0", scene.pid("host"))]
    assert (host["owner"], host["command"]) == ("host", "sleep 600")
    rogue = unexpected[("2:1", scene.pids["rogue"])]
    assert (rogue["owner"], rogue["container_id"]) == ("unrecorded-container", scene.ids["rogue"])
    assert view["unexpected_count"] == 4

    table = scene.node.gpuhook("inspect", "node", "--usage", "-o", "table", env=scene.env)
    assert table.returncode == 3
    assert "unexpected GPU users: 4" in table.stdout
    assert f"pod {pod}/init (container {scene.ids['init'][:12]})  UNEXPECTED" in table.stdout
    assert table.stderr.strip() == (
        "gpuhook: 4 unexpected GPU user(s): a process on a GPU gpuhook did not grant to its "
        "container (see 'unexpected' above)"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(url: str, proc: subprocess.Popen[bytes]) -> str:
    import urllib.request

    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 (http only)
                return str(resp.read().decode())
        except OSError:
            assert proc.poll() is None, "gpuhook metrics serve exited"
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)  # type: ignore[no-untyped-call]
        for s in family.samples
    }


def test_the_metrics_endpoint(
    scene: Scene, runtime_service: Callable[..., Any], tmp_path: Path
) -> None:
    # one more create, decided by the runtime service: driver files only
    socket_path = Path(yaml.safe_load(scene.node.config.read_text())["runtime"]["service"])
    svc = runtime_service(scene.node.env, socket=socket_path, from_config=True)
    through_service = dispatcher_script(tmp_path / "gpuhook-runtime", svc.socket, tmp_path / "r")
    scene.start("svc", runtime=str(through_service), env=["NVIDIA_VISIBLE_DEVICES=none"])
    assert (tmp_path / "r").read_bytes().startswith(wire.EXEC)  # the service decided it
    scene.nvml(FULL)
    port = _free_port()
    cmd = [testbed.GPUHOOK, "metrics", "serve", "--listen", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(cmd, env={**os.environ, **scene.env}, stdout=subprocess.DEVNULL)
    try:
        got = _samples(_scrape(f"http://127.0.0.1:{port}/metrics", proc))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    # three creates decided by a Python process of their own (one refused), one by the service
    creates = {
        (dict(k[1])["decision"], dict(k[1])["channel"], dict(k[1])["path"]): v
        for k, v in got.items()
        if k[0] == "gpuhook_container_creates_total"
    }
    assert creates == {
        ("granted", "env", "python"): 2,
        ("refused", "env", "python"): 1,
        ("driver-only", "env", "service"): 1,
    }
    assert value("gpuhook_container_refusals_total", kind="not-allocated", channel="env") == 1
    for path, count in (("python", 3), ("service", 1)):
        assert value("gpuhook_create_decision_seconds_count", path=path) == count
        assert value("gpuhook_create_decision_seconds_bucket", path=path, le="+Inf") == count
        assert value("gpuhook_create_decision_seconds_sum", path=path) > 0

    uuid0, uuid1 = scene.uuid("0"), scene.uuid("1")
    assert value("gpuhook_gpu_processes", gpu="0", uuid=uuid0) == 2
    assert value("gpuhook_gpu_process_memory_bytes", gpu="0", uuid=uuid0) == 1300 * MIB
    assert value("gpuhook_gpu_unexpected_users", gpu="0", uuid=uuid0) == 1
    assert value("gpuhook_gpu_unexpected_users", gpu="2:0", uuid=scene.uuid("2:0")) == 2
    assert value("gpuhook_gpu_unexpected_users", gpu="2:1", uuid=scene.uuid("2:1")) == 1
    assert value("gpuhook_gpu_unexpected_users", gpu="1", uuid=uuid1) == 0
    pod = {"namespace": "ml", "pod": f"trainer-{scene.tag}"}
    assert value("gpuhook_pod_gpu_processes", **pod, container="main", gpu="0") == 1
    assert value("gpuhook_pod_gpu_memory_bytes", **pod, container="main", gpu="0") == 1000 * MIB
    assert value("gpuhook_pod_gpu_memory_bytes", **pod, container="init", gpu="0") == 300 * MIB

    record = json.loads((scene.box.base / "state").joinpath(  # the MPS client's record
        "containers", f"{scene.ids['mps']}.json").read_text())  # fmt: skip
    reserved = record["mps"]["pinned_memory_limits"][0]["reserved"]
    total = int(scene.node.truth["gpus"][1]["memory"])
    assert reserved > 0
    assert value("gpuhook_mps_reserved_bytes", group="gpu1", gpu="1", uuid=uuid1) == reserved
    assert value("gpuhook_mps_free_bytes", group="gpu1", gpu="1", uuid=uuid1) == total - reserved
    assert value("gpuhook_mps_client_containers", group="gpu1") == 1

    assert value("gpuhook_inventory_age_seconds") >= 0
    assert value("gpuhook_inventory_fresh") == 1
    assert value("gpuhook_nvml_up") == 1
    # the service listens on the socket of the config the metrics read (the node's)
    assert value("gpuhook_runtime_service_up", socket=str(svc.socket)) == 1


def test_a_stopped_container_leaves_the_view(scene: Scene) -> None:
    """Run last in this module: it stops the pod's containers. With only the MPS client left on
    a GPU, nothing is unexpected and the exit status is 0."""
    for name in ("main", "init", "rogue"):
        assert scene.box.runc("kill", scene.ids[name], "KILL").returncode == 0
    deadline = time.monotonic() + 30
    while any(scene.box.status(scene.ids[n]) != "stopped" for n in ("main", "init", "rogue")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    scene.nvml([("mps", "1", "mps", 512)])  # NVML no longer lists the dead processes
    code, view = scene.usage()
    devices = {d["id"]: d for d in view["devices"]}
    assert devices["0"]["granted"] == [] and devices["0"]["processes"] == []
    assert [g["container_id"] for g in devices["1"]["granted"]] == [scene.ids["mps"]]
    assert (code, view["unexpected"]) == (0, [])


def test_the_installer_runs_and_restarts_the_metrics_process(
    fake_node_factory: Any, tmp_path: Path
) -> None:
    """What `gpuhook node install --metrics-listen` runs beside the DaemonSet's wait: the
    installed gpuhook's `metrics serve`, chrooted into the host root (here: /, this checkout's
    gpuhook), restarted when it exits, stopped with SIGTERM."""
    from gpuhook.node import host
    from gpuhook.node.metrics import MetricsChild

    node: FakeNode = fake_node_factory("--gpus", "1")
    node.refresh()
    port = _free_port()
    env = {**host.HOST_ENV, "GPUHOOK_CACHE_DIR": os.environ["GPUHOOK_CACHE_DIR"]}
    child = MetricsChild("/", testbed.GPUHOOK, str(node.config), f"127.0.0.1:{port}", env)
    try:
        assert child.ensure().startswith(f"metrics on 127.0.0.1:{port} (pid ")
        assert child.proc is not None
        first = child.proc
        text = _scrape(f"http://127.0.0.1:{port}/metrics", first)
        assert 'gpuhook_gpu_processes{gpu="0"' in text
        assert child.ensure() == ""  # running: nothing to do
        first.kill()
        first.wait()
        again = child.ensure()
        assert again.endswith(f"(it exited with {first.returncode})"), again
        assert child.proc is not first
        _scrape(f"http://127.0.0.1:{port}/metrics", child.proc)
    finally:
        child.stop()
    assert child.proc is not None and child.proc.returncode == 0  # SIGTERM: a clean stop

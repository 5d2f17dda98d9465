"""A real kubelet on the fake GPU node: standalone (static pods), on a private containerd whose
config gpuhook registered (``gpuhook runtime configure --runtime containerd --set-as-default``),
with device plugins of this suite (deviceplugin.py) for each of NVIDIA's strategies. The
containerd is Debian's 1.6, then containerd 2.x (``cluster`` is parametrized by engine).

One kubelet per module. Before it starts: the kubelet binary must be at ../shared/k8s/kubelet (a
one-line failure otherwise), no other kubelet may use /var/lib/kubelet/device-plugins (a lock on
the binary and a check of the kubelet socket), and the host's side is recorded (host.py). At the
end every process started here is stopped by its pid, the host is put back and compared with the
record: anything left is an error of the suite.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import testbed
import yaml

from tests.conftest import REPO, FakeNode, _deep_update, mps_daemons_under
from tests.integration import engines
from tests.integration.cri import client as cri_client
from tests.integration.cri.daemon import (
    ENGINES,
    build_images,
    kill_shims,
    private_config,
    register,
    runc_root,
)
from tests.integration.kubelet import deviceplugin, host
from tests.integration.kubelet.deviceplugin import Plugin, Resource
from tests.integration.kubelet.kubelet import Kubelet, Pod, locate

CHECKPOINT = deviceplugin.PLUGIN_DIR / "kubelet_internal_checkpoint"
GPU = "nvidia.com/gpu"  # envvar, GPUs 0 and 1
MOUNTS = "nvidia.com/gpu.mounts"  # volume-mounts, GPU 3
CDI = "nvidia.com/gpu.cdi"  # cdi-annotations, GPU 4
SHARED = "nvidia.com/gpu.shared"  # time-slicing: GPU 5, 4 replicas, envvar
MPS = "nvidia.com/gpu.mps"  # MPS: GPU 2 (gpuhook's mps.gpus), 2 replicas, envvar
MPS_GPU = 2
LOCK_TIMEOUT = 600.0
LAYOUT = (
    (GPU, (0, 1), "envvar", 0),
    (MOUNTS, (3,), "volume-mounts", 0),
    (CDI, (4,), "cdi-annotations", 0),
    (SHARED, (5,), "envvar", 4),
    (MPS, (MPS_GPU,), "envvar", 2),
)


class Cluster:
    """The node's kubelet, its device plugins, the CRI runtime and gpuhook's config."""

    def __init__(self, node: FakeNode, root: Path, engine: str = ENGINES[0]) -> None:
        self.engine = engine  # one of ENGINES
        self.node = node
        self.root = root
        self.config = root / "gpuhook.yaml"
        self.env = {**node.env, "GPUHOOK_CONFIG": str(self.config)}
        self.daemon: engines.Containerd | None = None
        self.kubelet: Kubelet | None = None
        self.cri: cri_client.CriClient | None = None
        self.plugins: dict[str, Plugin] = {}
        # A device plugin's /var/run/cdi (NVIDIA's writes its spec there): on containerd 2.x's
        # CDI spec dirs, as a real node's /var/run/cdi is, and nowhere on the host's.
        self.plugin_cdi = root / "plugin-cdi"

    def uuid(self, index: int) -> str:
        return str(self.node.truth["gpus"][index]["uuid"])

    def gpuhook(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.node.gpuhook(*args, env=self.env)

    @contextmanager
    def configured(self, **sections: Any) -> Iterator[None]:
        """gpuhook's config with ``sections`` merged in, for the block (the runtime reads it
        at each create; replaced atomically both ways)."""
        original = self.config.read_text()
        data = yaml.safe_load(original)
        _deep_update(data, sections)
        replace(self.config, yaml.safe_dump(data))
        try:
            yield
        finally:
            replace(self.config, original)

    @property
    def k(self) -> Kubelet:
        assert self.kubelet is not None
        return self.kubelet

    @property
    def runtime(self) -> cri_client.CriClient:
        assert self.cri is not None
        return self.cri

    # --- pods -------------------------------------------------------------------------------

    @contextmanager
    def running(self, *pods: Pod) -> Iterator[None]:
        """The pods' manifests in the static pod folder for the block; then deleted, and the
        block ends when the kubelet has torn them down."""
        for pod in pods:
            self.k.add(pod)
        try:
            yield
        finally:
            for pod in pods:
                self.k.delete(pod)
            self.wait_gone(*pods)

    def wait_gone(self, *pods: Pod) -> None:
        """Until the kubelet has removed each pod's folder and the runtime runs nothing of it."""
        deadline = time.monotonic() + 120
        while left := [p.full_name for p in pods if not self.gone(p)]:
            if time.monotonic() > deadline:
                raise AssertionError(f"pods {left} were not torn down{self.k.tail()}")
            time.sleep(0.5)

    def gone(self, pod: Pod) -> bool:
        labels = {"io.kubernetes.pod.name": pod.full_name}
        api = self.runtime.api
        live = [
            c
            for c in self.runtime.list_containers(labels)
            if c.state in (api.CONTAINER_CREATED, api.CONTAINER_RUNNING)
        ]
        ready = [s for s in self.runtime.list_pod_sandboxes(labels) if s.state == api.SANDBOX_READY]
        uid = self.k.pod_uid(pod)
        folder = uid is not None and (self.k.root_dir / "pods" / uid).exists()
        return not live and not ready and not folder

    def container_id(self, pod: Pod, name: str = "main") -> str:
        """The running container ``name`` of the pod (CRI ListContainers)."""
        labels = {"io.kubernetes.pod.name": pod.full_name, "io.kubernetes.container.name": name}
        running = [
            c.id
            for c in self.runtime.list_containers(labels)
            if c.state == self.runtime.api.CONTAINER_RUNNING
        ]
        assert len(running) == 1, (pod.full_name, name, running)
        return str(running[0])

    def exec_env(self, container_id: str) -> dict[str, str]:
        """The env of a process started in the container by CRI ExecSync (`kubectl exec`)."""
        out = self.runtime.exec_sync(container_id, ["/bin/env"])
        assert out.exit_code == 0, (out.exit_code, out.stderr)
        text = out.stdout.decode()
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def checkpoint(self, pod: Pod) -> list[dict[str, Any]]:
        """The kubelet's checkpoint entries of the pod (PodDeviceEntries is null until the
        first allocation)."""
        doc = json.loads(CHECKPOINT.read_text())
        uid = self.k.pod_uid(pod)
        return [e for e in doc["Data"]["PodDeviceEntries"] or () if e["PodUID"] == uid]

    def explain(self, pod: Pod) -> subprocess.CompletedProcess[str]:
        """`gpuhook inspect pod` as a table (its records are in the bundles of the pod's live
        containers, so ask while they run; the tests read it after what the containers saw)."""
        return self.gpuhook("inspect", "pod", pod.ref, "--output", "table")

    def records(self, pod: Pod) -> list[dict[str, Any]]:
        out = self.gpuhook("inspect", "pod", pod.ref, "--output", "json")
        assert out.returncode == 0, out.stderr
        records: list[dict[str, Any]] = json.loads(out.stdout)["containers"]
        return records

    def allocations(self, resource: str) -> list[deviceplugin.Allocated]:
        return self.plugins[resource].allocations()


def replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_config(cluster: Cluster) -> None:
    """gpuhook's config: the node's, with the suite's own state folder (records, inventory),
    the kubelet's folder (its default, /var/lib/kubelet) and MPS on GPU 2 (2 replicas)."""
    data = yaml.safe_load(cluster.node.config.read_text())
    _deep_update(
        data,
        {
            "state_dir": str(cluster.root / "gpuhook-state"),
            "policy": {"kubernetes": {"kubelet_dir": "/var/lib/kubelet", "checkpoint": ""}},
            "mps": {"root": str(cluster.root / "mps"), "gpus": [MPS_GPU], "replicas": 2},
        },
    )
    replace(cluster.config, yaml.safe_dump(data))
    out = cluster.gpuhook("inventory", "refresh")
    assert out.returncode == 0, out.stderr


def registered(cluster: Cluster) -> bool:
    """Whether the kubelet's checkpoint lists every device of every plugin."""
    try:
        doc = json.loads(CHECKPOINT.read_text())
    except (OSError, ValueError):
        return False
    devices = doc["Data"].get("RegisteredDevices") or {}
    return all(
        sorted(devices.get(name) or []) == sorted(p.resource.device_ids())
        for name, p in cluster.plugins.items()
    )


def start(cluster: Cluster, binary: Path, rootfs: str, scratch: Path, bin_dir: Path | None) -> None:
    root = cluster.root
    write_config(cluster)
    config = root / "config.toml"
    cluster.plugin_cdi.mkdir()
    config.write_text(private_config(root, bin_dir, cluster.node.config, [str(cluster.plugin_cdi)]))
    out = cluster.node.gpuhook(*register(config, bin_dir, testbed.RUNTIME))
    assert out.returncode == 0, out.stderr
    env = engines.daemon_env(str(cluster.config))
    cluster.daemon = engines.Containerd(root, config, env, bin_dir)
    build_images(cluster.daemon, rootfs, scratch)
    cluster.cri = cri_client.CriClient(cluster.daemon.socket, cri_client.compile_api(scratch))
    out = cluster.gpuhook("mps", "start")
    assert out.returncode == 0, out.stderr
    host.make_cgroup(root.name)
    cluster.kubelet = Kubelet(binary, root, cluster.daemon.socket, root.name)
    cluster.kubelet.launch(ready=deviceplugin.KUBELET_SOCKET)
    api = deviceplugin.compile_api(scratch / "deviceplugin")
    for name, gpus, strategy, replicas in LAYOUT:
        uuids = tuple(cluster.uuid(i) for i in gpus)
        plugin = Plugin(api, Resource(name, uuids, strategy, replicas))
        cluster.plugins[name] = plugin
        plugin.register()
    deadline = time.monotonic() + 60
    while not registered(cluster):
        assert time.monotonic() < deadline, f"device plugins not registered{cluster.k.tail()}"
        time.sleep(0.3)


def stop(cluster: Cluster) -> list[str]:
    """Stop everything started (by pid), in order; what is left running, one line each."""
    left = []
    if cluster.kubelet is not None:
        for name in cluster.kubelet.static_pods():
            (cluster.kubelet.manifests / f"{name}.json").unlink()
        cluster.kubelet.stop()
    for plugin in cluster.plugins.values():
        plugin.stop()
    cluster.gpuhook("mps", "stop")
    if cluster.cri is not None:
        cluster.cri.close()
    state = runc_root(cluster.root)
    if state.exists():  # containers of a failed test: their init processes, by runc's record
        for cid in os.listdir(state):
            subprocess.run(["runc", "--root", str(state), "delete", "-f", cid], check=False)
            left.append(f"container {cid} (deleted)")
    if cluster.daemon is not None:
        cluster.daemon.stop()
        left += [f"containerd shim {pid} (killed)" for pid in kill_shims(cluster.daemon.socket)]
    for pid in mps_daemons_under(cluster.root):
        os.kill(pid, 9)
        left.append(f"MPS daemon {pid} (killed)")
    procs = [d.proc for d in (cluster.kubelet, cluster.daemon) if d is not None]
    for proc in procs:
        if proc is not None and proc.poll() is None:
            left.append(f"pid {proc.pid} still runs")
    return left


@contextmanager
def exclusive(binary: Path) -> Iterator[None]:
    """One kubelet at a time on this host (they would share /var/lib/kubelet/device-plugins):
    a lock on the kubelet binary (another session's suite is waited for) and no kubelet socket
    of another kubelet."""
    with open(binary, "rb") as fh:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test session runs {binary}", pytrace=False)
                time.sleep(1)
        if deviceplugin.KUBELET_SOCKET.exists():
            pytest.fail(
                f"{deviceplugin.KUBELET_SOCKET} exists: a kubelet runs on this host (or a "
                "crashed run left it); the suite needs the host's device plugin folder",
                pytrace=False,
            )
        yield


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "engines(*names): the containerds of ENGINES a kubelet test runs on (all)"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test of a module runs under a kubelet on containerd 1.6, then on containerd 2.x;
    a test marked ``engines(...)`` on those it names (what needs CDI: containerd 2.x)."""
    if "cluster" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("engines")
        names = marker.args if marker else ENGINES
        assert set(names) <= set(ENGINES), names
        metafunc.parametrize("cluster", names, indirect=True, scope="module")


@pytest.fixture(scope="module")
def cluster(
    request: pytest.FixtureRequest,
    node: FakeNode,
    rootfs_template: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    engine = request.param
    bin_dir = None if engine == ENGINES[0] else request.getfixturevalue("containerd2_bin")
    binary = kubelet_binary()
    with exclusive(binary):
        before = host.snapshot()
        root = engines.short_dir("gh-kubelet-")
        c = Cluster(node, root, engine)
        left: list[str] = []
        try:
            scratch = tmp_path_factory.mktemp("kubelet-build")
            start(c, binary, rootfs_template, scratch, bin_dir)
            yield c
        finally:
            left = stop(c)
            host.restore(before)
            host.unmount_under(root)
            host.remove_cgroup(root.name)
            mounts = host.mounts_under(root)
            cgroups = host.cgroups_left(root.name)
            engines.remove_tree(root)
        problems = host.differences(before, host.snapshot()) + left
        problems += [f"{m} is still mounted" for m in mounts]
        problems += [f"cgroup {g} is left" for g in cgroups]
        assert not problems, "the host is not as the suite found it:\n" + "\n".join(problems)


def kubelet_binary() -> Path:
    """../shared/k8s/kubelet, or a one-line failure (CI must never pass without it)."""
    binary = locate(REPO)
    if not binary.is_file():
        pytest.fail(
            f"no kubelet at {binary}: this suite runs the real kubelet from ../shared/k8s "
            "beside the clone",
            pytrace=False,
        )
    return binary

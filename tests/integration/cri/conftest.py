"""A private containerd driven through its CRI plugin, as the kubelet drives it: Debian's 1.6
and containerd 2.x (``cri`` is parametrized: every test runs on both).

The daemon (tests/integration/cri/daemon.py) has its own root, state, socket and config under a
short folder in /tmp, registered by ``gpuhook runtime configure --runtime containerd
--set-as-default``; its images are built locally and imported (nothing is pulled). gpuhook's
config points at the session's fake GPU node and at a kubelet folder in tmp, whose
device-manager checkpoint the tests write.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import testbed
import yaml

from tests.conftest import FakeNode, _deep_update, mps_daemons_under
from tests.integration import engines
from tests.integration.cri import client as cri_client
from tests.integration.cri import kubelet
from tests.integration.cri.daemon import (
    ENGINES,
    IMAGE,
    IMAGE_ALL,
    NS,
    SLEEP,
    build_images,
    kill_shims,
    private_config,
    register,
)

__all__ = ["ENGINES", "IMAGE", "IMAGE_ALL", "MPS_GPU", "NS", "Cri", "PodHandle"]

MPS_GPU = 2  # the MPS-shared GPU of the suite's config (2 replicas)


class Cri:
    """The daemon, a CRI client, the kubelet folder and gpuhook's config of the suite."""

    def __init__(
        self, node: FakeNode, root: Path, daemon: engines.Containerd, api: Any, engine: str
    ) -> None:
        self.engine = engine  # one of ENGINES
        self.node = node
        self.root = root
        self.daemon = daemon
        self.api = api
        self.client = cri_client.CriClient(daemon.socket, api)
        self.kubelet_dir = root / "kubelet"
        self.checkpoint = self.kubelet_dir / "device-plugins" / "kubelet_internal_checkpoint"
        self.config = root / "gpuhook.yaml"
        self.env = {**node.env, "GPUHOOK_CONFIG": str(self.config)}
        self.mps_root = root / "mps"

    # --- gpuhook's side ---------------------------------------------------------------------

    def configure(self, **sections: Any) -> None:
        """gpuhook's config: the node's, pointed at this suite's kubelet folder and MPS root,
        with ``sections`` merged in; replaced atomically (the runtime reads it per create)."""
        data = yaml.safe_load(self.node.config.read_text())
        _deep_update(
            data,
            {
                "policy": {"kubernetes": {"kubelet_dir": str(self.kubelet_dir), "checkpoint": ""}},
                "mps": {"root": str(self.mps_root), "gpus": [MPS_GPU], "replicas": 2},
            },
        )
        _deep_update(data, sections)
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(data))
        os.replace(tmp, self.config)

    def gpuhook(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.node.gpuhook(*args, env=self.env)

    def record(self, container_id: str) -> dict[str, Any]:
        out = self.gpuhook("inspect", "container", container_id, "--output", "json")
        assert out.returncode == 0, out.stderr
        record: dict[str, Any] = json.loads(out.stdout)
        return record

    def bundle(self, container_id: str) -> Path:
        """containerd's bundle of a live container (or sandbox): config.json, init.pid (the
        same path in 1.6 and 2.x)."""
        return self.root / "state" / "io.containerd.runtime.v2.task" / NS / container_id

    def spec(self, container_id: str) -> dict[str, Any]:
        """The OCI spec runc got: the bundle's config.json after gpuhook-runtime rewrote it."""
        spec: dict[str, Any] = json.loads((self.bundle(container_id) / "config.json").read_text())
        return spec

    def uuid(self, index: int) -> str:
        return str(self.node.truth["gpus"][index]["uuid"])

    def allocate(self, *allocations: tuple[kubelet.Pod, kubelet.Allocation]) -> None:
        kubelet.write_checkpoint(self.checkpoint, list(allocations))

    # --- the kubelet's side -----------------------------------------------------------------

    @contextmanager
    def pod(self, pod: kubelet.Pod, runtime_handler: str = "") -> Iterator[PodHandle]:
        config = kubelet.sandbox_config(self.api, pod, self.root / "logs")
        pod_id = self.client.run_pod_sandbox(config, runtime_handler)
        handle = PodHandle(self, pod, pod_id, config)
        try:
            yield handle
        finally:
            for cid in handle.containers:
                self.client.stop_container(cid)
                self.client.remove_container(cid)
            self.client.stop_pod_sandbox(pod_id)
            self.client.remove_pod_sandbox(pod_id)

    def why(self) -> str:
        return self.daemon.tail(30)


class PodHandle:
    """A running pod sandbox and the containers created in it."""

    def __init__(self, cri: Cri, pod: kubelet.Pod, pod_id: str, config: Any) -> None:
        self.cri = cri
        self.pod = pod
        self.id = pod_id
        self.config = config
        self.containers: list[str] = []

    def container(
        self,
        name: str = "main",
        image: str = IMAGE,
        allocations: tuple[kubelet.Allocation, ...] = (),
        command: tuple[str, ...] = tuple(SLEEP),
    ) -> str:
        """CreateContainer + StartContainer as the kubelet does; returns the container id."""
        cri = self.cri
        mounts = kubelet.pod_mounts(cri.api, cri.kubelet_dir, self.pod, name)
        config = kubelet.container_config(
            cri.api, self.pod, name, image, mounts, list(allocations), list(command)
        )
        cid = cri.client.create_container(self.id, config, self.config)
        self.containers.append(cid)
        cri.client.start_container(cid)
        return cid

    def exec(self, cid: str, *cmd: str) -> str:
        out = self.cri.client.exec_sync(cid, list(cmd))
        assert out.exit_code == 0, (out.exit_code, out.stderr, self.cri.why())
        return str(out.stdout.decode())

    def probe(self, cid: str) -> dict[str, Any]:
        """testbed's probe through ExecSync: the container's /dev/nvidia* nodes, ldconfig, smi
        (its env section is the exec'd process's env)."""
        return testbed.parse_probe(self.exec(cid, "/bin/sh", "-c", testbed.PROBE))

    def process_env(self, cid: str) -> dict[str, str]:
        """The env of the container's own process (pid 1 of its PID namespace)."""
        raw = self.exec(cid, "/bin/cat", "/proc/1/environ")
        return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)

    def exec_env(self, cid: str) -> dict[str, str]:
        """The env of a process started by ExecSync (`kubectl exec`, exec probes)."""
        raw = self.exec(cid, "/bin/env")
        return dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)


@pytest.fixture(scope="session", params=ENGINES)
def cri(
    request: pytest.FixtureRequest,
    node: FakeNode,
    rootfs_template: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cri]:
    """The daemon of each engine (containerd 1.6, then 2.x), registered by gpuhook."""
    bin_dir = None if request.param == ENGINES[0] else request.getfixturevalue("containerd2_bin")
    root = engines.short_dir("gh-cri-")
    daemon = None
    try:
        config = root / "config.toml"
        config.write_text(private_config(root, bin_dir, node.config))
        out = node.gpuhook(*register(config, bin_dir, testbed.RUNTIME))
        assert out.returncode == 0, out.stderr
        api = cri_client.compile_api(tmp_path_factory.mktemp("cri-api"))
        env = engines.daemon_env(str(root / "gpuhook.yaml"))
        daemon = engines.Containerd(root, config, env, bin_dir)
        c = Cri(node, root, daemon, api, request.param)
        version = c.client.version()  # the CRI plugin loaded and answers on the socket
        assert (version.runtime_name, version.runtime_api_version) == ("containerd", "v1")
        c.configure()
        build_images(daemon, rootfs_template, tmp_path_factory.mktemp("cri-images"))
        yield c
        c.client.close()
    finally:
        if daemon is not None:
            daemon.stop()
            kill_shims(daemon.socket)
        for pid in mps_daemons_under(root):  # only the MPS daemons of this suite's root
            os.kill(pid, 9)
        engines.remove_tree(root)


@pytest.fixture
def k8s(cri: Cri) -> Cri:
    """The suite's daemon with gpuhook's default config for the test (and an empty checkpoint)."""
    cri.configure()
    cri.allocate()
    return cri

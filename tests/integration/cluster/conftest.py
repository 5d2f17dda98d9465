"""The cluster fixture (tests/integration/cluster/stack.py): up once for the module's tests,
down at the end, and the host checked to be as the suite found it (the real-kubelet suite's
hygiene checks: sysctls, /var/lib/kubelet, /var/log/containers, mounts, kubepods cgroups)."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import testbed
import yaml

from tests.conftest import FakeNode
from tests.integration import engines
from tests.integration.cluster import stack
from tests.integration.kubelet import host
from tests.integration.test_containerd import oci_archive

PAUSE = "gpuhook-test.local/pause:1"
IMAGE = "gpuhook-test.local/busybox:1"
IMAGE_ALL = "gpuhook-test.local/busybox-env-all:1"
PATH_ENV = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"
DRA_PLUGIN = "nvidia-dra-gpu-kubelet-plugin"
MPS_GPU = 1  # gpuhook's MPS-shared GPU on the cluster's node (2 replicas)


def _images(rootfs: str, folder: Path) -> list[Path]:
    """The sandbox image and the pods' images (the busybox rootfs), as OCI archives."""
    images = {
        PAUSE: ([PATH_ENV], ["/bin/sleep", "360000"]),
        IMAGE: ([PATH_ENV], ["/bin/sh"]),
        IMAGE_ALL: ([PATH_ENV, "NVIDIA_VISIBLE_DEVICES=all"], ["/bin/sh"]),
    }
    return [
        oci_archive(rootfs, folder / f"{uuidlib.uuid4().hex[:8]}.tar", name, env, cmd)
        for name, (env, cmd) in images.items()
    ]


@pytest.fixture(scope="module")
def k8s(
    node: FakeNode, rootfs_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[stack.Cluster]:
    try:
        stack.binaries((DRA_PLUGIN,))
    except stack.Missing as exc:
        pytest.fail(str(exc), pytrace=False)
    scratch = tmp_path_factory.mktemp("cluster")
    images = _images(rootfs_template, scratch)
    with stack.kubelet_lock():
        before = host.snapshot()
        work = engines.short_dir("ghk")
        kubelet_root = work / "kubelet" / "root"
        policy = {"kubernetes": {"kubelet_dir": str(kubelet_root)}}
        mps = {"root": str(scratch / "mps"), "gpus": [MPS_GPU], "replicas": 2}
        # the CDI folders gpuhook looks in (doctor, inspect pod): the node's and the cluster's
        # containerd's, where NVIDIA's DRA driver writes its claim specs
        own = yaml.safe_load(node.config.read_text())["cdi"]["spec_dirs"]
        cdi = {"spec_dirs": [*own, str(work / "cdi")]}
        config = node.variant(scratch, policy=policy, mps=mps, cdi=cdi)["GPUHOOK_CONFIG"]
        containerd = stack.BIN / "containerd"
        configure = stack.write_configure(
            scratch / "configure", testbed.GPUHOOK, testbed.RUNTIME, containerd, config
        )
        cluster = stack.Cluster(work, stack.env_for(config, images, PAUSE, configure))
        gpuhook_env = {"GPUHOOK_CONFIG": config}
        try:
            started = node.gpuhook("mps", "start", env=gpuhook_env)
            assert started.returncode == 0, started.stderr
            cluster.up()
            yield cluster
        finally:
            cluster.down()
            node.gpuhook("mps", "stop", env=gpuhook_env)
            print(f"\ncluster: up {cluster.up_seconds:.1f}s, down {cluster.down_seconds:.1f}s")
            host.restore(before)
            host.unmount_under(work)
            mounts = host.mounts_under(work)
            engines.remove_tree(work)
        problems = host.differences(before, host.snapshot())
        problems += [f"{m} is still mounted" for m in mounts]
        assert not problems, "the host is not as the suite found it:\n" + "\n".join(problems)

"""GPU pods on a real cluster (issue 35): etcd, kube-apiserver, scheduler, controller-manager,
the kubelet as a Node and containerd 2.3.4 with gpuhook-runtime as its default runtime, on the
fake node."""

from __future__ import annotations

import pytest

from tests.conftest import FakeNode
from tests.integration.cluster import pods
from tests.integration.cluster.conftest import IMAGE_ALL
from tests.integration.cluster.stack import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.root]


def test_the_cluster_runs_a_pod_without_a_claim_whose_image_says_all(
    k8s: Cluster, node: FakeNode
) -> None:
    """No claim, no device plugin: the image's NVIDIA_VISIBLE_DEVICES=all gets no GPU."""
    seen = pods.run(k8s, pods.pod("no-claim-all", IMAGE_ALL))
    assert seen["phase"] == "Succeeded", seen
    assert seen["dev"] == []
    print(f"cluster up in {k8s.up_seconds:.1f}s")

"""NVIDIA's own device plugin (nvidia.py) with the real kubelet and gpuhook (issue 33): in each of
its strategies an allocated pod sees exactly its GPUs, a pod without a request sees none, and
`gpuhook inspect pod` explains both. What the plugin answered is read back from the kubelet's
checkpoint (AllocResp), so docs/device-plugins.md can say what it really sends.

One plugin at a time (its socket name is fixed); it takes over ``nvidia.com/gpu`` from the
suite's own plugin for this module's kubelet, on the standard node (8 GPUs, 6 and 7 in MIG mode
with 3 MIG devices each). The image of every container says ``NVIDIA_VISIBLE_DEVICES=all``. MPS is
off here (gpuhook's config), so any GPU can be allocated.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.cri.daemon import IMAGE
from tests.integration.kubelet import nvidia
from tests.integration.kubelet.conftest import CHECKPOINT, Cluster
from tests.integration.kubelet.kubelet import Container, Pod
from tests.integration.kubelet.test_kubelet import rows
from tests.integration.test_leak_matrix import gpus

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nvidia.binary(REPO, tmp_path_factory.mktemp("nvidia-plugin"))


@pytest.fixture
def plugin_run(cluster: Cluster, program: Path, tmp_path: Path) -> Iterator[Any]:
    """A function starting NVIDIA's plugin (strategy, id strategy, replicas), stopped after."""
    started: list[nvidia.NvidiaPlugin] = []

    def start(
        strategy: str, id_strategy: str = "uuid", replicas: int = 0, mig: str = "none"
    ) -> None:
        plugin = nvidia.NvidiaPlugin(
            program, cluster.node.root, tmp_path, strategy, id_strategy, replicas, mig
        )
        started.append(plugin)
        plugin.start()
        gpus = cluster.node.truth["gpus"]
        whole = [g for g in gpus if not g.get("mig_enabled")] if mig == "mixed" else gpus
        plugin.wait_registered(CHECKPOINT, len(whole) * (replicas or 1))

    with cluster.configured(mps={"gpus": []}):
        try:
            yield start
        finally:
            for plugin in started:
                plugin.stop()


def entry(cluster: Cluster, pod: Pod) -> dict[str, Any]:
    """The container's checkpoint entry: its device ids and what the plugin answered."""
    (found,) = [e for e in cluster.checkpoint(pod) if e["ContainerName"] == "main"]
    api = cluster.plugins[nvidia.RESOURCE].api
    answer = api.ContainerAllocateResponse.FromString(base64.b64decode(found["AllocResp"]))
    ids = [i for numa in sorted(found["DeviceIDs"]) for i in found["DeviceIDs"][numa]]
    return {"resource": found["ResourceName"], "ids": ids, "answer": answer}


def index_of(cluster: Cluster, device_id: str) -> int:
    uuid = device_id.partition("::")[0]
    return next(int(g["index"]) for g in cluster.node.truth["gpus"] if g["uuid"] == uuid)


def sent(answer: Any) -> dict[str, Any]:
    """What the plugin's Allocate answer holds, as docs/device-plugins.md shows it."""
    return {
        "envs": dict(answer.envs),
        "mounts": [(m.container_path, m.host_path) for m in answer.mounts],
        "annotations": dict(answer.annotations),
        "devices": [d.container_path for d in answer.devices],
    }


STRATEGIES = [
    ("envvar", "uuid", "env GPU-"),
    ("volume-mounts", "uuid", "mount-marker GPU-"),
    ("cdi-annotations", "uuid", "cdi-annotation k8s.device-plugin.nvidia.com/gpu=GPU-"),
    ("envvar", "index", "env "),
    ("cdi-annotations", "index", "cdi-annotation k8s.device-plugin.nvidia.com/gpu="),
]


@pytest.mark.parametrize(("strategy", "ids", "asked"), STRATEGIES,
                         ids=[f"{s}-{i}" for s, i, _ in STRATEGIES])  # fmt: skip
def test_each_strategy_gives_exactly_the_allocated_gpus(
    cluster: Cluster, plugin_run: Any, strategy: str, ids: str, asked: str
) -> None:
    """Before: cdi-annotations was another vendor's CDI device (the pod got none)."""
    plugin_run(strategy, ids)
    pod = Pod(f"nv-{strategy}-{ids}", (Container(gpus={nvidia.RESOURCE: 2}),))
    bare = Pod(f"nv-{strategy}-{ids}-none", (Container(),))
    with cluster.running(pod, bare):
        seen = cluster.k.probe(pod)
        seen_bare = cluster.k.probe(bare)
        allocated = entry(cluster, pod)
        explained = rows(cluster.explain(pod))
        explained_bare = rows(cluster.explain(bare))
    indices = sorted(index_of(cluster, i) for i in allocated["ids"])
    record_answer(cluster, f"{strategy}/{ids}", allocated)
    assert seen["dev"] == gpus(*indices)
    assert sorted(seen["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(
        cluster.uuid(i) for i in indices
    )
    assert seen_bare["dev"] == [] and seen_bare["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    shown = explained["main"]["ASKED"]
    assert shown.startswith(asked[:40]), explained["main"]  # the table cuts long values
    assert explained["main"]["GOT"] == "granted " + ",".join(map(str, indices))
    assert explained_bare["main"]["GOT"] == "refused"
    assert "no GPU resource is allocated" in explained_bare["main"]["WHY"]


def test_a_mig_device_by_its_index_id(cluster: Cluster, plugin_run: Any) -> None:
    """migStrategy mixed, deviceIDStrategy index: the plugin answers the MIG index form
    `<gpu>:<mig>` (the checkpoint holds the MIG UUID); the pod sees that MIG device alone."""
    plugin_run("envvar", "index", mig="mixed")
    resource = "nvidia.com/mig-1g.10gb"
    pod = Pod("nv-mig-index", (Container(gpus={resource: 1}),))
    with cluster.running(pod):
        seen = cluster.k.probe(pod)
        (found,) = [e for e in cluster.checkpoint(pod) if e["ContainerName"] == "main"]
        explained = rows(cluster.explain(pod))
    (mig_uuid,) = [i for numa in found["DeviceIDs"].values() for i in numa]
    ((gpu, mig),) = [
        (g["index"], m["index"])
        for g in cluster.node.truth["gpus"]
        for m in g.get("mig_devices", ())
        if m["uuid"] == mig_uuid
    ]
    assert found["ResourceName"] == resource
    assert explained["main"]["ASKED"] == f"env {gpu}:{mig}"
    assert explained["main"]["GOT"] == f"granted {gpu}:{mig}"
    assert f"/dev/nvidia{gpu}" in seen["dev"]
    assert [d for d in seen["dev"] if d.startswith("/dev/nvidia") and d[11:].isdigit()] == [
        f"/dev/nvidia{gpu}"
    ]
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == mig_uuid


def test_cdi_annotations_alone_give_an_image_without_env_its_gpus(
    cluster: Cluster, plugin_run: Any
) -> None:
    """An image that says nothing of NVIDIA_VISIBLE_DEVICES relies on the plugin's annotation
    alone (containerd 1.6 does not resolve CDI): before, gpuhook read it as another vendor's
    device and the pod allocated 2 GPUs got none."""
    plugin_run("cdi-annotations")
    pod = Pod("nv-cdi-plain", (Container(gpus={nvidia.RESOURCE: 2}, image=IMAGE),))
    with cluster.running(pod):
        seen = cluster.k.probe(pod)
        allocated = entry(cluster, pod)
        explained = rows(cluster.explain(pod))
    indices = sorted(index_of(cluster, i) for i in allocated["ids"])
    assert len(indices) == 2 and seen["dev"] == gpus(*indices)
    assert explained["main"]["GOT"] == "granted " + ",".join(map(str, indices))


def test_time_sliced_replicas_of_nvidias_plugin(cluster: Cluster, plugin_run: Any) -> None:
    """sharing.timeSlicing replicas 2: `<uuid>::<n>` ids, the env answer the bare UUIDs."""
    plugin_run("envvar", "uuid", 2)
    a = Pod("nv-sliced-a", (Container(gpus={nvidia.RESOURCE: 1}),))
    b = Pod("nv-sliced-b", (Container(gpus={nvidia.RESOURCE: 1}),))
    with cluster.running(a, b):
        seen = [cluster.k.probe(a), cluster.k.probe(b)]
        allocated = [entry(cluster, a), entry(cluster, b)]
        explained = [rows(cluster.explain(p)) for p in (a, b)]
    record_answer(cluster, "envvar/uuid, timeSlicing replicas 2", allocated[0])
    for one, got, why in zip(seen, allocated, explained, strict=True):
        (device,) = got["ids"]
        assert "::" in device
        index = index_of(cluster, device)
        assert one["dev"] == gpus(index)
        assert why["main"]["GOT"] == f"granted {index}"


def record_answer(cluster: Cluster, label: str, allocated: dict[str, Any]) -> None:
    """Append what the plugin answered to the suite's folder (read by whoever updates
    docs/device-plugins.md; printed by pytest -s)."""
    line = json.dumps({label: {"ids": allocated["ids"], **sent(allocated["answer"])}})
    with open(cluster.root / "nvidia-answers.jsonl", "a") as fh:
        fh.write(line + "\n")
    print(line)

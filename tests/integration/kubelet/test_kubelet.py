"""gpuhook under a real kubelet (conftest.py): what the containers of static pods see.

Each test runs static pods whose containers print their ``/dev/nvidia*`` nodes and NVIDIA/CUDA
env (testbed's probe, read back from the kubelet's container logs), and checks it against the
kubelet's own record of what the device plugin allocated (its checkpoint), then asks
``gpuhook inspect pod`` why. The device plugins (deviceplugin.py) answer Allocate as NVIDIA's
does in each strategy; the image of every container says ``NVIDIA_VISIBLE_DEVICES=all``, so
anything beyond the allocation is a leak.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from typing import Any

import pytest
import testbed

from tests.integration.kubelet.conftest import CDI, GPU, MOUNTS, MPS, MPS_GPU, SHARED, Cluster
from tests.integration.kubelet.kubelet import Container, Pod
from tests.integration.test_leak_matrix import gpus

pytestmark = [pytest.mark.slow, pytest.mark.root]

PCT = "gpuhook.io/mps-active-thread-percentage"
MIB = 1 << 20


def rows(explained: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    """`gpuhook inspect pod -o table`, per container name (a restarted container's last row)."""
    assert explained.returncode == 0, explained.stderr
    lines = explained.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("CONTAINER "))
    names = lines[head].split()
    out = {}
    for line in lines[head + 1 :]:
        if line.strip():
            row = dict(zip(names, re.split(r"\s{2,}", line.strip()), strict=False))
            out[row["CONTAINER"]] = row
    return out


def allocated(cluster: Cluster, pod: Pod, container: str = "main") -> dict[str, Any]:
    """The container's one checkpoint entry, its device ids and the AllocResp decoded."""
    entries = [e for e in cluster.checkpoint(pod) if e["ContainerName"] == container]
    assert len(entries) == 1, cluster.checkpoint(pod)
    entry = entries[0]
    api = cluster.plugins[entry["ResourceName"]].api
    response = api.ContainerAllocateResponse.FromString(base64.b64decode(entry["AllocResp"]))
    return {**entry, "response": response, "ids": entry["DeviceIDs"]["-1"]}


def index_of(cluster: Cluster, device_id: str) -> int:
    uuid = device_id.partition("::")[0]
    return next(int(g["index"]) for g in cluster.node.truth["gpus"] if g["uuid"] == uuid)


# --- an allocation, in each of the device plugin's strategies -------------------------------------


@pytest.mark.parametrize(
    ("resource", "asked"),
    [
        (GPU, "env {uuid}"),
        (MOUNTS, "mount-marker {uuid}"),
        (CDI, "cdi-annotation nvidia.com/gpu={uuid}"),
        (SHARED, "env {uuid}"),
    ],
    ids=["envvar", "volume-mounts", "cdi-annotations", "time-slicing"],
)
def test_an_allocated_gpu_is_all_that_image_env_all_sees(
    cluster: Cluster, resource: str, asked: str
) -> None:
    pod = Pod(
        f"one-{resource.replace('/', '-').replace('.', '-')}", (Container(gpus={resource: 1}),)
    )
    with cluster.running(pod):
        seen = cluster.k.probe(pod)
        entry = allocated(cluster, pod)
        explained = cluster.explain(pod)
    (device,) = entry["ids"]
    index = index_of(cluster, device)
    uuid = cluster.uuid(index)
    assert entry["ResourceName"] == resource
    assert uuid in cluster.plugins[resource].resource.uuids
    answered = [a for a in cluster.allocations(resource) if a.device_ids == (device,)]
    assert entry["response"] == answered[-1].response  # the kubelet keeps the plugin's answer
    assert seen["dev"] == gpus(index)
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert seen["smi"] == [
        f"GPU 0: {cluster.node.truth['gpus'][index]['name']} (UUID: {uuid})",
        "rc=0",
    ]
    table = rows(explained)
    assert table["main"]["ASKED"].startswith(asked.format(uuid=uuid)[:45])
    assert table["main"]["GOT"] == f"granted {index}"
    assert table["main"]["WHY"].startswith(f"devices {index}: verified against the kubelet")
    assert table["sandbox"]["GOT"] == "refused"
    assert table["sandbox"]["WHY"] == "a pod sandbox never gets GPUs"


def test_time_sliced_replicas_name_their_gpu(cluster: Cluster) -> None:
    """Two pods of the time-sliced resource: two replica ids <uuid>::<n> of GPU 5, one GPU."""
    a = Pod("sliced-a", (Container(gpus={SHARED: 1}),))
    b = Pod("sliced-b", (Container(gpus={SHARED: 1}),))
    with cluster.running(a, b):
        seen = [cluster.k.probe(a), cluster.k.probe(b)]
        ids = [allocated(cluster, a)["ids"], allocated(cluster, b)["ids"]]
    uuid = cluster.uuid(5)
    assert all(len(i) == 1 and re.fullmatch(rf"{uuid}::[0-3]", i[0]) for i in ids), ids
    assert ids[0] != ids[1]
    assert [s["dev"] for s in seen] == [gpus(5), gpus(5)]


# --- no request, two pods ------------------------------------------------------------------------


def test_no_request_and_image_env_all_sees_no_gpu(cluster: Cluster) -> None:
    """The default-all leak: a pod that asked for nothing, whose image says all."""
    pod = Pod("no-request")
    with cluster.running(pod):
        seen = cluster.k.probe(pod)
        entries = cluster.checkpoint(pod)
        explained = cluster.explain(pod)
    assert entries == []
    assert seen["dev"] == []
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    table = rows(explained)
    assert table["main"]["GOT"] == "refused"
    assert table["main"]["WHY"].startswith(f"no GPU resource is allocated to pod {pod.ref}")


def test_the_leak_is_there_under_the_stock_policy(cluster: Cluster) -> None:
    """Control: under ``policy.kubernetes.env_requests: trust`` (what NVIDIA's runtime does
    with an image's env) the same pod sees every GPU, so the test above would see the leak."""
    with cluster.configured(policy={"kubernetes": {"env_requests": "trust"}}, mps={"gpus": []}):
        pod = Pod("no-request-trusted")
        with cluster.running(pod):
            seen = cluster.k.probe(pod)
    assert seen["dev"] == gpus(*range(8))


def test_two_pods_get_disjoint_gpus(cluster: Cluster) -> None:
    a = Pod("pair-a", (Container(gpus={GPU: 1}),))
    b = Pod("pair-b", (Container(gpus={GPU: 1}),))
    with cluster.running(a, b):
        seen = {p.name: cluster.k.probe(p) for p in (a, b)}
        index = {p.name: index_of(cluster, allocated(cluster, p)["ids"][0]) for p in (a, b)}
        explained = {p.name: cluster.explain(p) for p in (a, b)}
    assert sorted(index.values()) == [0, 1]
    for name, i in index.items():
        assert seen[name]["dev"] == gpus(i)
        assert rows(explained[name])["main"]["GOT"] == f"granted {i}"


# --- init containers, restarts -------------------------------------------------------------------


def held(name: str, gpus: dict[str, int] | None = None) -> Container:
    """An init container that prints the probe, then waits until the test releases it (a
    finished container's bundle, and with it gpuhook's record, is gone)."""
    script = f"{testbed.PROBE}; until [ -e /hold/{name} ]; do sleep 0.1; done"
    return Container(name, gpus=gpus or {}, script=script, mounts={"hold": "/hold"})


def test_an_init_container_gets_no_gpu_unless_it_asked(cluster: Cluster) -> None:
    """Init containers ``plain`` (no request) and ``asks`` (one GPU), then ``main`` (one GPU):
    each is probed and explained while it runs."""
    pod = Pod(
        "with-init",
        (Container("main", gpus={GPU: 1}),),
        init_containers=(held("plain"), held("asks", {GPU: 1})),
        empty_dirs=("hold",),
    )
    seen, explained = {}, {}
    with cluster.running(pod):
        for name in ("plain", "asks", "main"):
            seen[name] = cluster.k.probe(pod, name)
            explained[name] = cluster.explain(pod)
            if name != "main":
                (cluster.k.empty_dir(pod, "hold") / name).touch()
        ids = {c: allocated(cluster, pod, c)["ids"] for c in ("asks", "main")}
        names = {e["ContainerName"] for e in cluster.checkpoint(pod)}
    asks, main = (index_of(cluster, ids[c][0]) for c in ("asks", "main"))
    assert names == {"asks", "main"}
    assert seen["plain"]["dev"] == [] and seen["plain"]["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert seen["asks"]["dev"] == gpus(asks)
    assert seen["main"]["dev"] == gpus(main)
    assert ids["main"] == ids["asks"]  # the kubelet gives an init container's devices again
    table = {name: rows(out)[name] for name, out in explained.items()}
    assert table["plain"]["GOT"] == "refused"
    assert table["plain"]["WHY"].startswith(f"no GPU resource is allocated to pod {pod.ref}")
    assert table["asks"]["GOT"] == f"granted {asks}"
    assert table["main"]["GOT"] == f"granted {main}"


def test_a_restarted_container_gets_the_same_gpu(cluster: Cluster) -> None:
    """The container exits 1 after its first run; the kubelet starts it again (restartCount 1)
    from the same allocation, without a second Allocate."""
    script = (
        f"{testbed.PROBE}; if [ -e /state/ran ]; then exec sleep 3600; fi; touch /state/ran; exit 1"
    )
    pod = Pod(
        "restarts",
        (Container(gpus={GPU: 1}, script=script, mounts={"state": "/state"}),),
        empty_dirs=("state",),
    )
    calls = len(cluster.allocations(GPU))
    with cluster.running(pod):
        first = cluster.k.probe(pod, attempt=0)
        second = cluster.k.probe(pod, attempt=1)
        index = index_of(cluster, allocated(cluster, pod)["ids"][0])
        running = cluster.container_id(pod)
        explained = cluster.explain(pod)
    assert first["dev"] == second["dev"] == gpus(index)
    assert len(cluster.allocations(GPU)) == calls + 1
    table = rows(explained)
    assert table["main"]["ID"] == running[:12]
    assert table["main"]["GOT"] == f"granted {index}"


# --- MPS -----------------------------------------------------------------------------------------


def mps_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("CUDA_MPS_")}


def test_an_mps_pod_and_a_process_exec_started_in_it_get_the_limits(cluster: Cluster) -> None:
    pod = Pod("mps", (Container(gpus={MPS: 1}),), annotations={PCT: "30"})
    with cluster.running(pod):
        seen = cluster.k.probe(pod)
        exec_env = cluster.exec_env(cluster.container_id(pod))
        (device,) = allocated(cluster, pod)["ids"]
        explained = cluster.explain(pod)
    share = int(cluster.node.truth["gpus"][MPS_GPU]["memory"]) // 2 // MIB
    limits = {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/gpuhook/mps/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={share}M",
    }
    assert device.startswith(f"{cluster.uuid(MPS_GPU)}::")
    assert seen["dev"] == gpus(MPS_GPU)
    assert mps_env(seen["env"]) == limits
    assert mps_env(exec_env) == limits
    assert rows(explained)["main"]["GOT"] == f"granted {MPS_GPU}"


def test_deleted_pods_free_their_mps_reservations_and_gc_keeps_nothing(cluster: Cluster) -> None:
    """Both MPS replicas taken, the pods deleted, both taken again: under oversubscription
    ``reject`` a reservation the first pair left would refuse the second. Then no pod is left
    and the state folder keeps nothing of them: the engine's deletes through gpuhook-runtime took
    each record link with them, so `gpuhook gc` finds nothing to keep or remove."""
    for generation in ("first", "second"):
        pods = [Pod(f"mps-{generation}-{n}", (Container(gpus={MPS: 1}),)) for n in (0, 1)]
        with cluster.running(*pods):
            seen = [cluster.k.probe(p) for p in pods]
            explained = [cluster.explain(p) for p in pods]
        assert [s["dev"] for s in seen] == [gpus(MPS_GPU)] * 2, generation
        assert all("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in s["env"] for s in seen), seen
        assert [rows(e)["main"]["GOT"] for e in explained] == [f"granted {MPS_GPU}"] * 2
    out = cluster.gpuhook("gc", "--grace", "0", "--output", "json")
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert view["kept"] == [] and view["live"] == 0, view
    assert view["removed"] == [], view  # the deletes removed every sandbox's and container's

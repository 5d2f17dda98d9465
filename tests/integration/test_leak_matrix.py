"""The leak matrix: real runc containers through gpuhook-runtime on the fake node. Each
scenario asserts the exact set of /dev/nvidia* nodes the container sees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import factories as f
from tests.conftest import Containers, FakeNode

pytestmark = [pytest.mark.slow, pytest.mark.root]

# compute and utility (the default capabilities): no /dev/nvidia-modeset
CONTROL = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]
HOOK = str(Path(__file__).resolve().parents[2] / "build" / "bin" / "nvidia-container-runtime-hook")


def gpus(*indices: int) -> list[str]:
    return sorted(CONTROL + [f"/dev/nvidia{i}" for i in indices])


def uuid(node: FakeNode, index: int) -> str:
    return str(node.truth["gpus"][index]["uuid"])


def write_checkpoint(
    path: Path, entries: list[tuple[str, str, list[str]]], numa: bool = True
) -> Path:
    doc = {
        "Data": {
            "PodDeviceEntries": [
                {
                    "PodUID": uid,
                    "ContainerName": name,
                    "ResourceName": "nvidia.com/gpu",
                    "DeviceIDs": {"0": ids} if numa else ids,
                    "AllocResp": "",
                }
                for uid, name, ids in entries
            ],
            "RegisteredDevices": {},
        },
        "Checksum": 1,
    }
    path.write_text(json.dumps(doc))
    return path


def k8s_env(
    node: FakeNode, tmp_path: Path, allocations: list[tuple[str, str, list[str]]], **policy: Any
) -> dict[str, str]:
    cp = write_checkpoint(tmp_path / "kubelet_internal_checkpoint", allocations)
    return node.variant(tmp_path, policy={"kubernetes": {"checkpoint": str(cp), **policy}})


def test_env_request_full_injection(node: FakeNode, containers: Containers) -> None:
    """A plain container asking for GPU 1 through its env sees GPU 1, the control nodes, the
    compute+utility libraries resolvable by ldconfig -p, and a working nvidia-smi."""
    seen = containers.probe(node.env, env=["NVIDIA_VISIBLE_DEVICES=1"])
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == gpus(1)
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == uuid(node, 1)
    sonames = {line.split(" => ")[0] for line in seen["ldconfig"]}
    want = {lib["soname"] for cap in ("compute", "utility") for lib in node.truth["libraries"][cap]}
    assert want <= sonames, want - sonames
    assert not any("nvcuvid" in s for s in sonames)  # video was not requested
    assert all("=> /usr/local/gpuhook/lib/" in line for line in seen["ldconfig"])
    assert seen["smi"][-1] == "rc=0"
    assert seen["smi"][:-1] == [f"GPU 0: {node.truth['gpus'][1]['name']} (UUID: {uuid(node, 1)})"]


def test_cdi_annotation(node: FakeNode, containers: Containers, tmp_path: Path) -> None:
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 1)])])
    seen = containers.probe(
        env,
        annotations={**f.k8s(), "cdi.k8s.io/nvidia-device-plugin_x": "nvidia.com/gpu=1"},
    )
    assert seen["dev"] == gpus(1), seen["stderr"]


def test_volume_mount_marker(node: FakeNode, containers: Containers, tmp_path: Path) -> None:
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 1)])])
    marker = {
        "destination": f"/var/run/nvidia-container-devices/{uuid(node, 1)}",
        "type": "bind",
        "source": "/dev/null",
        "options": ["bind", "ro"],
    }
    seen = containers.probe(env, annotations=f.k8s(), mounts=[marker])
    assert seen["dev"] == gpus(1), seen["stderr"]


def test_docker_gpus_hook(node: FakeNode, containers: Containers, tmp_path: Path) -> None:
    """docker --gpus: the hook is removed (it would fail the container if it ran) and the
    request is honoured even with standalone env requests ignored."""
    env = node.variant(tmp_path, policy={"standalone": {"env_requests": "ignore"}})
    hooks = {"prestart": [{"path": HOOK, "args": ["nvidia-container-runtime-hook", "prestart"]}]}
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=1"], hooks=hooks)
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == gpus(1)


def test_k8s_all_without_allocation_gets_nothing(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env = k8s_env(node, tmp_path, [("other-pod", "main", [uuid(node, 0)])])
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == []
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert seen["ldconfig"] == []


def test_k8s_all_with_allocation_gets_only_it(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 2)])])
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    assert seen["dev"] == gpus(2), seen["stderr"]


def test_k8s_env_naming_another_pods_gpu(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env = k8s_env(
        node,
        tmp_path,
        [("pod-uid-1", "main", [uuid(node, 2)]), ("pod-uid-2", "main", [uuid(node, 5)])],
    )
    seen = containers.probe(
        env, env=[f"NVIDIA_VISIBLE_DEVICES={uuid(node, 5)}"], annotations=f.k8s()
    )
    assert seen["dev"] == [], seen["stderr"]


def test_init_container_of_gpu_pod(node: FakeNode, containers: Containers, tmp_path: Path) -> None:
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 2)])])
    seen = containers.probe(
        env,
        env=["NVIDIA_VISIBLE_DEVICES=all"],
        annotations=f.k8s(container="init"),
    )
    assert seen["dev"] == [], seen["stderr"]


def test_pod_sandbox(node: FakeNode, containers: Containers, tmp_path: Path) -> None:
    env = k8s_env(node, tmp_path, [("pod-uid-1", "", [uuid(node, 2)])])
    seen = containers.probe(
        env,
        env=["NVIDIA_VISIBLE_DEVICES=all"],
        annotations=f.k8s(ctype="sandbox", container=""),
    )
    assert seen["dev"] == [], seen["stderr"]


def test_privileged_all(node: FakeNode, containers: Containers, tmp_path: Path) -> None:
    env = k8s_env(node, tmp_path, [])
    seen = containers.probe(
        env,
        env=["NVIDIA_VISIBLE_DEVICES=all"],
        annotations=f.k8s(),
        privileged=True,
    )
    assert seen["dev"] == gpus(*range(8)), seen["stderr"]


@pytest.mark.parametrize(("mode", "want"), [("trust", list(range(8))), ("ignore", None)])
def test_standalone_all(
    node: FakeNode, containers: Containers, tmp_path: Path, mode: str, want: list[int] | None
) -> None:
    env = node.variant(tmp_path, policy={"standalone": {"env_requests": mode}})
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=all"])
    assert seen["dev"] == (gpus(*want) if want is not None else []), seen["stderr"]


def test_none_gives_driver_files_but_no_gpu(node: FakeNode, containers: Containers) -> None:
    seen = containers.probe(node.env, env=["NVIDIA_VISIBLE_DEVICES=none"])
    assert seen["dev"] == CONTROL, seen["stderr"]
    assert any(line.startswith("libcuda.so.1 ") for line in seen["ldconfig"])


def test_void(node: FakeNode, containers: Containers) -> None:
    seen = containers.probe(node.env, env=["NVIDIA_VISIBLE_DEVICES=void"])
    assert seen["dev"] == [] and seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_no_request(node: FakeNode, containers: Containers) -> None:
    seen = containers.probe(node.env)
    assert seen["returncode"] == 0 and seen["dev"] == [] and seen["env"] == {}


def test_mig_device(node: FakeNode, containers: Containers) -> None:
    mig = node.truth["gpus"][6]["mig_devices"][1]
    seen = containers.probe(node.env, env=["NVIDIA_VISIBLE_DEVICES=6:1"])
    caps = sorted(c["path"] for c in mig["caps_nodes"])
    assert seen["dev"] == sorted([*gpus(6), "/dev/nvidia-caps", *caps]), seen["stderr"]
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == mig["uuid"]


def test_unknown_id_fails_create_with_one_line(node: FakeNode, containers: Containers) -> None:
    bundle = containers.bundle(args=("/bin/true",), env=["NVIDIA_VISIBLE_DEVICES=9"])
    before = (bundle / "config.json").read_bytes()
    out = containers.run(bundle, node.env)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert lines == [
        "gpuhook: env NVIDIA_VISIBLE_DEVICES: unknown GPU index 9 (this node has GPUs 0-7)"
    ]
    assert (bundle / "config.json").read_bytes() == before  # nothing half-applied


def test_corrupted_checkpoint_refuses(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    cp = tmp_path / "kubelet_internal_checkpoint"
    cp.write_text('{"Data": {"PodDeviceEntries": [{"PodUID": ')
    env = node.variant(tmp_path, policy={"kubernetes": {"checkpoint": str(cp)}})
    seen = containers.probe(env, env=["NVIDIA_VISIBLE_DEVICES=0"], annotations=f.k8s())
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == []
    record = json.loads((seen["bundle"] / "gpuhook-decision.json").read_text())
    assert "kubelet checkpoint" in record["decision"]["reasons"][0]["why"]

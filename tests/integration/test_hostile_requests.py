"""Requests that try to widen access (SECURITY.md, class C), against real runc containers.

An image's env and a pod's annotations and volumes are untrusted input: odd spellings of
NVIDIA_VISIBLE_DEVICES, a flood of ids, a ``../`` volume marker, a pod author's own volume at the
marker path, another vendor's CDI name, NVIDIA_DRIVER_CAPABILITIES=all without an allocation.
Each container sees exactly the GPUs the policy decides, and what is malformed fails in one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import factories as f
from tests.conftest import Containers, FakeNode
from tests.hostile import one_line_failure
from tests.integration.test_leak_matrix import gpus, k8s_env, uuid

pytestmark = [pytest.mark.slow, pytest.mark.root]

ALL = gpus(*range(8))
FLOOD = ",".join(str(i % 8) for i in range(10_000))  # 10 000 entries, 8 distinct ids
DISTINCT = ",".join(str(i) for i in range(10_000))  # 10 000 distinct ids


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (" 1 ,\t1 , 1", gpus(1)),  # whitespace and duplicates
        ("1,1,1,2,2", gpus(1, 2)),
        ("ALL", ALL),  # mixed case
        ("aLl,0", ALL),
        ("all,0", ALL),
        (FLOOD, ALL),
        ("NONE", gpus()[:4]),  # driver files and control nodes only
        ("VOID", []),
    ],
)
def test_standalone_spellings(
    node: FakeNode, containers: Containers, value: str, want: list[str]
) -> None:
    seen = containers.probe(node.env, env=[f"NVIDIA_VISIBLE_DEVICES={value}"])
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == want


def test_uuid_in_odd_case_names_only_that_gpu(node: FakeNode, containers: Containers) -> None:
    mixed = uuid(node, 3).upper().replace("GPU-", "gpu-")
    seen = containers.probe(node.env, env=[f"NVIDIA_VISIBLE_DEVICES= {mixed} "])
    assert seen["dev"] == gpus(3), seen["stderr"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (DISTINCT, "NVIDIA_VISIBLE_DEVICES: too many device ids (10000 > 256)"),
        ("0,none", "'none' or 'void' cannot be combined with device ids"),
        ("0,../../dev/sda", "unknown device id '../../dev/sda'"),
        ("amd.com/gpu=0", "'amd.com/gpu=0' is not an NVIDIA GPU"),
        ("0\n1", "unknown device id '0\\n1'"),
    ],
)
def test_trusted_but_malformed_env_fails_in_one_line(
    node: FakeNode, containers: Containers, value: str, message: str
) -> None:
    bundle = containers.bundle(args=("/bin/true",), env=[f"NVIDIA_VISIBLE_DEVICES={value}"])
    before = (bundle / "config.json").read_bytes()
    out = containers.run(bundle, node.env)
    assert out.returncode == 1
    assert message in one_line_failure(out.stderr)
    assert (bundle / "config.json").read_bytes() == before


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("all,0", [2]),
        (" 0 , 2 , 2 ", [2]),
        ("ALL", [2]),
        ("5", []),  # another pod's GPU
        (FLOOD, [2]),
        (DISTINCT, []),  # malformed and untrusted: refused, the container still starts
        ("0,none", []),
    ],
)
def test_kubernetes_env_never_exceeds_the_allocation(
    node: FakeNode, containers: Containers, tmp_path: Path, value: str, want: list[int]
) -> None:
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 2)])])
    seen = containers.probe(env, env=[f"NVIDIA_VISIBLE_DEVICES={value}"], annotations=f.k8s())
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == (gpus(*want) if want else [])


def test_all_capabilities_without_allocation_get_nothing(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env = k8s_env(node, tmp_path, [("other-pod", "main", [uuid(node, 0)])])
    seen = containers.probe(
        env,
        env=["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"],
        annotations=f.k8s(),
    )
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == [] and seen["ldconfig"] == [] and seen["smi"] == []
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_all_capabilities_with_allocation_get_only_its_gpu(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 4)])])
    seen = containers.probe(
        env,
        env=["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"],
        annotations=f.k8s(),
    )
    # graphics and display are among "all": the modeset node too
    assert seen["dev"] == sorted([*gpus(4), "/dev/nvidia-modeset"]), seen["stderr"]
    assert any("libnvidia-encode.so.1" in line for line in seen["ldconfig"])  # video, as asked


def test_pod_authors_volume_at_the_marker_path_gets_nothing(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """An emptyDir (any folder) mounted at /var/run/nvidia-container-devices/all is not a device
    plugin's marker: before the fix it granted every GPU."""
    env = k8s_env(node, tmp_path, [])
    empty_dir = tmp_path / "empty-dir"
    empty_dir.mkdir()
    marker = {
        "destination": "/var/run/nvidia-container-devices/all",
        "type": "bind",
        "source": str(empty_dir),
        "options": ["rbind", "rw"],
    }
    seen = containers.probe(env, annotations=f.k8s(), mounts=[marker])
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == []


DOTDOT_MARKER = {
    "destination": "/var/run/nvidia-container-devices/../../../dev",
    "type": "bind",
    "source": "/dev/null",
    "options": ["bind", "ro"],
}


def test_dotdot_marker_fails_in_one_line(node: FakeNode, containers: Containers) -> None:
    """Markers trusted without limit (a non-Kubernetes container): a malformed one fails."""
    bundle = containers.bundle(args=("/bin/true",), mounts=[DOTDOT_MARKER])
    out = containers.run(bundle, node.env)
    assert out.returncode == 1
    assert one_line_failure(out.stderr) == (
        "gpuhook: malformed GPU request: malformed volume-mount marker "
        "'/var/run/nvidia-container-devices/../../../dev'"
    )


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("vendor.com/gpu=0", []),  # another vendor's device: not gpuhook's to act on
        ("nvidia.com/gpu=1,vendor.com/gpu=0", gpus(1)),
        ("amd.com/gpu=all", []),
    ],
)
def test_cdi_name_of_another_vendor(
    node: FakeNode, containers: Containers, tmp_path: Path, value: str, want: list[str]
) -> None:
    env = k8s_env(node, tmp_path, [("pod-uid-1", "main", [uuid(node, 1)])])
    seen = containers.probe(env, annotations={**f.k8s(), "cdi.k8s.io/plugin_x": value})
    assert seen["returncode"] == 0, seen["stderr"]
    assert seen["dev"] == want

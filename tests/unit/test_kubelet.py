"""The kubelet device checkpoint: both layouts, replicas, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhook.errors import CheckpointError
from gpuhook.pipeline.kubelet import allocation_from_bytes, read_allocation


def checkpoint(entries: list[dict[str, object]]) -> bytes:
    return json.dumps(
        {
            "Data": {
                "PodDeviceEntries": entries,
                "RegisteredDevices": {"nvidia.com/gpu": ["GPU-a", "GPU-b"]},
            },
            "Checksum": 1234,
        }
    ).encode()


def test_new_numa_layout_and_resource_filter() -> None:
    raw = checkpoint(
        [
            {
                "PodUID": "u1",
                "ContainerName": "main",
                "ResourceName": "nvidia.com/gpu",
                "DeviceIDs": {"0": ["GPU-a"], "1": ["GPU-b::2"]},
                "AllocResp": "Cg==",
            },
            {
                "PodUID": "u1",
                "ContainerName": "main",
                "ResourceName": "example.com/nic",
                "DeviceIDs": {"0": ["eth1"]},
                "AllocResp": "",
            },
            {
                "PodUID": "u1",
                "ContainerName": "init",
                "ResourceName": "nvidia.com/gpu",
                "DeviceIDs": {"0": ["GPU-c"]},
                "AllocResp": "",
            },
        ]
    )
    alloc = allocation_from_bytes(raw, "cp", "u1", "main")
    # every resource is read; which are GPUs is the policy's (policy.kubernetes.gpu_resources)
    assert alloc.resources == (
        ("example.com/nic", ("eth1",)),
        ("nvidia.com/gpu", ("GPU-a", "GPU-b::2")),
    )
    assert allocation_from_bytes(raw, "cp", "u2", "main").resources == ()


def test_old_list_layout_and_mig_resources() -> None:
    raw = checkpoint(
        [
            {
                "PodUID": "u1",
                "ContainerName": "c",
                "ResourceName": "nvidia.com/mig-1g.10gb",
                "DeviceIDs": ["MIG-x"],
                "AllocResp": "",
            }
        ]
    )
    assert allocation_from_bytes(raw, "cp", "u1", "c").resources == (
        ("nvidia.com/mig-1g.10gb", ("MIG-x",)),
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "is not valid JSON"),
        (b"[]", "no Data object"),
        (b'{"Data": {"PodDeviceEntries": 3}}', "PodDeviceEntries is not a list"),
        (
            b'{"Data": {"PodDeviceEntries": [{"PodUID": "u", "ContainerName": "c", "ResourceName": '
            b'"nvidia.com/gpu", "DeviceIDs": 7}]}}',
            "DeviceIDs is int",
        ),
    ],
)
def test_malformed(raw: bytes, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        allocation_from_bytes(raw, "/cp", "u", "c")


def test_unreadable(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        read_allocation(str(tmp_path / "missing"), "u", "c")


@settings(max_examples=1500, deadline=None)
@given(
    st.binary(max_size=200)
    | st.recursive(
        st.none() | st.integers() | st.text(max_size=4),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "Data",
                        "PodDeviceEntries",
                        "PodUID",
                        "ContainerName",
                        "ResourceName",
                        "DeviceIDs",
                        "0",
                    ]
                ),
                c,
                max_size=4,
            )
        ),
        max_leaves=12,
    ).map(lambda v: json.dumps(v).encode())
)
def test_fuzz_only_checkpoint_errors(raw: bytes) -> None:
    try:
        allocation_from_bytes(raw, "cp", "u", "c")
    except CheckpointError as exc:
        assert "\n" not in str(exc)

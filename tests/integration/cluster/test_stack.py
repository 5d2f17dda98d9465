"""The cluster fixture's preconditions: a missing binary or script fails in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.cluster import stack


def test_a_missing_cluster_script_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack, "CLUSTER_SH", tmp_path / "cluster.sh")
    with pytest.raises(stack.Missing) as exc:
        stack.binaries()
    assert str(exc.value).count("\n") == 0 and "cluster.sh" in str(exc.value)


def test_a_missing_binary_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared folder's unpack cannot give it (here: an unpack that gives nothing)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "cluster.sh").write_text("")
    (shared / "unpack").write_text('mkdir -p "$1"; touch "$1/etcd"\n')
    monkeypatch.setattr(stack, "CLUSTER_SH", shared / "cluster.sh")
    monkeypatch.setattr(stack, "SHARED", shared)
    monkeypatch.setattr(stack, "BIN", tmp_path / "bin")
    with pytest.raises(stack.Missing) as exc:
        stack.binaries(("nvidia-dra-gpu-kubelet-plugin",))
    message = str(exc.value)
    assert message.count("\n") == 0
    assert message.startswith("the cluster needs containerd, containerd-shim-runc-v2, ctr, kube")
    assert message.endswith(f"nvidia-dra-gpu-kubelet-plugin in {tmp_path / 'bin'} (from {shared})")

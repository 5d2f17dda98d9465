"""The kubelet's DRA state as an allocation source (issue 35): the checkpoint parsed defensively
(checksum, both list keys, nulls), NVIDIA's DRA device names mapped to the inventory, and GPUs the
engine injected from a claim's CDI spec verified through :func:`gpuhook.runtime.decide.run` with
the real DRA source reading a checkpoint fixture."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from gpuhook.errors import CheckpointError, RequestError
from gpuhook.model.inventory import Inventory
from gpuhook.pipeline import dra
from gpuhook.pipeline.flow import Outcome
from gpuhook.pipeline.kubelet import Allocation
from gpuhook.runtime import decide
from tests import dra_state
from tests import factories as f

POD = "pod-uid-1"


def inventory() -> Inventory:
    """8 GPUs, GPU 6 in MIG mode with a 3g.40gb, a 2g.20gb and a 1g.10gb device."""
    inv = f.inventory(8, {6: 3})
    gpu = inv.gpus[6]
    named = tuple(
        m.replace(name=f"NVIDIA H100 MIG {p}")
        for m, p in zip(gpu.mig_devices, ("3g.40gb", "2g.20gb", "1g.10gb"), strict=True)
    )
    gpus = list(inv.gpus)
    gpus[6] = gpu.replace(mig_devices=named)
    return inv.replace(gpus=tuple(gpus))


def run(
    spec: dict[str, Any], kubelet_dir: Path, allocated: list[str] | None = None, **cfg: Any
) -> Outcome:
    def checkpoint(path: str, uid: str, name: str) -> Allocation:
        resources = (("nvidia.com/gpu", tuple(allocated)),) if allocated else ()
        return Allocation(uid, name, resources, path)

    return decide.run(
        spec,
        f.config(policy__kubernetes__kubelet_dir=str(kubelet_dir), **cfg),
        inventory_source=lambda _c: inventory(),
        checkpoint_source=checkpoint,
        rootfs="/containers/abc/rootfs",
    )


def with_nodes(spec: dict[str, Any], *nodes: tuple[str, int, int]) -> dict[str, Any]:
    """``spec`` as containerd writes it from a claim's CDI spec: its device nodes, and the
    spec's common env appended after the image's (NVIDIA_VISIBLE_DEVICES=void)."""
    spec["linux"]["devices"] = [
        {"path": p, "type": "c", "major": major, "minor": minor, "fileMode": 0o666}
        for p, major, minor in nodes
    ]
    spec["process"]["env"] += [
        "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu",
        "NVIDIA_VISIBLE_DEVICES=void",
    ]
    return spec


def gpu_nodes(*minors: int) -> list[tuple[str, int, int]]:
    return [(f"/dev/nvidia{m}", 195, m) for m in minors]


def mig_nodes(mig: int) -> list[tuple[str, int, int]]:
    caps = inventory().gpus[6].mig_devices[mig].caps
    return [("/dev/nvidia6", 195, 6), *((c.path, c.major, c.minor) for c in caps)]


def shown(out: Outcome) -> list[str]:
    return [d.display_id for d in out.decision.devices]


def engine_lines(out: Outcome) -> list[str]:
    return [r.why for r in out.decision.reasons if r.channel == "engine-cdi"]


# --- the checkpoint ------------------------------------------------------------------------------


def test_the_checkpoint_as_kubelet_136_writes_it() -> None:
    raw = dra_state.state_bytes([dra_state.claim("c-1", "pod-gpu-x", [POD], ["gpu-0", "gpu-1"])])
    state = dra.state_from_bytes(raw, "/k/dra_manager_state")
    (claim,) = state.of_pod(POD)
    assert (claim.uid, claim.display, claim.pod_uids) == ("c-1", "ml/pod-gpu-x", (POD,))
    assert [(d.driver, d.name, d.share_id) for d in claim.devices] == [
        ("gpu.nvidia.com", "gpu-0", None),
        ("gpu.nvidia.com", "gpu-1", None),
    ]
    assert claim.devices[0].cdi_ids == ("k8s.gpu.nvidia.com/claim=c-1-gpu-0",)
    assert state.of_pod("another-pod") == ()


def test_the_entries_key_of_other_versions_and_a_share_id() -> None:
    one = dra_state.claim("c-1", "shared", [POD, "pod-2"], ["gpu-3"], share_id="s-1")
    state = dra.state_from_bytes(dra_state.state_bytes([one], key="Entries"), "p")
    assert state.of_pod("pod-2")[0].devices[0].share_id == "s-1"


def test_nulls_are_no_claims_and_no_devices() -> None:
    claims: Any
    for claims in ([], None):
        assert dra.state_from_bytes(dra_state.state_bytes(claims), "p").claims == ()
    entry = {"ClaimUID": "c", "ClaimName": None, "Namespace": None, "PodUIDs": None,
             "DriverState": {"gpu.nvidia.com": {"Devices": None}}}  # fmt: skip
    (claim,) = dra.state_from_bytes(dra_state.state_bytes([entry]), "p").claims
    assert (claim.name, claim.pod_uids, claim.devices) == ("", (), ())


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "is not valid JSON"),
        (b'{"Data": {}, "Checksum": 1}', "no Data string and Checksum number"),
        (b'{"Data": "{}", "Checksum": 1}', "fails its checksum"),
        (json.dumps({"Data": "[", "Checksum": zlib.crc32(b"[")}).encode(), "Data is not valid"),
        (json.dumps({"Data": "[]", "Checksum": zlib.crc32(b"[]")}).encode(), "not an object"),
        (b'{"Data": "\\ud800", "Checksum": 1}', "fails its checksum"),
    ],
)
def test_a_damaged_checkpoint_says_what_is_wrong_in_one_line(raw: bytes, message: str) -> None:
    with pytest.raises(CheckpointError, match=message) as exc:
        dra.state_from_bytes(raw, "/k/dra_manager_state")
    assert "\n" not in str(exc.value) and "/k/dra_manager_state" in str(exc.value)


def test_a_missing_checkpoint_is_a_node_without_dra(tmp_path: Path) -> None:
    assert dra.read_state(str(tmp_path / "dra_manager_state")).claims == ()


def test_nvidias_device_names_map_to_the_inventory() -> None:
    inv = inventory()
    assert dra.nvidia_device("gpu-3", inv) == (f.gpu_uuid(3),)
    assert dra.nvidia_device("gpu-6-mig-2g20gb-14-4", inv) == (f.mig_uuid(6, 1),)
    assert dra.nvidia_device("gpu-6", inv) == ()  # a MIG-mode GPU is published as its MIGs
    assert dra.nvidia_device("gpu-9", inv) == ()
    assert dra.nvidia_device("gpu-6-mig-7g80gb-0-0", inv) == ()
    assert dra.nvidia_device("gpu-x", inv) == dra.nvidia_device("nic-0", inv) == ()


# --- GPUs the engine injected from a claim's CDI spec --------------------------------------------


def test_a_claims_gpu_is_kept_and_named(tmp_path: Path) -> None:
    """A DRA pod with one GPU: before, "no GPU request in the spec", gpu_container false."""
    dra_state.write(tmp_path, [dra_state.claim("c-1", "pod-gpu-x", [POD], ["gpu-2"])])
    out = run(with_nodes(f.spec(annotations=f.k8s()), *gpu_nodes(2)), tmp_path)
    assert out.decision.gpu_container and shown(out) == ["2"]
    assert out.decision.channel == "engine-cdi"
    assert engine_lines(out)[0].endswith(
        "allocated to pod ml/trainer (uid pod-uid-1) container 'main' in DRA claim "
        "ml/pod-gpu-x (gpu-2 of gpu.nvidia.com)"
    )


def test_two_gpus_of_two_claims(tmp_path: Path) -> None:
    dra_state.write(
        tmp_path,
        [
            dra_state.claim("c-1", "a", [POD], ["gpu-1"]),
            dra_state.claim("c-2", "b", [POD], ["gpu-4"]),
        ],
    )
    out = run(with_nodes(f.spec(annotations=f.k8s()), *gpu_nodes(1, 4)), tmp_path)
    assert shown(out) == ["1", "4"]
    assert "DRA claims ml/a (gpu-1 of gpu.nvidia.com), ml/b (gpu-4" in engine_lines(out)[0]


def test_a_mig_claim(tmp_path: Path) -> None:
    dra_state.write(tmp_path, [dra_state.claim("c-1", "m", [POD], ["gpu-6-mig-2g20gb-14-4"])])
    assert shown(run(with_nodes(f.spec(annotations=f.k8s()), *mig_nodes(1)), tmp_path)) == ["6:1"]
    with pytest.raises(RequestError, match=r"GPU 6:0 .* ml/m \(gpu-6-mig-2g20gb-14-4"):
        run(with_nodes(f.spec(annotations=f.k8s()), *mig_nodes(0)), tmp_path)


def test_a_gpu_beside_the_claims_is_refused(tmp_path: Path) -> None:
    """A forged CDI spec adds GPU 5 to a pod whose claim holds GPU 2: the create fails."""
    dra_state.write(tmp_path, [dra_state.claim("c-1", "pod-gpu-x", [POD], ["gpu-2"])])
    with pytest.raises(RequestError) as exc:
        run(with_nodes(f.spec(annotations=f.k8s()), *gpu_nodes(2, 5)), tmp_path)
    assert "the engine injected /dev/nvidia5 (GPU 5" in str(exc.value)
    assert "DRA claim ml/pod-gpu-x (gpu-2 of gpu.nvidia.com) allocates 2" in str(exc.value)


def test_a_claim_of_another_pod_covers_nothing(tmp_path: Path) -> None:
    dra_state.write(tmp_path, [dra_state.claim("c-1", "x", ["pod-uid-2"], ["gpu-2"])])
    with pytest.raises(RequestError) as exc:
        run(with_nodes(f.spec(annotations=f.k8s()), *gpu_nodes(2)), tmp_path)
    assert "no claim of this pod; prepared for other pods: ml/x (gpu-2) for pod pod-uid-2" in str(
        exc.value
    )


def test_another_drivers_device_is_no_gpu(tmp_path: Path) -> None:
    """The example driver's gpu-2 is not NVIDIA's GPU 2."""
    one = dra_state.claim("c-1", "x", [POD], ["gpu-2"], driver="gpu.example.com")
    dra_state.write(tmp_path, [one])
    with pytest.raises(RequestError, match="no claim of this pod"):
        run(with_nodes(f.spec(annotations=f.k8s()), *gpu_nodes(2)), tmp_path)


def test_a_damaged_checkpoint_refuses_with_its_reason(tmp_path: Path) -> None:
    (tmp_path / "dra_manager_state").write_text('{"Data": "{}", "Checksum": 7}')
    with pytest.raises(RequestError, match="fails its checksum"):
        run(with_nodes(f.spec(annotations=f.k8s()), *gpu_nodes(2)), tmp_path)


def test_the_device_plugin_and_a_claim_together(tmp_path: Path) -> None:
    """GPU 1 from the device plugin (cdi-cri), GPU 2 from a claim: both kept, each named."""
    dra_state.write(tmp_path, [dra_state.claim("c-1", "x", [POD], ["gpu-2"])])
    spec = with_nodes(f.spec(annotations=f.k8s()), *gpu_nodes(1, 2))
    out = run(spec, tmp_path, allocated=[f.gpu_uuid(1)])
    assert shown(out) == ["1", "2"]
    why = engine_lines(out)
    assert "in the kubelet checkpoint" in why[0] and "in DRA claim ml/x (gpu-2" in why[1]


@pytest.mark.parametrize(
    "env",
    [["NVIDIA_VISIBLE_DEVICES=all"], []],
    ids=["image-all-then-cdi-void", "cdi-void-only"],
)
def test_the_images_all_neither_refuses_the_claim_nor_grants_more(
    tmp_path: Path, env: list[str]
) -> None:
    """containerd appends the CDI spec's NVIDIA_VISIBLE_DEVICES=void after the image's `all`:
    read as runc does (the last wins), the pod asks for nothing and keeps its claim's GPU."""
    dra_state.write(tmp_path, [dra_state.claim("c-1", "x", [POD], ["gpu-2"])])
    out = run(with_nodes(f.spec(env=env, annotations=f.k8s()), *gpu_nodes(2)), tmp_path)
    assert shown(out) == ["2"] and not out.decision.refused


def test_the_images_all_without_the_drivers_void_grants_no_other_gpu(tmp_path: Path) -> None:
    """A CDI spec without the void env: the image's `all` is a Kubernetes env request the
    checkpoint does not back (refused quietly as today); the claim's GPU alone is kept."""
    dra_state.write(tmp_path, [dra_state.claim("c-1", "x", [POD], ["gpu-2"])])
    spec = with_nodes(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s()), *gpu_nodes(2)
    )
    spec["process"]["env"] = [e for e in spec["process"]["env"] if not e.endswith("=void")]
    out = run(spec, tmp_path)
    assert shown(out) == ["2"]


def test_a_pod_with_no_gpu_node_never_reads_the_state(tmp_path: Path) -> None:
    """The hot path: no GPU node in the spec, the checkpoint is not even opened."""
    (tmp_path / "dra_manager_state").mkdir()  # opening it would fail
    out = run(f.spec(env=["NVIDIA_VISIBLE_DEVICES=void"], annotations=f.k8s()), tmp_path)
    assert not out.decision.gpu_container


def test_a_shared_claim_on_an_mps_gpu_gets_the_mps_edits(tmp_path: Path) -> None:
    """The engine applied the claim's CDI spec; gpuhook adds what no CDI spec gives: the MPS
    client's env and pipe folder (the engine-only path injects nothing else)."""
    claim = dra_state.claim("c-1", "shared", [POD, "pod-uid-2"], ["gpu-1"], share_id="s")
    dra_state.write(tmp_path, [claim])
    spec = with_nodes(f.spec(annotations=f.k8s()), *gpu_nodes(1))
    out = decide.run(
        spec,
        f.config(policy__kubernetes__kubelet_dir=str(tmp_path), mps__gpus=[1], mps__replicas=2),
        inventory_source=lambda _c: inventory(),
        checkpoint_source=lambda path, uid, name: Allocation(uid, name, (), path),
        mps_probe=lambda _pipe: 1,
        mps_admit=lambda _plan: None,
    )
    assert out.mps is not None and out.mps.group == "gpu1"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in out.edits.env
    assert not out.edits.device_nodes  # the engine's nodes are not injected twice
    privileged = with_nodes(f.spec(annotations=f.k8s(), privileged=True), *gpu_nodes(1))
    out = decide.run(
        privileged,
        f.config(policy__kubernetes__kubelet_dir=str(tmp_path), mps__gpus=[1], mps__replicas=2),
        inventory_source=lambda _c: inventory(),
        checkpoint_source=lambda path, uid, name: Allocation(uid, name, (), path),
        mps_probe=lambda _pipe: None,  # a daemon down would refuse it: it is never asked
    )
    assert out.mps is None

"""NVIDIA's device plugin and GPUs the engine injects (issue 33), as pure decisions through
:func:`gpuhook.runtime.decide.run` with stand-in sources: the plugin's CDI kind, its index ids,
the reasons every record keeps, and device nodes the engine put into the spec from a CDI spec."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhook.errors import RequestError
from gpuhook.model.decision import Request
from gpuhook.pipeline import engine, request
from gpuhook.pipeline.flow import Outcome
from gpuhook.pipeline.kubelet import Allocation
from gpuhook.records import writer
from gpuhook.runtime import decide
from tests import factories as f

PLUGIN_KIND = "k8s.device-plugin.nvidia.com/gpu"
PLUGIN_KEY = "cdi.k8s.io/nvidia-device-plugin_2f1c6a4e-7c1b-4c7d-9d7e-0f6a5b8e1d22"


def run(
    spec: dict[str, Any],
    allocated: list[str] | None = None,
    checkpoint_error: str = "",
    sources: tuple[engine.AllocationSource, ...] = (),
    **cfg: Any,
) -> Outcome:
    """``allocated``: the checkpoint's nvidia.com/gpu ids for the container (None: nothing)."""

    def checkpoint(path: str, uid: str, name: str) -> Allocation:
        if checkpoint_error:
            from gpuhook.errors import CheckpointError

            raise CheckpointError(checkpoint_error)
        resources = (("nvidia.com/gpu", tuple(allocated)),) if allocated else ()
        return Allocation(uid, name, resources, path)

    return decide.run(
        spec,
        f.config(**cfg),
        inventory_source=lambda _c: f.inventory(8, {6: 3}),
        checkpoint_source=checkpoint,
        rootfs="/containers/abc/rootfs",
        allocation_sources=sources,
    )


def with_nodes(spec: dict[str, Any], *nodes: tuple[str, int, int]) -> dict[str, Any]:
    """``spec`` with device nodes as an engine writes them from a CDI spec."""
    spec["linux"]["devices"] = [
        {"path": p, "type": "c", "major": major, "minor": minor, "fileMode": 0o666}
        for p, major, minor in nodes
    ]
    return spec


def shown(out: Outcome) -> list[str]:
    return [d.display_id for d in out.decision.devices]


def lines(out: Outcome, channel: str) -> list[str]:
    return [f"{r.verdict}: {r.why}" for r in out.decision.reasons if r.channel == channel]


# --- 1. the CDI kinds that mean GPUs are configuration ------------------------------------------


def test_the_device_plugins_cdi_annotation_is_a_gpu_request() -> None:
    """cdi-annotations: before, `k8s.device-plugin.nvidia.com/gpu=<uuid>` was another vendor's
    device, and a pod allocated 2 GPUs got none under containerd 1.6."""
    value = f"{PLUGIN_KIND}={f.gpu_uuid(2)},{PLUGIN_KIND}={f.gpu_uuid(3)}"
    spec = f.spec(annotations={**f.k8s(), PLUGIN_KEY: value})
    out = run(spec, allocated=[f.gpu_uuid(2), f.gpu_uuid(3)])
    assert out.decision.channel == "cdi-annotation" and shown(out) == ["2", "3"]
    assert out.request.channels[0].value == value


def test_the_gpu_kinds_come_from_the_policy() -> None:
    spec = f.spec(annotations={PLUGIN_KEY: f"{PLUGIN_KIND}={f.gpu_uuid(2)}"})
    out = run(spec, policy__cdi_kinds=["nvidia.com/gpu"])
    assert not out.decision.gpu_container
    assert lines(out, "cdi-annotation") == [
        f"ignored: {PLUGIN_KEY}: a CDI device of another kind, not a GPU (left to its own CDI "
        "handler; GPU kinds: policy.cdi_kinds)"
    ]
    mig = f"k8s.device-plugin.nvidia.com/mig={f.mig_uuid(6, 1)}"
    assert shown(run(f.spec(annotations={PLUGIN_KEY: mig}))) == ["6:1"]


# --- 2. deviceIDStrategy index --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allocated", "env", "want"),
    [
        (["0", "1"], "0,1", ["0", "1"]),  # envvar strategy with index ids
        (["6:1"], "6:1", ["6:1"]),  # a MIG device, as NVIDIA's plugin numbers it
        (["1::0", "1::3"], "all", ["1"]),  # time-slicing replicas of index ids
    ],
)
def test_index_ids_resolve_and_verify_as_uuids_do(
    allocated: list[str], env: str, want: list[str]
) -> None:
    """Before: "the kubelet allocated '0' ... which is not a GPU or MIG UUID"."""
    spec = f.spec(env=[f"NVIDIA_VISIBLE_DEVICES={env}"], annotations=f.k8s())
    assert shown(run(spec, allocated=allocated)) == want


def test_index_ids_are_held_to_the_allocation() -> None:
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=0,1"], annotations=f.k8s())
    out = run(spec, allocated=["1"])
    assert shown(out) == ["1"]
    assert any("not allocated to this container: 0" in line for line in lines(out, "env"))
    with pytest.raises(RequestError, match=r"allocated 9 .* no such device"):
        run(spec, allocated=["9"])


def test_an_allocated_id_of_no_known_form_still_fails_in_one_line() -> None:
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    with pytest.raises(RequestError, match="not a GPU or MIG id"):
        run(spec, allocated=["zero"])


# --- 3. reasons survive into every record ---------------------------------------------------------


def test_a_record_without_a_decision_keeps_why_each_cdi_name_was_ignored() -> None:
    """Before: the record of a container without a decision said only "no GPU request"."""
    spec = f.spec(
        annotations={
            "cdi.k8s.io/rdma": "nvidia.com/net-rdma=0000:3b:00.0",
            PLUGIN_KEY: f"{PLUGIN_KIND}={f.gpu_uuid(1)}",
        }
    )
    req = request.parse(spec, cdi_kinds=("nvidia.com/gpu",))
    assert isinstance(req, Request) and req.channels == ()
    record = writer.build("c1", "/b", req)
    reasons = record["decision"]["reasons"]
    assert [(r["channel"], r["value"]) for r in reasons] == [
        ("-", ""),
        ("cdi-annotation", f"{PLUGIN_KIND}={f.gpu_uuid(1)}"),
        ("cdi-annotation", "nvidia.com/net-rdma=0000:3b:00.0"),
    ]
    assert all("another kind" in r["why"] for r in reasons[1:])


# --- 4. GPUs the engine injects -----------------------------------------------------------------


def test_an_allocated_gpu_the_engine_injected_is_recorded_with_its_channel() -> None:
    """cdi-cri under containerd 2.x: no annotation, no env; the engine put GPU 3's node there."""
    spec = with_nodes(f.spec(annotations=f.k8s()), ("/dev/nvidia3", 195, 3))
    out = run(spec, allocated=[f.gpu_uuid(3)])
    assert out.decision.channel == "engine-cdi" and shown(out) == ["3"]
    assert not out.decision.refused
    assert lines(out, "engine-cdi") == [
        f"granted: GPU 3 ({f.gpu_uuid(3)}), injected by the engine: allocated to pod "
        "ml/trainer (uid pod-uid-1) container 'main' in the kubelet checkpoint "
        "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    ]
    assert out.edits.engine_injected == (f.gpu_uuid(3),)
    assert not out.changed  # the engine injected what its CDI spec says; gpuhook adds nothing


def test_a_gpu_the_engine_injected_that_no_allocation_covers_fails_the_create() -> None:
    """A forged or misconfigured CDI spec: before, the container ran with nvidia3 and its record
    said "no GPU request in the spec"."""
    spec = with_nodes(f.spec(annotations=f.k8s()), ("/dev/nvidia3", 195, 3))
    with pytest.raises(RequestError) as err:
        run(spec, allocated=[f.gpu_uuid(1)])
    assert str(err.value) == (
        f"the engine injected /dev/nvidia3 (GPU 3 ({f.gpu_uuid(3)})) into pod ml/trainer "
        "(uid pod-uid-1) container 'main', but no allocation covers it (the kubelet checkpoint "
        "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint allocates 1): a "
        "misconfigured or forged CDI spec (policy.kubernetes.engine_devices: verify)"
    )
    unknown = with_nodes(f.spec(annotations=f.k8s()), ("/dev/nvidia9", 195, 9))
    with pytest.raises(RequestError, match=r"minor 9, no GPU of this node's inventory"):
        run(unknown, allocated=[f.gpu_uuid(1)])
    renamed = with_nodes(f.spec(annotations=f.k8s()), ("/dev/gpu-x", 195, 3))  # any path
    with pytest.raises(RequestError, match="injected /dev/gpu-x"):
        run(renamed)
    with pytest.raises(RequestError, match="cannot be read"):
        run(spec, checkpoint_error="kubelet checkpoint cannot be read")


def test_the_policy_may_allow_what_no_allocation_covers() -> None:
    spec = with_nodes(f.spec(annotations=f.k8s()), ("/dev/nvidia3", 195, 3))
    out = run(spec, policy__kubernetes__engine_devices="allow")
    assert shown(out) == ["3"] and out.decision.channel == "engine-cdi"
    assert "kept (policy.kubernetes.engine_devices: allow)" in lines(out, "engine-cdi")[0]


def test_a_gpu_the_engine_injected_into_a_standalone_container_is_the_users_choice() -> None:
    """docker/podman --device /dev/nvidia0 (or a CDI device): recorded, never refused."""
    out = run(with_nodes(f.spec(), ("/dev/nvidia0", 195, 0)))
    assert shown(out) == ["0"] and out.decision.channel == "engine-cdi"
    assert "a non-Kubernetes container (the engine's user chose it" in lines(out, "engine-cdi")[0]


def test_the_images_all_with_an_engine_node_is_not_recorded_refused() -> None:
    """Issue 35's case: the image says NVIDIA_VISIBLE_DEVICES=all, env requests are ignored,
    and the engine gave the container /dev/nvidia0: it keeps the node, and the record says so."""
    spec = with_nodes(f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"]), ("/dev/nvidia0", 195, 0))
    out = run(spec, policy__standalone__env_requests="ignore")
    assert not out.decision.refused and shown(out) == ["0"]
    assert lines(out, "env")[0].startswith("refused: env requests of non-Kubernetes")
    assert f"NVIDIA_VISIBLE_DEVICES={f.gpu_uuid(0)}" in out.spec["process"]["env"]  # not "all"
    assert [d["path"] for d in out.spec["linux"]["devices"]] == ["/dev/nvidia0"]  # nothing more


def test_a_pods_image_all_with_its_allocated_engine_node() -> None:
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    out = run(with_nodes(spec, ("/dev/nvidia0", 195, 0)), allocated=[f.gpu_uuid(0)])
    assert out.decision.channel == "env" and shown(out) == ["0"]
    assert lines(out, "engine-cdi") == [
        f"granted: GPU 0 ({f.gpu_uuid(0)}), injected by the engine, is what env granted"
    ]


def test_a_privileged_container_keeps_every_device_the_engine_gave_it() -> None:
    nodes = [(f"/dev/nvidia{i}", 195, i) for i in range(8)] + [("/dev/nvidiactl", 195, 255)]
    out = run(with_nodes(f.spec(annotations=f.k8s(), privileged=True), *nodes))
    assert shown(out) == [str(i) for i in range(8)]
    assert not out.changed  # recorded; left as the engine made it (no env, no driver files)


def test_a_mig_device_the_engine_injected_is_found_by_its_caps_nodes() -> None:
    """GPU 6's node with the nvidia-caps nodes of its MIG device 1 (index id 6:1, allocated)."""
    inv = f.inventory(8, {6: 3})
    caps = inv.gpus[6].mig_devices[1].caps
    nodes = [("/dev/nvidia6", 195, 6), *((c.path, c.major, c.minor) for c in caps)]
    spec = with_nodes(f.spec(annotations=f.k8s()), *nodes)
    assert shown(run(spec, allocated=["6:1"])) == ["6:1"]
    with pytest.raises(RequestError, match=r"GPU 6:1"):
        run(spec, allocated=["6:0"])


def test_another_allocation_source_covers_what_the_checkpoint_does_not() -> None:
    """The source interface DRA's claims will use: one more answer, the same rule."""

    def dra(kube: Any) -> engine.Allocated:
        assert kube.pod_uid == "pod-uid-1"
        return engine.Allocated("DRA claim ml/gpu-claim", (f.gpu_uuid(3),))

    spec = with_nodes(f.spec(annotations=f.k8s()), ("/dev/nvidia3", 195, 3))
    out = run(spec, sources=(dra,))
    assert lines(out, "engine-cdi")[0].endswith("in DRA claim ml/gpu-claim")


def test_a_sandbox_never_keeps_an_engine_gpu() -> None:
    spec = with_nodes(f.spec(annotations=f.k8s(ctype="sandbox")), ("/dev/nvidia3", 195, 3))
    with pytest.raises(RequestError, match="its identity: a pod sandbox"):
        run(spec, allocated=[f.gpu_uuid(3)])


def test_control_nodes_alone_are_no_engine_gpu() -> None:
    spec = with_nodes(f.spec(annotations=f.k8s()), ("/dev/nvidiactl", 195, 255))
    assert request.parse(spec).engine_devices == ()
    assert not run(spec).decision.gpu_container

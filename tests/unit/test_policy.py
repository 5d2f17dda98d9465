"""Request parsing and the trust policy, as pure data: who gets which GPU and why."""

from __future__ import annotations

import pytest

from gpuhook.errors import RequestError
from gpuhook.model.decision import Decision
from gpuhook.pipeline import policy, request
from gpuhook.pipeline.kubelet import Allocation
from tests import factories as f

INV = f.inventory(8, {6: 3})


def decide(
    spec: dict[str, object], allocation: list[str] | None = None, error: str = "", **cfg: object
) -> Decision:
    config = f.config(**cfg)
    req = request.parse(spec)
    alloc = None
    if not policy.needs_allocation(req, config.policy):  # as flow.run: no checkpoint read
        allocation, error = None, ""
    if allocation is not None and req.kubernetes is not None:
        alloc = Allocation(
            req.kubernetes.pod_uid,
            req.kubernetes.container_name,
            (("nvidia.com/gpu", tuple(allocation)),),
            "checkpoint",
        )
    return policy.decide(req, config.policy, config.default_capabilities, lambda: INV, alloc, error)


def ids(decision: Decision) -> list[str]:
    return [d.display_id for d in decision.devices]


def test_no_request_is_not_a_gpu_container() -> None:
    d = decide(f.spec())
    assert not d.gpu_container and not d.injects
    assert d.reasons[0].why == "no GPU request in the spec"


@pytest.mark.parametrize("value", ["", "void", "VOID", " "])
def test_void_and_empty_are_no_request(value: str) -> None:
    assert not decide(f.spec(env=[f"NVIDIA_VISIBLE_DEVICES={value}"])).gpu_container


def test_standalone_env_trusted_by_default() -> None:
    d = decide(f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"]))
    assert ids(d) == ["1"] and d.channel == "env"
    assert d.capabilities == ("compute", "utility")
    assert "policy.standalone.env_requests is trust" in d.reasons[0].why


def test_standalone_env_ignored_by_policy() -> None:
    d = decide(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"]), policy__standalone__env_requests="ignore"
    )
    assert d.refused and not d.devices
    assert "policy.standalone.env_requests: ignore" in d.reasons[0].why


def test_default_all_leak_closed_for_kubernetes_without_allocation() -> None:
    d = decide(f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s()), allocation=[])
    assert d.refused and not d.devices
    assert "no GPU resource is allocated to pod ml/trainer" in d.reasons[0].why


def test_kubernetes_all_gets_only_the_allocation() -> None:
    d = decide(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s()), allocation=[f.gpu_uuid(2)]
    )
    assert ids(d) == ["2"]
    assert "verified against the kubelet checkpoint" in d.reasons[0].why


def test_kubernetes_env_naming_another_pods_gpu_is_refused() -> None:
    d = decide(
        f.spec(env=[f"NVIDIA_VISIBLE_DEVICES={f.gpu_uuid(5)}"], annotations=f.k8s()),
        allocation=[f.gpu_uuid(2)],
    )
    assert d.refused and not d.devices


def test_kubernetes_partial_list_grants_the_allocated_part() -> None:
    d = decide(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=2,5"], annotations=f.k8s()),
        allocation=[f.gpu_uuid(2) + "::3"],
    )
    assert ids(d) == ["2"]
    assert any(r.verdict == "refused" and "5" in r.why for r in d.reasons)


def test_init_container_of_gpu_pod_gets_nothing() -> None:
    d = decide(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s(container="init")),
        allocation=[],
    )
    assert d.refused


def test_sandbox_never_gets_gpus_even_privileged() -> None:
    d = decide(
        f.spec(
            env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s(ctype="sandbox"), privileged=True
        )
    )
    assert d.refused and d.reasons[0].why == "a pod sandbox never gets GPUs"


def test_privileged_kubernetes_container_is_trusted() -> None:
    d = decide(f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s(), privileged=True))
    assert ids(d) == [str(i) for i in range(8)]


def test_checkpoint_error_refuses_with_reason() -> None:
    d = decide(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=0"], annotations=f.k8s()),
        error="kubelet checkpoint /x is not valid JSON",
    )
    assert d.refused and "cannot verify against the kubelet checkpoint" in d.reasons[0].why


def test_kubernetes_trust_and_ignore_modes() -> None:
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=3"], annotations=f.k8s())
    assert ids(decide(spec, policy__kubernetes__env_requests="trust")) == ["3"]
    assert decide(spec, policy__kubernetes__env_requests="ignore").refused


def test_cdi_annotation_wins_over_env() -> None:
    d = decide(
        f.spec(
            env=["NVIDIA_VISIBLE_DEVICES=all"],
            annotations={**f.k8s(), "cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=4"},
        ),
        allocation=[f.gpu_uuid(4)],
    )
    assert ids(d) == ["4"] and d.channel == "cdi-annotation"
    assert [r.verdict for r in d.reasons] == ["granted", "superseded"]


def test_cdi_foreign_vendor_is_left_alone() -> None:
    d = decide(f.spec(annotations={"cdi.k8s.io/x": "vendor.com/net=eth1"}))
    assert not d.gpu_container
    assert d.reasons[0].verdict == "ignored"


def test_mount_markers() -> None:
    marker = {
        "destination": "/var/run/nvidia-container-devices/" + f.gpu_uuid(3),
        "type": "bind",
        "source": "/dev/null",
    }
    d = decide(f.spec(mounts=[marker], annotations=f.k8s()), allocation=[f.gpu_uuid(3)])
    assert ids(d) == ["3"] and d.channel == "mount-marker"


def test_mount_marker_with_dotdot_is_malformed() -> None:
    marker = {
        "destination": "/var/run/nvidia-container-devices/../../etc",
        "type": "bind",
        "source": "/dev/null",
    }
    with pytest.raises(RequestError, match="malformed volume-mount marker"):
        decide(f.spec(mounts=[marker]))


def test_docker_gpus_hook_is_trusted_under_ignore() -> None:
    hooks = {
        "prestart": [
            {
                "path": "/usr/bin/nvidia-container-runtime-hook",
                "args": ["nvidia-container-runtime-hook", "prestart"],
            }
        ]
    }
    d = decide(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=0"], hooks=hooks),
        policy__standalone__env_requests="ignore",
    )
    assert ids(d) == ["0"] and d.channel == "docker-gpus"


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("6:1", ["6:1"]),
        (f.mig_uuid(6, 2), ["6:2"]),
        ("nvidia.com/gpu=6:0", ["6:0"]),
        (f"MIG-{f.gpu_uuid(6)}/2/0", ["6:1"]),
        (f.gpu_uuid(1).upper().replace("GPU", "gpu"), ["1"]),
        (" 1 , 1,2 ", ["1", "2"]),
        ("ALL,0", [str(i) for i in range(8)]),
    ],
)
def test_id_forms(value: str, want: list[str]) -> None:
    assert ids(decide(f.spec(env=[f"NVIDIA_VISIBLE_DEVICES={value}"]))) == want


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("9", "unknown GPU index 9 (this node has GPUs 0-7)"),
        ("GPU-nope", "unknown GPU UUID GPU-nope"),
        ("2:0", "GPU 2 is not in MIG mode"),
        ("6:7", "GPU 6 has no MIG device 7"),
        ("amd.com/gpu=0", "is not an NVIDIA GPU"),
        ("none,0", "'none' or 'void' cannot be combined"),
        (",".join(str(i) for i in range(10000)), "too many device ids (10000 > 256)"),
    ],
)
def test_bad_trusted_requests_fail_with_one_line(value: str, message: str) -> None:
    with pytest.raises(RequestError) as info:
        decide(f.spec(env=[f"NVIDIA_VISIBLE_DEVICES={value}"]))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_malformed_untrusted_request_is_refused_not_failed() -> None:
    d = decide(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=none,0"], annotations=f.k8s()),
        allocation=[f.gpu_uuid(0)],
    )
    assert d.refused and "malformed GPU request" in d.reasons[0].why


def test_none_is_driver_only() -> None:
    d = decide(f.spec(env=["NVIDIA_VISIBLE_DEVICES=none"]))
    assert d.driver_only and not d.devices and d.injects


def test_capabilities() -> None:
    d = decide(f.spec(env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=video,compute"]))
    assert d.capabilities == ("compute", "video")
    d = decide(f.spec(env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"]))
    assert "graphics" in d.capabilities
    with pytest.raises(RequestError, match="unknown driver capability 'bogus'"):
        decide(f.spec(env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=bogus"]))


def test_refusal_needs_no_inventory() -> None:
    config = f.config()
    req = request.parse(f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s()))

    def no_inventory() -> object:
        raise AssertionError("inventory read for a refusal")

    d = policy.decide(
        req,
        config.policy,
        config.default_capabilities,
        no_inventory,  # type: ignore[arg-type]
        Allocation("pod-uid-1", "main", (), "x"),
    )
    assert d.refused


# --- issue 19: the trust holes real Kubernetes stacks open -------------------------------------

HOOKS_D = {
    "prestart": [
        {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]},
    ]
}
MARKER = {
    "destination": "/var/run/nvidia-container-devices/all",
    "type": "bind",
    "source": "/dev/null",
}


def test_cri_dockerd_container_is_known_by_the_kubelets_mounts() -> None:
    """No annotation at all (docker does not copy Kubernetes labels into the spec): the kubelet's
    per-pod mounts make it a Kubernetes container, so the image's `all` is verified."""
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], mounts=f.kubelet_mounts())
    req = request.parse(spec)
    assert req.kubernetes is not None and req.kubernetes.pod_uid == "pod-uid-1"
    assert req.kubernetes.container_name == "main" and req.kubernetes.source == "kubelet mounts"
    assert decide(spec, allocation=[]).refused
    assert ids(decide(spec, allocation=[f.gpu_uuid(5)])) == ["5"]


def test_kubelet_dir_is_configurable() -> None:
    mounts = f.kubelet_mounts(kubelet_dir="/data/kubelet")
    assert request.parse(f.spec(mounts=mounts)).kubernetes is None
    assert request.parse(f.spec(mounts=mounts), "/data/kubelet/").kubernetes is not None


@pytest.mark.parametrize(
    "mounts",
    [
        f.kubelet_mounts(uid="pod-uid-2"),  # another pod than the annotations say
        f.kubelet_mounts(container="sidecar"),  # another container
        [*f.kubelet_mounts(), *f.kubelet_mounts(uid="pod-uid-2")],  # two pods
    ],
)
def test_annotations_and_mounts_disagreeing_refuse_even_privileged(
    mounts: list[dict[str, object]],
) -> None:
    spec = f.spec(
        env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s(), mounts=mounts, privileged=True
    )
    d = decide(spec, allocation=[f.gpu_uuid(0)])
    assert d.refused and "treated as a pod sandbox" in d.reasons[0].why


def test_nvidia_hooks_d_hook_in_a_kubernetes_container_is_an_env_request() -> None:
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s(), hooks=HOOKS_D)
    d = decide(spec, allocation=[])
    assert d.refused and d.channel == "env"
    d = decide(spec, allocation=[f.gpu_uuid(2)])
    assert ids(d) == ["2"] and "verified against the kubelet checkpoint" in d.reasons[0].why


def test_all_cdi_annotations_are_one_request() -> None:
    annotations = {
        **f.k8s(),
        "cdi.k8s.io/nvidia-device-plugin_a": "nvidia.com/gpu=1",
        "cdi.k8s.io/nvidia-device-plugin_b": "nvidia.com/gpu=3",
    }
    d = decide(f.spec(annotations=annotations), allocation=[f.gpu_uuid(1), f.gpu_uuid(3)])
    assert ids(d) == ["1", "3"]


def test_a_malformed_superseded_channel_is_a_reason_line() -> None:
    spec = f.spec(
        env=["NVIDIA_VISIBLE_DEVICES=none,0"],
        annotations={**f.k8s(), "cdi.k8s.io/x": "nvidia.com/gpu=0"},
    )
    d = decide(spec, allocation=[f.gpu_uuid(0)])
    assert ids(d) == ["0"]
    assert d.reasons[1].verdict == "superseded" and "malformed" in d.reasons[1].why
    d = decide(f.spec(env=["NVIDIA_VISIBLE_DEVICES=none,0"], annotations={"cdi.k8s.io/x": "0"}))
    assert ids(d) == ["0"]  # not Kubernetes: CDI trusted as such


@pytest.mark.parametrize(
    ("annotations", "why"),
    [
        # a CRI-O sandbox whose pod author added containerd's keys
        ({**f.crio(ctype="sandbox"), "io.kubernetes.cri.sandbox-uid": "pod-uid-1"}, "mixes"),
        # CRI-O copied the pod's annotation over its own container type
        (f.crio(copied={"io.kubernetes.cri-o.ContainerType": "container"}), "copied"),
        ({**f.crio(), "io.kubernetes.cri-o.Annotations": "not json"}, "not a JSON object"),
        ({k: v for k, v in f.crio().items() if k != "io.kubernetes.cri-o.Annotations"}, "missing"),
        ({k: v for k, v in f.k8s().items() if "container-type" not in k}, "is missing"),
        (f.k8s(ctype="podsandbox"), "'podsandbox' is unknown"),
    ],
)
def test_forged_or_unknown_identity_is_a_sandbox(annotations: dict[str, str], why: str) -> None:
    spec = f.spec(annotations={**annotations, "cdi.k8s.io/x": "nvidia.com/gpu=0"})
    d = decide(spec, allocation=[f.gpu_uuid(0)])
    assert d.refused and not d.devices
    assert "treated as a pod sandbox" in d.reasons[0].why and why in d.reasons[0].why


def test_crio_container_identity() -> None:
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.crio())
    assert ids(decide(spec, allocation=[f.gpu_uuid(6)])) == ["6"]
    sandbox = decide(
        f.spec(annotations={**f.crio(ctype="sandbox"), **MARKER_CDI}), allocation=[f.gpu_uuid(0)]
    )
    assert sandbox.refused and sandbox.reasons[0].why == "a pod sandbox never gets GPUs"


MARKER_CDI = {"cdi.k8s.io/x": "nvidia.com/gpu=0"}


def test_markers_are_verified_against_the_allocation() -> None:
    spec = f.spec(annotations=f.k8s(), mounts=[MARKER])
    assert decide(spec, allocation=[]).refused
    assert decide(spec, error="kubelet checkpoint /x not found").refused
    assert ids(decide(spec, allocation=[f.gpu_uuid(2)])) == ["2"]
    assert len(decide(spec, policy__kubernetes__env_requests="trust").devices) == 8
    assert len(decide(f.spec(annotations=f.k8s(), mounts=[MARKER], privileged=True)).devices) == 8


def test_cdi_is_verified_where_the_checkpoint_is_readable() -> None:
    spec = f.spec(annotations={**f.k8s(), "cdi.k8s.io/x": "nvidia.com/gpu=1,nvidia.com/gpu=3"})
    assert ids(decide(spec, allocation=[f.gpu_uuid(1)])) == ["1"]
    assert decide(spec, allocation=[]).refused
    d = decide(spec, error="kubelet checkpoint /x not found")
    assert ids(d) == ["1", "3"]
    assert any(r.channel == "kubelet-checkpoint" and "not verified" in r.why for r in d.reasons)


def test_malformed_marker_of_a_verified_pod_is_refused_not_failed() -> None:
    marker = {
        "destination": "/var/run/nvidia-container-devices/../../etc",
        "type": "bind",
        "source": "/dev/null",
    }
    d = decide(f.spec(mounts=[marker], annotations=f.k8s()), allocation=[f.gpu_uuid(1)])
    assert d.refused and "malformed volume-mount marker" in d.reasons[0].why
    assert "checkpoint" not in d.reasons[0].why  # it was not read: nothing to verify


def test_a_pods_nvidia_hook_without_env_names_no_device() -> None:
    """NVIDIA's hooks.d hook in a pod with no NVIDIA_VISIBLE_DEVICES: an empty env request,
    refused as such (the checkpoint is not read for it, so it is not blamed)."""
    hook = {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]}
    spec = f.spec(annotations=f.k8s(), hooks={"prestart": [hook]})
    d = decide(spec, allocation=[f.gpu_uuid(1)])
    assert d.refused and not d.devices
    assert d.reasons[0].why == "the request names no device"

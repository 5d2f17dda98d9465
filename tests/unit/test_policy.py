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
    assert "no nvidia.com/* devices are allocated to pod ml/trainer" in d.reasons[0].why


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
        )
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
    d = decide(f.spec(mounts=[marker], annotations=f.k8s()))
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

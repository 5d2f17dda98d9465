"""The parser's side of issue 23 (pure): what engines really write for privileged containers and
podman pods, CDI names of other kinds, NVIDIA's legacy hook, and keys runc reads differently."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhook.errors import SpecError
from gpuhook.pipeline import gofields, identity, request
from tests import factories as f

PODMAN_POD = {  # `podman run --pod p` (podman 4.3)
    "io.container.manager": "libpod",
    "io.kubernetes.cri-o.ContainerType": "container",
    "io.kubernetes.cri-o.SandboxID": "5ea2eee06f413b88",
    "io.kubernetes.cri-o.Created": "2026-11-26T08:50:57.087823702Z",
    "io.kubernetes.cri-o.TTY": "false",
}


def test_a_podman_pod_container_is_not_kubernetes_but_cri_o_keys_still_are() -> None:
    assert identity.identify(PODMAN_POD, [], "/var/lib/kubelet") is None
    sandbox = identity.identify(
        {**PODMAN_POD, "io.kubernetes.cri-o.ContainerType": "sandbox"}, [], "/var/lib/kubelet"
    )
    assert sandbox is not None and sandbox.problem  # refused as a sandbox, as before
    # one more CRI-O key (a kubelet label) and it is CRI-O's, judged as before
    forged = identity.identify({**PODMAN_POD, "io.kubernetes.pod.uid": "u"}, [], "/x")
    assert forged is not None and forged.problem
    crio = identity.identify(f.crio(), [], "/var/lib/kubelet")
    assert crio is not None and crio.container_type == "container" and not crio.problem


def _spec(caps: list[str], rules: list[dict[str, Any]]) -> dict[str, Any]:
    spec = f.spec()
    spec["process"]["capabilities"]["bounding"] = caps
    spec["linux"]["resources"]["devices"] = rules
    return spec


ALL_CAPS = ["CAP_CHOWN", *request.PRIVILEGED_CAPS, "CAP_SYS_PTRACE"]
OPEN = {"allow": True, "access": "rwm"}
CLOSED = {"allow": False, "access": "rwm"}


@pytest.mark.parametrize(
    ("caps", "rules", "privileged"),
    [
        (ALL_CAPS, [OPEN], True),  # docker/containerd/podman --privileged
        (ALL_CAPS, [CLOSED, OPEN], True),
        (ALL_CAPS, [{"allow": True, "type": "a", "major": -1, "minor": -1, "access": ""}], True),
        (["CAP_CHOWN", "CAP_SYS_ADMIN"], [CLOSED], False),  # capabilities.add: [SYS_ADMIN]
        (["CAP_CHOWN", "CAP_SYS_ADMIN"], [OPEN], False),
        (ALL_CAPS, [CLOSED], False),  # capabilities.add: [ALL], not privileged
        (ALL_CAPS, [OPEN, {"allow": False, "type": "c", "major": 195, "access": "rwm"}], False),
        (ALL_CAPS, [{"allow": True, "type": "c", "major": 195, "access": "rwm"}], False),
        (ALL_CAPS, [{"allow": True, "access": "r"}], False),
    ],
)
def test_privileged_is_what_engines_write(
    caps: list[str], rules: list[dict[str, Any]], privileged: bool
) -> None:
    assert request.privileged(_spec(caps, rules)) is privileged


def test_cdi_names_of_another_kind_are_reason_lines_not_a_request() -> None:
    only_rdma = request.parse(
        f.spec(annotations={"cdi.k8s.io/rdma": "nvidia.com/net-rdma=0000:3b:00.0"})
    )
    assert only_rdma.channels == ()
    assert [r.value for r in only_rdma.ignored] == ["nvidia.com/net-rdma=0000:3b:00.0"]
    both = request.parse(
        f.spec(
            annotations={
                "cdi.k8s.io/rdma": "nvidia.com/net-rdma=0000:3b:00.0",
                "cdi.k8s.io/gpu": "nvidia.com/gpu=GPU-1",
            }
        )
    )
    assert [(c.source, c.ids) for c in both.channels] == [
        ("annotation cdi.k8s.io/gpu", ("GPU-1",))  # the device names of the GPU kinds
    ]


LEGACY = {"prestart": [{"path": "/usr/bin/nvidia-container-toolkit", "args": ["x", "prestart"]}]}


@pytest.mark.parametrize(
    ("env", "ids"),
    [
        (["CUDA_VERSION=12.4.1"], ("all",)),
        (["CUDA_VERSION=12.4.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"], ()),  # not a legacy image
        (["CUDA_VERSION=12.4.1", "NVIDIA_VISIBLE_DEVICES=1"], ("1",)),
        ([], ()),
    ],
)
def test_the_legacy_hook_and_nvidias_legacy_image_rule(env: list[str], ids: tuple[str]) -> None:
    req = request.parse(f.spec(env=env, hooks=LEGACY, annotations=f.k8s()))
    assert [(c.channel, c.ids) for c in req.channels] == [("env", ids)]
    assert request.nvidia_hooks(f.spec(hooks=LEGACY)) == ("nvidia-container-toolkit",)
    assert request.parse(f.spec(env=["CUDA_VERSION=12.4.1"])).channels == ()  # no hook: no ask


@pytest.mark.parametrize(
    "spec",
    [
        {"Process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}},
        {"process": {"Env": []}},
        {"proce\u017fs": {}},  # Go folds the long s to S
        {"hooks": {"prestart": [{"PATH": "/x"}]}},
        {"mounts": [{"Destination": "/x"}]},
        {"linux": {"resources": {"devices": [{"Allow": True}]}}},
        {"process": {"capabilities": {"Bounding": []}}},
    ],
)
def test_a_key_runc_reads_as_another_field_is_refused(spec: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match="to runc \\(Go matches field names case-insensitively"):
        gofields.check(spec)


def test_keys_as_the_spec_spells_them_and_unknown_keys_pass() -> None:
    gofields.check(f.spec(hooks=LEGACY, annotations={"Process": "a map key, case-sensitive"}))
    gofields.check({"x-vendor": {"Process": 1}, "process": {"user": {"UID": 0}}})


def test_fold_is_gos_ascii_upper_case_with_the_two_runes_that_fold_to_ascii() -> None:
    assert gofields.fold("createContainer") == "CREATECONTAINER"
    assert gofields.fold("proce\u017fs") == "PROCESS"  # the long s
    assert gofields.fold("\u212aeep") == "KEEP"  # the Kelvin sign
    assert gofields.fold("caf\u00e9") == "CAF\u00e9"  # other runes stay as they are

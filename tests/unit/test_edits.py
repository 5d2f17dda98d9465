"""Edit application: idempotent, keeps unknown keys and the user's own entries."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhook.errors import SpecError
from gpuhook.model.decision import KIND_GPU, KIND_MIG, Decision, DeviceRef
from gpuhook.model.edits import ContainerEdits, Hook, Mount
from gpuhook.model.inventory import DeviceNode
from gpuhook.pipeline import apply, flow, inject, kubelet, policy, request
from gpuhook.runtime import decide
from tests import factories as f

_names = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=8)
_values = st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=10)
_paths = st.lists(
    st.text(alphabet="abcdefgh-_.", min_size=1, max_size=6).filter(lambda s: s not in (".", "..")),
    min_size=1,
    max_size=3,
).map(lambda p: "/" + "/".join(p))
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)


@st.composite
def _spec(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"ociVersion": "1.0.2"}
    for key in draw(st.lists(st.text(max_size=6), max_size=3)):
        if key not in ("process", "linux", "mounts", "hooks"):
            spec[key] = draw(_json)
    if draw(st.booleans()):
        spec["process"] = {
            "env": [f"{k}={v}" for k, v in draw(st.lists(st.tuples(_names, _values), max_size=5))],
            "x-extra": draw(_json),
        }
    if draw(st.booleans()):
        spec["mounts"] = [
            {"destination": p, "type": "bind", "source": "/src"}
            for p in draw(st.lists(_paths, max_size=4))
        ]
    if draw(st.booleans()):
        spec["linux"] = {
            "devices": [
                {"path": p, "type": "c", "major": 1, "minor": 3}
                for p in draw(st.lists(_paths, max_size=3))
            ],
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
        }
    if draw(st.booleans()):
        spec["hooks"] = {"prestart": [{"path": p} for p in draw(st.lists(_paths, max_size=2))]}
    return spec


@st.composite
def _edits(draw: st.DrawFn) -> ContainerEdits:
    return ContainerEdits(
        env=tuple(f"{k}={v}" for k, v in draw(st.lists(st.tuples(_names, _values), max_size=4))),
        device_nodes=tuple(
            DeviceNode(p, "/host" + p, 195, i, 0o666)
            for i, p in enumerate(draw(st.lists(_paths, max_size=3)))
        ),
        mounts=tuple(
            Mount("/host" + p, p, "bind", ("ro", "bind"))
            for p in draw(st.lists(_paths, max_size=3))
        ),
        hooks=tuple(
            Hook("createContainer", "/usr/bin/gpuhook", ("gpuhook", "hook", x))
            for x in draw(st.lists(st.sampled_from(["a", "b"]), max_size=2))
        ),
        remove_hooks=tuple(
            draw(st.lists(st.sampled_from(["nvidia-container-runtime-hook"]), max_size=1))
        ),
    )


def _env_keys(spec: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in spec.get("process", {}).get("env", []):
        k, _, v = item.partition("=")
        out.setdefault(k, v)
    return out


@settings(max_examples=400, deadline=None)
@given(_spec(), _edits())
def test_apply_is_idempotent_and_keeps_the_users_entries(
    spec: dict[str, Any], e: ContainerEdits
) -> None:
    before = json.loads(json.dumps(spec))
    once = apply.apply(spec, e)
    assert spec == before  # the input is never modified
    assert apply.apply(once, e) == once  # applying twice == applying once
    for key, value in before.items():  # unknown keys survive untouched
        if key not in ("process", "linux", "mounts", "hooks"):
            assert once[key] == value
    if "process" in before:
        assert once["process"]["x-extra"] == before["process"]["x-extra"]
    # the user's env: every variable not set by the edits keeps its (first) value
    edited = {x.partition("=")[0] for x in e.env}
    for k, v in _env_keys(before).items():
        if k not in edited:
            assert _env_keys(once)[k] == v
    last = {x.partition("=")[0]: x for x in e.env}  # for an edited key, the last edit wins
    for k, entry in last.items():  # gpuhook's value is the one the container sees (exactly once)
        assert [x for x in once["process"]["env"] if x.partition("=")[0] == k] == [entry]
    # the user's mounts and devices are all still there, unchanged and in order
    assert once.get("mounts", [])[: len(before.get("mounts", []))] == before.get("mounts", [])
    user_devices = before.get("linux", {}).get("devices", [])
    assert once.get("linux", {}).get("devices", [])[: len(user_devices)] == user_devices


def test_edits_validate_rejects_unsafe_paths() -> None:
    with pytest.raises(SpecError, match="must not contain"):
        apply.apply({}, ContainerEdits(mounts=(Mount("/h", "/usr/../etc", "bind"),)))
    with pytest.raises(SpecError, match="must be absolute"):
        apply.apply({}, ContainerEdits(device_nodes=(DeviceNode("dev/x", "/x", 1, 1),)))


def _outcome(spec: dict[str, Any], **cfg: Any) -> flow.Outcome:
    inv = f.inventory(8, {6: 3})
    return decide.run(
        spec,
        f.config(**cfg),
        inventory_source=lambda _c: inv,
        checkpoint_source=lambda *_a: (_ for _ in ()).throw(AssertionError()),
    )


def test_granted_gpu_edits() -> None:
    out = _outcome(f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"]))
    spec = out.spec
    assert [d["path"] for d in spec["linux"]["devices"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia1",
    ]
    rules = spec["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}
    assert {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rwm"} in rules
    dests = [m["destination"] for m in spec["mounts"]]
    assert dests[1:] == [
        "/usr/local/gpuhook/lib",
        "/usr/local/gpuhook/lib/libcuda.so.550.54.15",
        "/usr/local/gpuhook/lib/libcuda.so.1",
        "/usr/local/gpuhook/lib/libnvidia-allocator.so.550.54.15",
        "/usr/local/gpuhook/lib/libnvidia-allocator.so.1",
        "/usr/local/gpuhook/lib/libnvidia-ml.so.550.54.15",
        "/usr/local/gpuhook/lib/libnvidia-ml.so.1",
        "/usr/bin/nvidia-smi",
    ]  # video library not requested
    assert all("ro" in m["options"] and "nosuid" in m["options"] for m in spec["mounts"][2:])
    assert f"NVIDIA_VISIBLE_DEVICES={f.gpu_uuid(1)}" in spec["process"]["env"]
    hook = spec["hooks"]["createContainer"][0]
    assert hook["args"][1:4] == ["hook", "update-ldcache", "--ldconfig"]
    assert hook["env"] == f.hook_env()
    assert spec["x-unknown-key"] == {"kept": [1, 2, 3]}


def test_mig_device_gets_parent_node_and_caps() -> None:
    out = _outcome(f.spec(env=["NVIDIA_VISIBLE_DEVICES=6:1"]))
    paths = [d["path"] for d in out.spec["linux"]["devices"]]
    assert paths[-3:] == [
        "/dev/nvidia6",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
    ]


def test_a_granted_device_without_its_nodes_is_missing_never_engine_injected() -> None:
    inv, config = f.inventory(2, {1: 1}), f.config()
    gone = Decision(
        True, devices=(DeviceRef(KIND_GPU, f.gpu_uuid(5), 5),), capabilities=("utility",)
    )
    no_caps = Decision(True, devices=(DeviceRef(KIND_MIG, f.mig_uuid(1, 4), 1, 4),))
    with pytest.raises(inject.MissingDevice, match=r"/dev/nvidia for GPU 5 \("):
        inject.granted_nodes(gone, inv, config)
    with pytest.raises(inject.MissingDevice, match="nvidia-caps device nodes of MIG device 1:4"):
        inject.granted_nodes(no_caps, inv, config)
    for decision in (gone, no_caps):  # not "all of its nodes are in the spec" for want of any
        with pytest.raises(inject.MissingDevice):
            inject.without_present(ContainerEdits(), decision, inv, config, f.spec())


def test_refused_request_sets_void_and_nothing_else() -> None:
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations=f.k8s())
    out = decide.run(
        spec,
        f.config(),
        inventory_source=lambda _c: f.inventory(),
        checkpoint_source=lambda *_a: kubelet.Allocation("pod-uid-1", "main", (), "cp"),
    )
    assert out.decision.refused and out.changed
    assert "NVIDIA_VISIBLE_DEVICES=void" in out.spec["process"]["env"]
    assert "NVIDIA_VISIBLE_DEVICES=all" not in out.spec["process"]["env"]
    assert out.spec["linux"] == spec["linux"] and out.spec["mounts"] == spec["mounts"]


def test_docker_hook_removed() -> None:
    hooks = {
        "prestart": [
            {
                "path": "/usr/bin/nvidia-container-runtime-hook",
                "args": ["nvidia-container-runtime-hook", "prestart"],
            },
            {"path": "/usr/bin/other"},
        ]
    }
    out = _outcome(f.spec(env=["NVIDIA_VISIBLE_DEVICES=0"], hooks=hooks))
    assert out.spec["hooks"]["prestart"] == [{"path": "/usr/bin/other"}]


def test_no_request_leaves_spec_identical() -> None:
    spec = f.spec()
    out = _outcome(spec)
    assert not out.changed and out.spec == spec


def test_pipeline_is_idempotent_on_its_own_output() -> None:
    first = _outcome(f.spec(env=["NVIDIA_VISIBLE_DEVICES=0,6:1"]))
    second = _outcome(first.spec)
    assert second.spec == first.spec and not second.changed


def test_visible_value() -> None:
    req = request.parse(f.spec(env=["NVIDIA_VISIBLE_DEVICES=none"]))
    c = f.config()
    d = policy.decide(req, c.policy, c.default_capabilities, lambda: f.inventory())
    assert inject.visible_value(d) == "none"

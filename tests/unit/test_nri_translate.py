"""gpuhook nri's translation: NRI's pod and container as the shim's spec, and the difference
between two specs as an NRI adjustment (what the engine would make of it)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhook.nri import nri_api_pb2 as api
from gpuhook.nri import translate
from gpuhook.pipeline import request


def _container(**fields: Any) -> tuple[api.PodSandbox, api.Container]:
    pod = api.PodSandbox(id="p1", name="leak", uid="uid-1", namespace="default")
    ctr = api.Container(id="c1", pod_sandbox_id="p1", name="main", **fields)
    return pod, ctr


def test_the_pod_identity_is_the_engines_not_the_containers_annotations() -> None:
    pod, ctr = _container(
        env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"],
        annotations={"io.kubernetes.cri.sandbox-uid": "forged", "other": "kept"},
    )
    spec = translate.spec_of(pod, ctr)
    req = request.parse(spec, "/var/lib/kubelet")
    assert req.kubernetes is not None
    assert (req.kubernetes.pod_uid, req.kubernetes.container_name) == ("uid-1", "main")
    assert req.kubernetes.container_type == "container"
    assert spec["annotations"]["other"] == "kept"
    assert [c.channel for c in req.channels] == ["env"]
    assert not req.privileged  # NRI shows no capabilities


def test_devices_mounts_hooks_and_user_come_through() -> None:
    pod, ctr = _container(
        mounts=[api.Mount(destination="/etc/hosts", type="bind", source="/k/etc-hosts")],
        linux=api.LinuxContainer(devices=[api.LinuxDevice(path="/dev/x", type="c", major=1)]),
        user=api.User(uid=1000, gid=1000, additional_gids=[5]),
        hooks=api.Hooks(create_container=[api.Hook(path="/h", args=["h"])]),
    )
    spec = translate.spec_of(pod, ctr)
    assert spec["mounts"][0]["source"] == "/k/etc-hosts"
    assert spec["linux"]["devices"] == [{"path": "/dev/x", "type": "c", "major": 1, "minor": 0}]
    assert spec["process"]["user"] == {"uid": 1000, "gid": 1000, "additionalGids": [5]}
    assert spec["hooks"] == {"createContainer": [{"path": "/h", "args": ["h"], "env": []}]}


def _spec(env: list[str], **rest: Any) -> dict[str, Any]:
    return {"process": {"env": env}, **rest}


def test_an_adjustment_is_the_difference_of_the_specs() -> None:
    old = _spec(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"], mounts=[], linux={"devices": []})
    new = _spec(
        ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-1", "NVIDIA_DRIVER_CAPABILITIES=utility"],
        mounts=[{"destination": "/usr/bin/nvidia-smi", "type": "bind", "source": "/d/smi",
                 "options": ["ro", "bind"]}],
        linux={"devices": [{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1,
                            "fileMode": 0o666, "uid": 0, "gid": 0}]},
        hooks={"createContainer": [{"path": "/g", "args": ["g", "hook"], "env": [],
                                    "timeout": 30}]},
    )  # fmt: skip
    adjust = translate.adjustment(old, new)
    assert [(e.key, e.value) for e in adjust.env] == [
        ("NVIDIA_VISIBLE_DEVICES", "GPU-1"),
        ("NVIDIA_DRIVER_CAPABILITIES", "utility"),
    ]
    (dev,) = adjust.linux.devices
    assert (dev.path, dev.major, dev.minor, dev.file_mode.value) == ("/dev/nvidia1", 195, 1, 0o666)
    (mount,) = adjust.mounts
    assert (mount.destination, mount.source, list(mount.options)) == (
        "/usr/bin/nvidia-smi",
        "/d/smi",
        ["ro", "bind"],
    )
    (hook,) = adjust.hooks.create_container
    assert (hook.path, list(hook.args), hook.timeout.value) == ("/g", ["g", "hook"], 30)


def test_a_replaced_mount_is_removed_then_added() -> None:
    shm = {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []}
    mps = {"destination": "/dev/shm", "type": "bind", "source": "/m/shm", "options": ["rbind"]}
    adjust = translate.adjustment(_spec([], mounts=[shm]), _spec([], mounts=[mps]))
    assert [(m.destination, m.source) for m in adjust.mounts] == [("/dev/shm", "/m/shm")]


def test_env_as_the_engine_applies_it() -> None:
    edits = [api.KeyValue(key="A", value="new"), api.KeyValue(key="-B"), api.KeyValue(key="C")]
    got = translate.nri_env_result(["A=1", "B=2", "D=4", "A=3"], edits)
    assert got == ["A=3", "D=4", "C="]  # a repeated key keeps its last value: NRI's edit is lost


def test_a_repeated_variable_nri_cannot_set_is_refused() -> None:
    old = _spec(["NVIDIA_VISIBLE_DEVICES=all", "X=1", "NVIDIA_VISIBLE_DEVICES=all"])
    new = _spec(["NVIDIA_VISIBLE_DEVICES=void", "X=1"])
    with pytest.raises(translate.Unadjustable, match="NVIDIA_VISIBLE_DEVICES more than once"):
        translate.adjustment(old, new)


def test_a_hook_the_core_removed_is_refused() -> None:
    hook = {"path": "/usr/bin/nvidia-container-runtime-hook", "args": [], "env": []}
    with pytest.raises(translate.Unadjustable, match="cannot remove an OCI hook"):
        translate.adjustment(_spec([], hooks={"prestart": [hook]}), _spec([], hooks={}))


def test_no_difference_is_an_empty_adjustment() -> None:
    spec = _spec(["A=1"], mounts=[{"destination": "/x"}], linux={"devices": [{"path": "/d"}]})
    assert translate.adjustment(spec, spec).ByteSize() == 0

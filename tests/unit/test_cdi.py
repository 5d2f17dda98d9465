"""The CDI export (pure spec, schema validation, atomic write) and the no-double-injection rule:
a spec into which the engine already applied gpuhook's CDI devices gets no second device node,
mount or hook, and the edits name the devices the engine had injected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuhook.engines import cdi
from gpuhook.errors import CdiError
from gpuhook.model.edits import ContainerEdits
from gpuhook.pipeline import apply
from gpuhook.runtime import decide
from tests import factories as f

MARKERS = "/var/run/nvidia-container-devices/"


def _devices(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d["containerEdits"] for d in data["devices"]}


def test_spec_names_every_gpu_and_mig_device_by_index_and_uuid_and_validates() -> None:
    data = cdi.spec(f.inventory(3, {2: 2}), f.config())
    cdi.validate(data)
    assert (data["cdiVersion"], data["kind"]) == ("0.5.0", "nvidia.com/gpu")
    devices = _devices(data)
    assert list(devices) == [
        "0", f.gpu_uuid(0), "1", f.gpu_uuid(1), "2", f.gpu_uuid(2),
        "2:0", f.mig_uuid(2, 0), "2:1", f.mig_uuid(2, 1), "all",
    ]  # fmt: skip
    assert devices["1"] == devices[f.gpu_uuid(1)]
    assert devices["1"]["deviceNodes"] == [
        {"path": "/dev/nvidia1", "hostPath": "/x/dev/nvidia1", "type": "c", "major": 195,
         "minor": 1, "permissions": "rwm"},
    ]  # fmt: skip
    assert devices["1"]["mounts"] == [
        {"hostPath": "/dev/null", "containerPath": MARKERS + f.gpu_uuid(1), "type": "bind",
         "options": ["ro", "nosuid", "nodev", "bind"]},
    ]  # fmt: skip
    everything = [n["path"] for n in devices["all"]["deviceNodes"]]
    assert everything == [
        "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2",
        "/dev/nvidia-caps/nvidia-cap10", "/dev/nvidia-caps/nvidia-cap11",
        "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13",
    ]  # fmt: skip
    assert devices["all"]["mounts"][0]["containerPath"] == MARKERS + "all"


def test_a_mig_device_brings_its_gpu_node_and_its_caps_nodes() -> None:
    devices = _devices(cdi.spec(f.inventory(8, {6: 3}), f.config()))
    for m, caps in ((0, (10, 11)), (1, (12, 13)), (2, (14, 15))):
        edits = devices[f"6:{m}"]
        assert edits == devices[f.mig_uuid(6, m)]
        assert [(n["path"], n["major"], n["minor"]) for n in edits["deviceNodes"]] == [
            ("/dev/nvidia6", 195, 6),
            (f"/dev/nvidia-caps/nvidia-cap{caps[0]}", 511, caps[0]),
            (f"/dev/nvidia-caps/nvidia-cap{caps[1]}", 511, caps[1]),
        ]
        assert edits["mounts"][0]["containerPath"] == MARKERS + f.mig_uuid(6, m)


def test_common_edits_hold_control_nodes_driver_files_and_the_ldcache_hook() -> None:
    common = cdi.spec(f.inventory(1), f.config())["containerEdits"]
    assert common["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert [n["path"] for n in common["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert [m["containerPath"] for m in common["mounts"]] == [
        "/usr/local/gpuhook/lib",
        "/usr/local/gpuhook/lib/libcuda.so.550.54.15",
        "/usr/local/gpuhook/lib/libcuda.so.1",
        "/usr/local/gpuhook/lib/libnvidia-allocator.so.550.54.15",
        "/usr/local/gpuhook/lib/libnvidia-allocator.so.1",
        "/usr/local/gpuhook/lib/libnvidia-ml.so.550.54.15",
        "/usr/local/gpuhook/lib/libnvidia-ml.so.1",
        "/usr/bin/nvidia-smi",
    ]  # compute and utility, the default capabilities: no video library
    [hook] = common["hooks"]
    assert hook == {
        "hookName": "createContainer",
        "path": "/usr/bin/gpuhook",
        "args": ["gpuhook", "hook", "update-ldcache", "--ldconfig", "/sbin/ldconfig",
                 "--folder", "/usr/local/gpuhook/lib",
                 "--link", "/usr/local/gpuhook/lib/libcuda.so=libcuda.so.1",
                 "--link", "/usr/local/gpuhook/lib/libnvidia-ml.so=libnvidia-ml.so.1",
                 "--cuda-compat", "550.54.15:14"],
        "env": f.hook_env(),
        "timeout": 30,
    }  # fmt: skip


def test_cdi_capabilities_choose_the_libraries() -> None:
    common = cdi.spec(f.inventory(1), f.config(cdi__capabilities=["video"]))["containerEdits"]
    assert [m["containerPath"] for m in common["mounts"]] == [
        "/usr/local/gpuhook/lib",
        "/usr/local/gpuhook/lib/libnvcuvid.so.550.54.15",
        "/usr/local/gpuhook/lib/libnvcuvid.so.1",
    ]


def test_write_is_validated_and_reads_back_as_json_or_yaml(tmp_path: Path) -> None:
    data = cdi.spec(f.inventory(2), f.config())
    for name in ("cdi/gpuhook.json", "cdi/gpuhook.yaml"):
        cdi.write(data, str(tmp_path / name))
        assert cdi.load(str(tmp_path / name)) == data
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644
    assert json.loads((tmp_path / "cdi/gpuhook.json").read_text()) == data
    bad = {**data, "devices": [{"name": "0"}]}  # no containerEdits
    with pytest.raises(CdiError, match=r"invalid at devices/0: 'containerEdits' is a required"):
        cdi.write(bad, str(tmp_path / "cdi/bad.json"))
    assert not (tmp_path / "cdi/bad.json").exists()
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == ["gpuhook.json", "gpuhook.yaml"]


def test_the_schema_is_one_document_and_checks_the_definitions_it_merged() -> None:
    """cdi.defs.json's definitions are checked as before (a device node's path must be a string)
    with no reference resolver (jsonschema's RefResolver is deprecated; Debian 12 has no
    ``referencing``)."""
    import warnings

    schema = cdi.cdi_schema()
    assert cdi.DEFS_REF not in json.dumps(schema)
    assert {"containerEdits", "DeviceNode", "annotations"} <= set(schema["definitions"])
    data = cdi.spec(f.inventory(1), f.config())
    broken = json.loads(json.dumps(data))
    broken["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] = 7
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no DeprecationWarning either
        cdi.validate(data)
        with pytest.raises(CdiError, match=r"invalid at devices/0/containerEdits/deviceNodes/0"):
            cdi.validate(broken)


def test_export_follows_cdi_output(tmp_path: Path) -> None:
    assert cdi.export(f.inventory(1), f.config(cdi__output="")) == ("", [])
    path = str(tmp_path / "spec.json")
    assert cdi.export(f.inventory(1), f.config(cdi__output=path)) == (path, [])
    assert cdi.load(path)["kind"] == "nvidia.com/gpu"
    assert cdi.export(f.inventory(1), f.config(cdi__output=path)) == (path, [])  # itself: fine


NVIDIA_CTK_SPEC = """cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
- name: all
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
containerEdits: {}
"""


def test_another_spec_of_the_same_devices_is_a_conflict_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    """nvidia-ctk's spec beside gpuhook's: engines refuse both ('conflicting device')."""
    run_cdi, etc_cdi = tmp_path / "run-cdi", tmp_path / "etc-cdi"
    run_cdi.mkdir()
    etc_cdi.mkdir()
    (run_cdi / "nvidia.yaml").write_text(NVIDIA_CTK_SPEC)
    (run_cdi / "rdma.json").write_text('{"cdiVersion": "0.5.0", "kind": "nvidia.com/net-rdma", '
                                       '"devices": [{"name": "0", "containerEdits": {}}]}')
    (run_cdi / "broken.json").write_text("{")  # engines skip it; so does the check
    output = run_cdi / "gpuhook-nvidia.json"
    config = f.config(cdi__output=str(output), cdi__spec_dirs=[str(etc_cdi), str(run_cdi)])
    written, found = cdi.export(f.inventory(1), config)
    assert written == "" and not output.exists()
    assert [(c.path, c.names, c.same_folder) for c in found] == [
        (str(run_cdi / "nvidia.yaml"), ("0", "all"), True)
    ]
    assert found[0].line() == (
        f"{run_cdi / 'nvidia.yaml'} also defines nvidia.com/gpu=0, nvidia.com/gpu=all: engines "
        "that read both refuse these devices (conflicting device)"
    )
    (run_cdi / "nvidia.yaml").rename(etc_cdi / "nvidia.yaml")  # another folder: one hides the other
    written, found = cdi.export(f.inventory(1), config)
    assert written == "" and [(c.path, c.same_folder) for c in found] == [
        (str(etc_cdi / "nvidia.yaml"), False)
    ]
    assert "hide the other's" in found[0].line()
    (etc_cdi / "nvidia.yaml").unlink()
    assert cdi.export(f.inventory(1), config) == (str(output), [])


def _engine_applied(spec: dict[str, Any], *names: str) -> dict[str, Any]:
    """What podman or containerd make of ``spec`` for ``--device nvidia.com/gpu=<name>``: the
    device's edits and the common edits of gpuhook's CDI spec."""
    inventory = f.inventory(8, {6: 3})
    config = f.config()
    devices = {n: d for d in cdi.devices(inventory) for n in d.names}
    common = cdi.common_edits(inventory, config)
    for name in names:
        device = devices[name].edits
        spec = apply.apply(
            spec,
            ContainerEdits(
                env=common.env,
                device_nodes=common.device_nodes + device.device_nodes,
                mounts=common.mounts + device.mounts,
                hooks=common.hooks,
            ),
        )
    return spec


def _run(spec: dict[str, Any]) -> Any:
    return decide.run(
        spec,
        f.config(),
        inventory_source=lambda _c: f.inventory(8, {6: 3}),
        checkpoint_source=lambda *_a: None,  # type: ignore[arg-type]
        rootfs="/containers/abc/rootfs",
    )


def test_devices_the_engine_injected_are_not_injected_again() -> None:
    spec = _engine_applied(f.spec(), "1", "6:2")
    out = _run(spec)
    assert out.decision.channel == "mount-marker"
    assert out.edits.device_nodes == () and out.edits.mounts == () and out.edits.hooks == ()
    assert out.edits.engine_injected == (f.gpu_uuid(1), f.mig_uuid(6, 2))
    assert out.edits.to_dict()["engineInjected"] == [f.gpu_uuid(1), f.mig_uuid(6, 2)]
    paths = [d["path"] for d in out.spec["linux"]["devices"]]
    assert len(paths) == len(set(paths))
    assert len(out.spec["hooks"]["createContainer"]) == 1
    dests = [m["destination"] for m in out.spec["mounts"]]
    assert len(dests) == len(set(dests))
    env = out.spec["process"]["env"]
    assert f"NVIDIA_VISIBLE_DEVICES={f.gpu_uuid(1)},{f.mig_uuid(6, 2)}" in env


def test_a_device_the_engine_did_not_inject_is_added_alone() -> None:
    marker = {"destination": MARKERS + f.gpu_uuid(2), "type": "bind", "source": "/dev/null"}
    spec = _engine_applied(f.spec(mounts=[marker]), "1")
    out = _run(spec)
    assert out.edits.engine_injected == (f.gpu_uuid(1),)
    assert [n.path for n in out.edits.device_nodes] == ["/dev/nvidia2"]
    assert out.edits.mounts == () and out.edits.hooks == ()
    assert [d["path"] for d in out.spec["linux"]["devices"]].count("/dev/nvidia2") == 1


def test_the_record_lists_only_what_apply_added() -> None:
    """A node already at /dev/nvidia2 with other numbers (an engine's --device mapping of GPU 5)
    stays as the spec has it; the record neither claims gpuhook added /dev/nvidia2 nor that the
    engine injected GPU 2: it says the engine injected GPU 5 (found by its device number)."""
    marker = {"destination": MARKERS + f.gpu_uuid(2), "type": "bind", "source": "/dev/null"}
    other = {"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 5}
    spec = _engine_applied(f.spec(mounts=[marker]), "1")
    spec["linux"]["devices"].append(other)
    out = _run(spec)
    assert out.edits.engine_injected == (f.gpu_uuid(1), f.gpu_uuid(5))
    engine = [r for r in out.decision.reasons if r.channel == "engine-cdi"]
    assert [(r.value, r.verdict) for r in engine] == [
        ("/dev/nvidia1", "granted"),
        ("/dev/nvidia2", "granted"),
    ]
    assert "GPU 5" in engine[1].why and "non-Kubernetes" in engine[1].why
    assert "/dev/nvidia2" not in [n.path for n in out.edits.device_nodes]
    assert [d for d in out.spec["linux"]["devices"] if d["path"] == "/dev/nvidia2"] == [other]

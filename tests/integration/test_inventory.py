"""Node inventory end to end: pynvml loading the fake libnvidia-ml.so.1 through the normal
library search, the driver-root scan, and `gpuhook inspect node`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FakeNode, make_fake_node

pytestmark = pytest.mark.root


def inspect_json(node: FakeNode, *args: str) -> dict[str, Any]:
    out = node.gpuhook("inspect", "node", "--output", "json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_inspect_node_reports_exactly_the_fake_node(node: FakeNode) -> None:
    view = inspect_json(node)
    truth = node.truth
    assert view["inventory"]["fresh"] is True
    assert view["driver"]["version"] == truth["driver_version"]
    assert view["driver"]["nvml_library"].endswith(f"libnvidia-ml.so.{truth['driver_version']}")
    assert len(view["gpus"]) == 8
    for got, want in zip(view["gpus"], truth["gpus"], strict=True):
        assert (got["index"], got["uuid"], got["minor"], got["name"], got["memory_total"]) == (
            want["index"],
            want["uuid"],
            want["minor"],
            want["name"],
            want["memory"],
        )
        assert got["pci_bus_id"] == want["pci_bus_id"]
        assert got["mig_enabled"] == want["mig_enabled"]
        node_path = node.root / "dev" / "dev" / f"nvidia{want['minor']}"
        st = os.stat(node_path)
        assert (got["device_node"]["major"], got["device_node"]["minor"]) == (
            os.major(st.st_rdev),
            os.minor(st.st_rdev),
        )
        assert [m["uuid"] for m in got["mig_devices"]] == [m["uuid"] for m in want["mig_devices"]]
        for gm, wm in zip(got["mig_devices"], want["mig_devices"], strict=True):
            assert (gm["gpu_instance_id"], gm["compute_instance_id"]) == (wm["gi_id"], wm["ci_id"])
            assert [(c["path"], c["major"], c["minor"]) for c in gm["caps"]] == [
                (c["path"], c["major"], c["minor"]) for c in wm["caps_nodes"]
            ]
            for cap in gm["caps"]:
                rdev = os.stat(cap["host_path"]).st_rdev
                assert (cap["major"], cap["minor"]) == (os.major(rdev), os.minor(rdev))
    assert sum(len(g["mig_devices"]) for g in view["gpus"]) == 6
    assert [g["index"] for g in view["gpus"] if g["mig_enabled"]] == [6, 7]

    controls = {n["path"]: (n["major"], n["minor"]) for n in view["control_nodes"]}
    for want in truth["control_nodes"]:
        assert controls[want["path"]] == (want["major"], want["minor"])

    for capability in ("compute", "utility", "video", "graphics", "ngx"):
        found = {lib["soname"] for lib in view["libraries"][capability]["found"]}
        want_found = {lib["soname"] for lib in truth["libraries"][capability]}
        assert found == want_found, capability
        absent = set(view["libraries"][capability]["missing"])
        assert absent == {n for n in truth["absent_libraries"] if n in _catalog(capability)}, (
            capability
        )
    assert {b["name"] for b in view["binaries"]} >= {"nvidia-smi", "nvidia-cuda-mps-control"}
    assert view["ipc_sockets"][0]["container_path"].endswith("nvidia-persistenced/socket")
    assert view["firmware"]
    assert {g["brand"] for g in view["gpus"]} == {14}
    dev_links = {
        lib["soname"]: lib["dev_link"]
        for libs in view["libraries"].values()
        for lib in libs["found"]
    }
    assert dev_links == {
        lib["soname"]: lib["name"] if lib["dev_link"] else ""
        for libs in truth["libraries"].values()
        for lib in libs
    }
    assert [(f["name"], f["path"], f["container_path"]) for f in view["graphics_loader_files"]] == [
        (f["name"], f["host_path"], want)
        for f, want in zip(
            truth["loader_files"],
            (
                "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
                "/etc/vulkan/icd.d/nvidia_icd.json",
                "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
            ),
            strict=True,
        )
    ]


def _catalog(capability: str) -> tuple[str, ...]:
    from gpuhook.inventory.catalog import LIBRARIES

    return LIBRARIES[capability]


def test_a_gke_layout_driver_root_is_found_whole(tmp_path: Path) -> None:
    """The driver root as GKE mounts /usr/local/nvidia: lib64, bin, share; no ld.so.cache."""
    node = make_fake_node(tmp_path / "n", "--gpus", "1", "--layout", "gke")
    node.refresh()
    view = inspect_json(node)
    found = {lib["soname"] for libs in view["libraries"].values() for lib in libs["found"]}
    assert found == {lib["soname"] for libs in node.truth["libraries"].values() for lib in libs}
    assert {b["path"] for b in view["binaries"]} >= {f"{node.truth['driver_root']}/bin/nvidia-smi"}
    assert [f["path"] for f in view["graphics_loader_files"]] == [
        f["host_path"] for f in node.truth["loader_files"]
    ]
    assert node.truth["loader_files"][1]["host_path"].endswith(
        "/share/vulkan/icd.d/nvidia_icd.json"
    )


def test_a_loader_file_naming_an_unknown_library_is_left_out(tmp_path: Path) -> None:
    node = make_fake_node(tmp_path / "n", "--gpus", "1")
    icd = Path(node.truth["loader_files"][1]["host_path"])
    icd.write_text(
        json.dumps({"file_format_version": "1.0.1", "ICD": {"library_path": "libvk_other.so.1"}})
    )
    out = node.gpuhook("inventory", "refresh")
    assert out.returncode == 0, out.stderr
    assert (
        f"Vulkan ICD file {icd} left out: its library libvk_other.so.1 is not a driver library"
        in out.stderr
    )
    assert [f["name"] for f in inspect_json(node)["graphics_loader_files"]] == [
        "10_nvidia.json",
        "nvidia_layers.json",
    ]


def test_refresh_makes_the_dev_char_links(tmp_path: Path) -> None:
    """/dev/char/<major>:<minor> -> ../<node> for every NVIDIA node (GPUs, MIG caps, control),
    as udev writes them; a wrong link is replaced, what is not a link is left alone."""
    node = make_fake_node(tmp_path / "n", "--gpus", "2", "--mig-gpus", "1", "--mig-devices", "1")
    char = node.root / "dev" / "dev" / "char"
    blocked = char / f"195:{node.truth['control_nodes'][0]['minor']}"
    char.mkdir()
    blocked.write_text("not a link\n")
    (char / "195:0").symlink_to("../nvidia1")
    out = node.gpuhook("inventory", "refresh")
    assert out.returncode == 0
    assert f"warning: {blocked} exists and is not a link; left as it is" in out.stderr
    truth = node.truth
    wanted = [g["device_node"] for g in truth["gpus"]]
    wanted += [c for g in truth["gpus"] for m in g["mig_devices"] for c in m["caps_nodes"]]
    wanted += truth["control_nodes"][1:]
    for n in wanted:
        link = char / f"{n['major']}:{n['minor']}"
        assert os.readlink(link) == os.path.relpath(n["path"], "/dev/char"), link
        assert os.stat(link).st_rdev == os.makedev(n["major"], n["minor"])
    assert blocked.read_text() == "not a link\n"
    assert sorted(p.name for p in char.iterdir()) == sorted(
        {f"{n['major']}:{n['minor']}" for n in wanted} | {blocked.name}
    )


def test_inspect_node_table(node: FakeNode) -> None:
    out = node.gpuhook("inspect", "node", "--output", "table")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "GPUs (8)" in text
    for gpu in node.truth["gpus"]:
        assert gpu["uuid"] in text
        for mig in gpu["mig_devices"]:
            assert mig["uuid"] in text
    assert "libnvidia-nscq.so" in text  # a missing library is named
    yaml_out = node.gpuhook("inspect", "node", "--output", "yaml")
    assert yaml_out.returncode == 0 and "gpus:" in yaml_out.stdout


def test_no_nvml_library(fake_node_factory: Any) -> None:
    bare: FakeNode = fake_node_factory("--gpus", "1", "--no-nvml")
    out = bare.gpuhook("inventory", "refresh", env={"LD_LIBRARY_PATH": ""})
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("gpuhook: NVML library libnvidia-ml.so.1 not found (searched: ")
    assert "the library search path" in lines[0] and "install the NVIDIA driver" in lines[0]
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("damage", ["missing", "garbage", "directory"])
def test_broken_ldcache_falls_back_to_directory_scan(tmp_path: Path, damage: str) -> None:
    node = make_fake_node(tmp_path / "n", "--gpus", "2")
    cache = node.root / "driver" / "etc" / "ld.so.cache"
    cache.unlink()
    if damage == "garbage":
        cache.write_bytes(b"not a cache at all")
    elif damage == "directory":
        cache.mkdir()
    out = node.gpuhook("inventory", "refresh")
    assert out.returncode == 0, out.stderr
    assert "scanned library folders instead" in out.stderr
    view = inspect_json(node)
    found = {lib["soname"] for lib in view["libraries"]["compute"]["found"]}
    assert found == {lib["soname"] for lib in node.truth["libraries"]["compute"]}
    assert any("scanned library folders instead" in w for w in view["warnings"])


def test_concurrent_refreshes_leave_one_valid_inventory(tmp_path: Path) -> None:
    node = make_fake_node(tmp_path / "n", "--gpus", "4", "--mig-gpus", "1")
    env = {**os.environ, **node.env}
    procs = [
        subprocess.Popen(
            [
                str(Path(__file__).resolve().parents[2] / "build/bin/gpuhook"),
                "inventory",
                "refresh",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(6)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    state = node.root / "state"
    inventory = json.loads((state / "inventory.json").read_text())
    assert len(inventory["gpus"]) == 4
    leftovers = [
        p.name
        for p in state.iterdir()
        if p.name not in ("inventory.json", "inventory.json.lock", "driverfiles")
    ]
    assert leftovers == []
    # the driver's prepared library folders: one generation, no builder's temporary folder left
    [generation] = [p.name for p in (state / "driverfiles").iterdir()]
    assert f"/driverfiles/{generation}/" in json.dumps(inventory["prepared"])
    # the CDI spec, rewritten atomically by each refresh: one whole file
    assert [p.name for p in (node.root / "cdi").iterdir()] == ["gpuhook-nvidia.json"]
    spec = json.loads((node.root / "cdi" / "gpuhook-nvidia.json").read_text())
    assert spec["kind"] == "nvidia.com/gpu" and spec["devices"][-1]["name"] == "all"


def test_stale_inventory_is_detected(tmp_path: Path) -> None:
    node = make_fake_node(tmp_path / "n", "--gpus", "2")
    node.refresh()
    assert inspect_json(node)["inventory"]["fresh"] is True
    cache = node.root / "driver" / "etc" / "ld.so.cache"
    os.utime(cache, ns=(1, 1))  # the driver's libraries changed
    view = inspect_json(node)
    assert view["inventory"]["fresh"] is False
    assert view["inventory"]["stale_reason"] == "the driver changed since the inventory was built"


def test_inspect_node_refresh_also_refreshes_the_cdi_spec(tmp_path: Path) -> None:
    """Every refresh a person asks for keeps cdi.output in step with the inventory."""
    node = make_fake_node(tmp_path / "n", "--gpus", "2")
    node.refresh()
    spec = node.root / "cdi" / "gpuhook-nvidia.json"
    spec.unlink()
    assert node.gpuhook("inspect", "node", "--refresh", "--output", "json").returncode == 0
    names = [d["name"] for d in json.loads(spec.read_text())["devices"]]
    assert "0" in names and "1" in names and names[-1] == "all"


def test_missing_inventory(tmp_path: Path) -> None:
    node = make_fake_node(tmp_path / "n", "--gpus", "1")
    out = node.gpuhook("inspect", "node", "--output", "json")
    assert out.returncode == 0
    view = json.loads(out.stdout)
    assert view["inventory"]["present"] is False
    assert "run: gpuhook inventory refresh" in view["inventory"]["stale_reason"]

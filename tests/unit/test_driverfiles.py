"""What of the driver a container gets per capability (pure): development links, the modeset node
only for graphics/display, the graphics loader files and links, display on a headless host, and
the reasons; the same through the CDI export."""

from __future__ import annotations

from typing import Any

from gpuhook.engines import cdi
from gpuhook.pipeline import driverfiles
from gpuhook.runtime import decide
from tests import factories as f

LIB = "/usr/local/gpuhook/lib"


def _outcome(*env: str, inv: Any = None) -> Any:
    inventory = inv or f.inventory(2)
    return decide.run(
        f.spec(env=list(env)),
        f.config(),
        inventory_source=lambda _c: inventory,
        rootfs="/nonexistent",
    )


def _notes(out: Any) -> dict[str, str]:
    return {n.what: n.why for n in out.edits.notes}


def test_compute_gets_dev_links_and_no_graphics_at_all() -> None:
    out = _outcome("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
    spec = out.spec
    assert "/dev/nvidia-modeset" not in [d["path"] for d in spec["linux"]["devices"]]
    dests = [m["destination"] for m in spec["mounts"]]
    assert not [d for d in dests if "vulkan" in d or "glvnd" in d or d.endswith("/gbm")]
    args = spec["hooks"]["createContainer"][0]["args"]
    links = [args[i + 1] for i, a in enumerate(args) if a == "--link"]
    assert links == [f"{LIB}/libcuda.so=libcuda.so.1", f"{LIB}/libnvidia-ml.so=libnvidia-ml.so.1"]
    assert not any(e.startswith("GBM_BACKENDS_PATH=") for e in spec["process"]["env"])
    assert list(_notes(out)) == [f"development links in {LIB}: libcuda.so, libnvidia-ml.so"]


def test_graphics_gets_loader_files_links_gbm_and_modeset() -> None:
    out = _outcome(
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_DRIVER_CAPABILITIES=graphics",
        "GBM_BACKENDS_PATH=/opt/mesa/gbm",
    )
    spec = out.spec
    assert [d["path"] for d in spec["linux"]["devices"]] == [
        "/dev/nvidiactl", "/dev/nvidia-modeset", "/dev/nvidia0",
    ]  # fmt: skip  (no compute: no unified memory node, as NVIDIA's libnvidia-container)
    mounts = {m["destination"]: m for m in spec["mounts"]}
    assert mounts["/usr/share/glvnd/egl_vendor.d/10_nvidia.json"]["source"] == (
        "/d/usr/share/glvnd/egl_vendor.d/10_nvidia.json"
    )
    assert "ro" in mounts["/etc/vulkan/icd.d/nvidia_icd.json"]["options"]
    assert mounts[f"{LIB}/gbm"]["type"] == "tmpfs"
    assert f"{LIB}/libnvidia-allocator.so.1" in mounts  # the GBM backend's library
    assert f"{LIB}/libcuda.so.1" not in mounts  # compute was not asked for
    args = spec["hooks"]["createContainer"][0]["args"]
    links = [args[i + 1] for i, a in enumerate(args) if a == "--link"]
    assert links == [
        f"{LIB}/libGLX_indirect.so.0=libGLX_nvidia.so.0",
        f"{LIB}/gbm/nvidia-drm_gbm.so=../libnvidia-allocator.so.1",
    ]
    assert f"GBM_BACKENDS_PATH={LIB}/gbm:/opt/mesa/gbm" in spec["process"]["env"]
    notes = _notes(out)
    assert notes["/dev/nvidia-modeset"].startswith("graphics capability")
    assert any(w.startswith("graphics loader files: /usr/share/glvnd") for w in notes)
    assert f"GLX indirect link {LIB}/libGLX_indirect.so.0 -> libGLX_nvidia.so.0" in notes


def test_display_on_a_headless_host_gets_the_modeset_node_and_a_reason() -> None:
    out = _outcome("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=display")
    assert not out.decision.refused
    assert "/dev/nvidia-modeset" in [d["path"] for d in out.spec["linux"]["devices"]]
    assert "display: no X server driver files on this host (headless)" in _notes(out)
    bare = _outcome(
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_DRIVER_CAPABILITIES=display",
        inv=f.inventory(1, graphics=False),
    )
    assert "/dev/nvidia-modeset: not on this host" in _notes(bare)


def test_control_nodes_by_capability() -> None:
    inv = f.inventory(1)
    paths = [n.path for n in driverfiles.control_nodes(inv, frozenset({"compute"}))]
    assert paths == ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    for caps in ({"utility"}, {"graphics"}, {"video", "utility"}):  # no CUDA without compute
        nodes = driverfiles.control_nodes(inv, frozenset(caps))
        assert "/dev/nvidia-uvm" not in [n.path for n in nodes], caps
    for caps in ({"graphics"}, {"display"}, {"compute", "display"}):
        nodes = driverfiles.control_nodes(inv, frozenset(caps))
        assert "/dev/nvidia-modeset" in [n.path for n in nodes]


def test_the_cdi_spec_carries_graphics_files_and_links() -> None:
    config = f.config(cdi__capabilities=["compute", "utility", "graphics"])
    common = cdi.spec(f.inventory(1), config)["containerEdits"]
    cdi.validate(cdi.spec(f.inventory(1), config))
    assert "/dev/nvidia-modeset" in [n["path"] for n in common["deviceNodes"]]
    dests = [m["containerPath"] for m in common["mounts"]]
    assert "/etc/vulkan/icd.d/nvidia_icd.json" in dests
    args = common["hooks"][0]["args"]
    assert f"{LIB}/gbm/nvidia-drm_gbm.so=../libnvidia-allocator.so.1" in args
    assert args[-2:] == ["--cuda-compat", "550.54.15:14"]
    assert "notes" not in common
    assert any(e.startswith("GBM_BACKENDS_PATH=") for e in common["env"])
    plain = cdi.spec(f.inventory(1), f.config(inject__cuda_compat=False))["containerEdits"]
    assert "--cuda-compat" not in plain["hooks"][0]["args"]
    assert "/dev/nvidia-modeset" not in [n["path"] for n in plain["deviceNodes"]]

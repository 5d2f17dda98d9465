"""The graphics loader files of a driver root, in every layout, and what they name."""

from __future__ import annotations

import json
from pathlib import Path

from gpuhook.inventory import loaders
from gpuhook.model.inventory import HostFile, Library

GLX = Library(
    "libGLX_nvidia.so.580.1", "/h/libGLX_nvidia.so.580.1", "libGLX_nvidia.so.0", "580.1", "graphics"
)
EGL = Library(
    "libEGL_nvidia.so.580.1", "/h/libEGL_nvidia.so.580.1", "libEGL_nvidia.so.0", "580.1", "graphics"
)


def _write(root: Path, path: str, library: str, key: str = "ICD") -> Path:
    file = root / path.lstrip("/")
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps({"file_format_version": "1.0.0", key: {"library_path": library}}))
    return file


def test_a_driver_prefix_under_a_root_of_slash_is_found(tmp_path: Path) -> None:
    """driver_root / on a node whose driver lives in /usr/local/nvidia (GKE's prefix)."""
    icd = _write(
        tmp_path, "/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json", "libGLX_nvidia.so.0"
    )
    layer = _write(
        tmp_path, "/usr/local/nvidia/share/vulkan/implicit_layer.d/nvidia_layers.json",
        "libGLX_nvidia.so.0", "layer",
    )  # fmt: skip
    warnings: list[str] = []
    assert loaders.scan(str(tmp_path), [GLX, EGL], warnings) == [
        HostFile("loader", "nvidia_icd.json", str(icd),
                 "/etc/vulkan/icd.d/nvidia_icd.json", "graphics"),
        HostFile("loader", "nvidia_layers.json", str(layer),
                 "/etc/vulkan/implicit_layer.d/nvidia_layers.json", "graphics"),
    ]  # fmt: skip
    assert warnings == []


def test_the_standard_place_comes_first_and_an_absolute_library_is_mounted_there(
    tmp_path: Path,
) -> None:
    first = _write(
        tmp_path, "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/usr/lib64/libEGL_nvidia.so.0"
    )
    _write(tmp_path, "/share/glvnd/egl_vendor.d/10_nvidia.json", "libEGL_nvidia.so.0")
    found = loaders.scan(str(tmp_path), [GLX, EGL], [])
    assert found == [
        HostFile("loader", "10_nvidia.json", str(first),
                 "/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "graphics"),
        HostFile("loader-library", EGL.name, EGL.path, "/usr/lib64/libEGL_nvidia.so.0", "graphics"),
    ]  # fmt: skip


def test_files_that_would_break_their_loader_are_left_out(tmp_path: Path) -> None:
    _write(tmp_path, "/etc/vulkan/icd.d/nvidia_icd.json", "libvulkan_other.so.1")
    _write(
        tmp_path,
        "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
        "../lib/libGLX_nvidia.so.0",
        "layer",
    )
    (tmp_path / "usr/share/glvnd/egl_vendor.d").mkdir(parents=True)
    (tmp_path / "usr/share/glvnd/egl_vendor.d/10_nvidia.json").write_text("{not json")
    warnings: list[str] = []
    assert loaders.scan(str(tmp_path), [GLX, EGL], warnings) == []
    assert [w.split(" left out: ")[1].split(" (")[0] for w in warnings] == [
        "not valid JSON",
        "its library libvulkan_other.so.1 is not a driver library of the inventory",
        "its library path ../lib/libGLX_nvidia.so.0 is neither a bare name nor absolute",
    ]

"""The driver's files: its libraries per capability (with the sonames and development links the
real driver has), where each layout keeps them, the graphics loader files, executables, firmware
and the persistenced socket."""

from __future__ import annotations

import json
from typing import Any

# (capability, library as gpuhook's catalog names it, soname). "{v}" is the driver version (the
# libraries the driver ships with a full-version soname); None marks a library deliberately left
# out so that "missing library" reporting can be tested. display and compat32 are not built.
LIBRARIES: tuple[tuple[str, str, str | None], ...] = (
    ("utility", "libnvidia-ml.so", "libnvidia-ml.so.1"),
    ("utility", "libnvidia-cfg.so", "libnvidia-cfg.so.1"),
    ("utility", "libnvidia-nscq.so", None),
    ("compute", "libcuda.so", "libcuda.so.1"),
    ("compute", "libcudadebugger.so", "libcudadebugger.so.1"),
    ("compute", "libnvidia-opencl.so", "libnvidia-opencl.so.1"),
    ("compute", "libnvidia-gpucomp.so", "libnvidia-gpucomp.so.{v}"),
    ("compute", "libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"),
    ("compute", "libnvidia-fatbinaryloader.so", None),
    ("compute", "libnvidia-allocator.so", "libnvidia-allocator.so.1"),
    ("compute", "libnvidia-compiler.so", None),
    ("compute", "libnvidia-pkcs11.so", "libnvidia-pkcs11.so.{v}"),
    ("compute", "libnvidia-pkcs11-openssl3.so", "libnvidia-pkcs11-openssl3.so.{v}"),
    ("compute", "libnvidia-nvvm.so", "libnvidia-nvvm.so.4"),
    ("video", "libvdpau_nvidia.so", "libvdpau_nvidia.so.1"),
    ("video", "libnvidia-encode.so", "libnvidia-encode.so.1"),
    ("video", "libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1"),
    ("video", "libnvcuvid.so", "libnvcuvid.so.1"),
    ("graphics", "libnvidia-eglcore.so", "libnvidia-eglcore.so.{v}"),
    ("graphics", "libnvidia-glcore.so", "libnvidia-glcore.so.{v}"),
    ("graphics", "libnvidia-tls.so", "libnvidia-tls.so.{v}"),
    ("graphics", "libnvidia-glsi.so", "libnvidia-glsi.so.{v}"),
    ("graphics", "libnvidia-fbc.so", "libnvidia-fbc.so.1"),
    ("graphics", "libnvidia-ifr.so", None),
    ("graphics", "libnvidia-rtcore.so", "libnvidia-rtcore.so.{v}"),
    ("graphics", "libnvoptix.so", "libnvoptix.so.1"),
    ("graphics", "libGLX_nvidia.so", "libGLX_nvidia.so.0"),
    ("graphics", "libEGL_nvidia.so", "libEGL_nvidia.so.0"),
    ("graphics", "libGLESv2_nvidia.so", "libGLESv2_nvidia.so.2"),
    ("graphics", "libGLESv1_CM_nvidia.so", "libGLESv1_CM_nvidia.so.1"),
    ("graphics", "libnvidia-glvkspirv.so", "libnvidia-glvkspirv.so.{v}"),
    ("graphics", "libnvidia-cbl.so", "libnvidia-cbl.so.{v}"),
    ("ngx", "libnvidia-ngx.so", "libnvidia-ngx.so.1"),
)
# The libraries whose unversioned development link (libcuda.so -> libcuda.so.1) the driver's
# installer creates next to them, as a real driver does.
DEV_LINKS = (
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-cfg.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-allocator.so",
    "libnvidia-nvvm.so",
    "libnvcuvid.so",
    "libnvidia-encode.so",
    "libnvidia-opticalflow.so",
    "libnvidia-fbc.so",
)
# Where a driver installation keeps its files, per layout: "standard" as the .run installer and
# distribution packages lay a driver out under /, "gke" as a GKE node's driver root
# (/usr/local/nvidia: lib64, bin, share; no ld.so.cache).
LAYOUTS: dict[str, dict[str, str]] = {
    "standard": {
        "libdir": "/usr/lib/x86_64-linux-gnu",
        "bindir": "/usr/bin",
        "egl": "/usr/share/glvnd/egl_vendor.d",
        "icd": "/etc/vulkan/icd.d",
        "layer": "/etc/vulkan/implicit_layer.d",
    },
    "gke": {
        "libdir": "/lib64",
        "bindir": "/bin",
        "egl": "/share/glvnd/egl_vendor.d",
        "icd": "/share/vulkan/icd.d",
        "layer": "/share/vulkan/implicit_layer.d",
    },
}
# The loader files of the graphics driver: (kind, layout key, file name, library it names).
LOADER_FILES = (
    ("egl_vendor", "egl", "10_nvidia.json", "libEGL_nvidia.so.0"),
    ("vulkan_icd", "icd", "nvidia_icd.json", "libGLX_nvidia.so.0"),
    ("vulkan_layer", "layer", "nvidia_layers.json", "libGLX_nvidia.so.0"),
)
# Driver executables: name -> capability (as gpuhook's catalog).
BINARIES = {
    "nvidia-smi": "utility",
    "nvidia-debugdump": "utility",
    "nvidia-persistenced": "utility",
    "nvidia-cuda-mps-control": "compute",
    "nvidia-cuda-mps-server": "compute",
}
# Binaries with their own fake (the others are copies of one stub that prints its name).
OWN_BINARIES = ("nvidia-smi", "nvidia-cuda-mps-control")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
SOCKET = "/run/nvidia-persistenced/socket"


def loader_json(kind: str, library: str) -> str:
    """An EGL vendor, Vulkan ICD or Vulkan implicit layer file as the driver's installer writes
    it, naming ``library`` by its soname."""
    if kind == "egl_vendor":
        doc: dict[str, Any] = {"file_format_version": "1.0.0", "ICD": {"library_path": library}}
    elif kind == "vulkan_icd":
        doc = {
            "file_format_version": "1.0.1",
            "ICD": {"library_path": library, "api_version": "1.3.277"},
        }
    else:
        doc = {
            "file_format_version": "1.0.1",
            "layer": {
                "name": "VK_LAYER_NV_optimus",
                "type": "INSTANCE",
                "library_path": library,
                "api_version": "1.3.277",
                "implementation_version": "1",
                "description": "NVIDIA Optimus layer",
                "functions": {
                    "vkGetInstanceProcAddr": "vk_optimusGetInstanceProcAddr",
                    "vkGetDeviceProcAddr": "vk_optimusGetDeviceProcAddr",
                },
                "enable_environment": {"__NV_PRIME_RENDER_OFFLOAD": "1"},
                "disable_environment": {"DISABLE_LAYER_NV_OPTIMUS_1": ""},
            },
        }
    return json.dumps(doc, indent=4) + "\n"

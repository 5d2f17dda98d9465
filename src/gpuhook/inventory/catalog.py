"""What an NVIDIA driver installation consists of, grouped by driver capability.

The names follow the lists NVIDIA's libnvidia-container and container toolkit use. Libraries are
named without their version suffix (``libcuda.so``); the inventory finds each one's versioned file
and soname. A capability's libraries that a driver does not ship are reported as missing, which is
normal for optional ones (e.g. ``libnvidia-nscq.so`` exists only on NVSwitch systems).
"""

from __future__ import annotations

CAPABILITIES = ("compute", "compat32", "graphics", "utility", "video", "display", "ngx")

LIBRARIES: dict[str, tuple[str, ...]] = {
    "utility": (
        "libnvidia-ml.so",
        "libnvidia-cfg.so",
        "libnvidia-nscq.so",
    ),
    "compute": (
        "libcuda.so",
        "libcudadebugger.so",
        "libnvidia-opencl.so",
        "libnvidia-gpucomp.so",
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-fatbinaryloader.so",
        "libnvidia-allocator.so",
        "libnvidia-compiler.so",
        "libnvidia-pkcs11.so",
        "libnvidia-pkcs11-openssl3.so",
        "libnvidia-nvvm.so",
    ),
    "video": (
        "libvdpau_nvidia.so",
        "libnvidia-encode.so",
        "libnvidia-opticalflow.so",
        "libnvcuvid.so",
    ),
    "graphics": (
        "libnvidia-eglcore.so",
        "libnvidia-glcore.so",
        "libnvidia-tls.so",
        "libnvidia-glsi.so",
        "libnvidia-fbc.so",
        "libnvidia-ifr.so",
        "libnvidia-rtcore.so",
        "libnvoptix.so",
        "libGLX_nvidia.so",
        "libEGL_nvidia.so",
        "libGLESv2_nvidia.so",
        "libGLESv1_CM_nvidia.so",
        "libnvidia-glvkspirv.so",
        "libnvidia-cbl.so",
    ),
    "ngx": ("libnvidia-ngx.so",),
    "display": (
        "libnvidia-wfb.so",
        "nvidia_drv.so",
        "libglxserver_nvidia.so",
    ),
    # compat32: the same names as compute/utility, found in the 32-bit library folders.
    "compat32": (),
}

# Libraries a working driver always has; their absence is an error, not a note.
REQUIRED_LIBRARIES = ("libnvidia-ml.so", "libcuda.so")

# Driver executables: name -> capability.
BINARIES: dict[str, str] = {
    "nvidia-smi": "utility",
    "nvidia-debugdump": "utility",
    "nvidia-persistenced": "utility",
    "nvidia-cuda-mps-control": "compute",
    "nvidia-cuda-mps-server": "compute",
}

# Where binaries are looked for under the driver root.
BINARY_DIRS = ("/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin", "/sbin")

# Where the directory-scan fallback looks for libraries under the driver root (64-bit first).
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
    "/lib",
    "/usr/local/nvidia/lib64",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/xorg/modules/drivers",
    "/usr/lib/xorg/modules/extensions",
    "/usr/lib64/xorg/modules/drivers",
    "/usr/lib64/xorg/modules/extensions",
)
LIBRARY_DIRS_32 = ("/usr/lib/i386-linux-gnu", "/usr/lib32", "/lib/i386-linux-gnu", "/lib32")

# Control device nodes (path under dev_root) and the capability that needs each one.
CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)

# IPC sockets under the driver root that containers of a capability talk to.
IPC_SOCKETS: dict[str, str] = {
    "/run/nvidia-persistenced/socket": "utility",
    "/var/run/nvidia-persistenced/socket": "utility",
    "/run/nvidia-fabricmanager/socket": "compute",
    "/var/run/nvidia-fabricmanager/socket": "compute",
}

FIRMWARE_DIR = "/lib/firmware/nvidia"

# The graphics loader files of a driver (capability graphics): kind -> (the folder a container
# gets it in, where the loader looks; its names; the in-root folders it is looked for in, in
# order). The standard places (/usr/share/glvnd, /etc/vulkan, /usr/share/vulkan), and the share/
# folder of a driver root that is itself the driver's prefix (GKE's /usr/local/nvidia, whether
# driver_root is that folder or /).
LOADER_FILES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "EGL vendor": (
        "/usr/share/glvnd/egl_vendor.d",
        ("10_nvidia.json",),
        (
            "/usr/share/glvnd/egl_vendor.d",
            "/etc/glvnd/egl_vendor.d",
            "/usr/local/share/glvnd/egl_vendor.d",
            "/share/glvnd/egl_vendor.d",
            "/usr/local/nvidia/share/glvnd/egl_vendor.d",
        ),
    ),
    "Vulkan ICD": (
        "/etc/vulkan/icd.d",
        ("nvidia_icd.json", "nvidia_icd.x86_64.json"),
        (
            "/etc/vulkan/icd.d",
            "/usr/share/vulkan/icd.d",
            "/usr/local/share/vulkan/icd.d",
            "/share/vulkan/icd.d",
            "/usr/local/nvidia/share/vulkan/icd.d",
        ),
    ),
    "Vulkan implicit layer": (
        "/etc/vulkan/implicit_layer.d",
        ("nvidia_layers.json",),
        (
            "/etc/vulkan/implicit_layer.d",
            "/usr/share/vulkan/implicit_layer.d",
            "/usr/local/share/vulkan/implicit_layer.d",
            "/share/vulkan/implicit_layer.d",
            "/usr/local/nvidia/share/vulkan/implicit_layer.d",
        ),
    ),
}
LOADER_FILE_MAX_BYTES = 64 << 10

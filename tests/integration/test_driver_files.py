"""What real AI and rendering containers need from the driver, through gpuhook-runtime and real
runc on the fake node: the driver's development links (``-lcuda`` links inside the container),
CUDA forward compatibility (an image's newer compat libcuda first, an older one not), the
graphics files (EGL vendor, Vulkan ICD and implicit layer in both driver layouts, GLX indirect and
GBM links, the modeset node) only for ``graphics``, ``display`` on a headless host, a working
ld.so.cache on a distroless image, the reasons in ``gpuhook inspect spec``, and the same edits
through gpuhook's CDI spec applied by an engine."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuhook.inventory import ldcache
from tests import driverimages
from tests.conftest import Containers, FakeNode

pytestmark = [pytest.mark.slow, pytest.mark.root]

LIB = "/usr/local/gpuhook/lib"
HOST_DRIVER = "550.54.15"  # the fake node's
NEWER_NOTE = {
    "Format": 1,
    "CUDA Version": "12.8",
    "Driver": [535, 550, 560, 565, 570],
    "Device": [1, 2, 7, 8, 9, 10, 11, 12, 13, 14],
}
GRAPHICS_FILES = (
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/etc/vulkan/icd.d/nvidia_icd.json",
    "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
)


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("driver-tools")
    return {
        "loader": driverimages.build_loader(folder / "loader"),
        "probe": driverimages.build_probe_object(folder / "probe.o"),
    }


def run(
    containers: Containers, env: dict[str, str], script: str, *spec_env: str, **kw: Any
) -> tuple[subprocess.CompletedProcess[str], Path]:
    bundle = containers.bundle(args=("/bin/sh", "-c", script), env=spec_env, **kw)
    return containers.run(bundle, env), bundle


def prepared(containers: Containers, script: str, *spec_env: str) -> Path:
    """A bundle to change before it runs."""
    return containers.bundle(args=("/bin/sh", "-c", script), env=spec_env)


def inspect(node: FakeNode, bundle: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = node.gpuhook("inspect", "spec", "--bundle", str(bundle), "-o", "json", env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def notes(view: dict[str, Any]) -> dict[str, str]:
    return {n["what"]: n["why"] for n in view["edits"].get("notes", [])}


# --- 1. development links ----------------------------------------------------------------------


@pytest.mark.parametrize("level", ["info", "debug"], ids=["sh-hook", "python-hook"])
def test_libcuda_so_resolves_and_links_with_lcuda_inside_the_container(
    node: FakeNode, containers: Containers, tools: dict[str, Path], tmp_path: Path, level: str
) -> None:
    """At an operator's log level the installed dispatcher makes the links without Python; at
    debug level the hook runs in Python."""
    env = node.variant(tmp_path / "cfg", log={"level": level})
    script = (
        "ldconfig -p | grep -E 'lib(cuda|nvidia-ml)\\.so ' | sed 's/ (.*) => / => /'; "
        f"readlink {LIB}/libcuda.so; /loader libcuda.so; "
        f"ld -shared -o /tmp/libprobe.so /probe.o -L{LIB} -lcuda && /loader /tmp/libprobe.so"
    )
    bundle = prepared(containers, script, "NVIDIA_VISIBLE_DEVICES=0")
    rootfs = bundle / "rootfs"
    driverimages.install_linker(rootfs)
    for name in ("loader", "probe"):
        (rootfs / tools[name].name).write_bytes(tools[name].read_bytes())
    (rootfs / "loader").chmod(0o755)
    why = notes(inspect(node, bundle, env))
    out = containers.run(bundle, env)
    assert out.returncode == 0, out.stderr + out.stdout
    hook = json.loads((bundle / "config.json").read_text())["hooks"]["createContainer"][0]
    assert ("--rootfs" in hook["args"]) == (level == "info")
    lines = [line.strip() for line in out.stdout.splitlines()]
    assert lines[:3] == [
        f"libnvidia-ml.so => {LIB}/libnvidia-ml.so",
        f"libcuda.so => {LIB}/libcuda.so",
        "libcuda.so.1",
    ]
    # a dlopen of the development name loads the injected libcuda through the cache; -lcuda
    # found libcuda.so through the link, and libprobe's NEEDED libcuda.so.1 resolves at run time
    assert lines[3:] == [
        f"libcuda.so => {LIB}/libcuda.so: fake NVIDIA driver library (gpuhook tests)",
        "/tmp/libprobe.so => /tmp/libprobe.so: fake NVIDIA driver library (gpuhook tests)",
    ]
    assert any(w.startswith(f"development links in {LIB}: libcuda.so") for w in why), why


# --- 2. CUDA forward compatibility -------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "note", "used"),
    [
        ("570.124.06", NEWER_NOTE, True),  # newer, its note lists the host's branch 550
        ("575.57.08", None, True),  # newer branch, no note
        ("535.216.03", None, False),  # older than the host driver
        ("550.9.01", NEWER_NOTE, False),  # "550.9" > "550.54" as strings; older as numbers
        ("570.124.06", {**NEWER_NOTE, "Driver": [560, 565, 570]}, False),  # branch not listed
    ],
    ids=["newer-note", "newer-branch", "older", "older-by-numbers", "branch-unsupported"],
)
def test_an_images_compat_libcuda_is_first_only_when_it_may_be(
    node: FakeNode,
    containers: Containers,
    tools: dict[str, Path],
    version: str,
    note: dict[str, object] | None,
    used: bool,
) -> None:
    bundle = prepared(containers, "/loader libcuda.so.1", "NVIDIA_VISIBLE_DEVICES=0")
    rootfs = bundle / "rootfs"
    driverimages.install_compat(rootfs, version, note)
    (rootfs / "loader").write_bytes(tools["loader"].read_bytes())
    (rootfs / "loader").chmod(0o755)
    view = inspect(node, bundle)
    out = containers.run(bundle, node.env)
    assert out.returncode == 0, out.stderr + out.stdout
    why = notes(view)
    what = "CUDA forward compatibility (/usr/local/cuda/compat)"
    if used:
        assert out.stdout == (
            f"libcuda.so.1 => /usr/local/cuda-12.8/compat/libcuda.so.1: compat libcuda {version}\n"
        )
        key = f"{what}: /usr/local/cuda-12.8/compat first in the ld.so.cache"
        assert f"newer than the host driver {HOST_DRIVER}" in why[key]
        hook = view["edits"]["hooks"][0]["args"]
        assert hook.index("/usr/local/cuda-12.8/compat") < hook.index(LIB)
    else:
        assert out.stdout == (
            f"libcuda.so.1 => {LIB}/libcuda.so.1: fake NVIDIA driver library (gpuhook tests)\n"
        )
        assert f"libcuda.so.{version}" in why[f"{what}: not used"]


def test_compat_is_never_read_through_an_images_link_to_the_host(
    node: FakeNode, containers: Containers, tools: dict[str, Path], tmp_path: Path
) -> None:
    """/usr/local/cuda is an absolute link to a host folder holding a newer compat libcuda: the
    link resolves inside the image (where there is none), so nothing of the host is used."""
    host = tmp_path / "host-cuda"
    driverimages.install_compat(host, "999.1.1", None)
    bundle = prepared(containers, "/loader libcuda.so.1", "NVIDIA_VISIBLE_DEVICES=0")
    rootfs = bundle / "rootfs"
    (rootfs / "usr/local").mkdir(parents=True, exist_ok=True)
    (rootfs / "usr/local/cuda").symlink_to(host / "usr/local/cuda-12.8")
    (rootfs / "loader").write_bytes(tools["loader"].read_bytes())
    (rootfs / "loader").chmod(0o755)
    view = inspect(node, bundle)
    assert not [w for w in notes(view) if w.startswith("CUDA forward")]
    out = containers.run(bundle, node.env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"libcuda.so.1 => {LIB}/libcuda.so.1:")


# --- 3. graphics and display -------------------------------------------------------------------

GRAPHICS_PROBE = (
    "for f in " + " ".join(GRAPHICS_FILES) + "; do [ -f $f ] && echo file $f "
    "$(grep -o 'lib[A-Za-z_]*nvidia[.]so[.0-9]*' $f); done; "
    "ls /dev | grep -x nvidia-modeset; "
    f"readlink {LIB}/libGLX_indirect.so.0; readlink {LIB}/gbm/nvidia-drm_gbm.so; "
    f"[ -e {LIB}/gbm/nvidia-drm_gbm.so ] && echo gbm resolves; "
    "env | grep ^GBM_BACKENDS_PATH=; "
    "ldconfig -p | grep -E 'lib(EGL|GLX)_nvidia.so.0 ' | sed 's/ (.*) => / => /'"
)


def _graphics_seen(node: FakeNode, containers: Containers, caps: str) -> list[str]:
    out, _ = run(
        containers,
        node.env,
        GRAPHICS_PROBE,
        "NVIDIA_VISIBLE_DEVICES=0",
        f"NVIDIA_DRIVER_CAPABILITIES={caps}",
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.parametrize("layout", ["standard", "gke"])
def test_graphics_gets_the_loader_files_links_and_modeset_in_every_layout(
    node: FakeNode, fake_node_factory: Any, containers: Containers, layout: str
) -> None:
    if layout == "gke":
        node = fake_node_factory("--gpus", "1", "--layout", "gke")
        node.refresh()
    assert [s.strip() for s in _graphics_seen(node, containers, "graphics,compute,utility")] == [
        f"file {GRAPHICS_FILES[0]} libEGL_nvidia.so.0",
        f"file {GRAPHICS_FILES[1]} libGLX_nvidia.so.0",
        f"file {GRAPHICS_FILES[2]} libGLX_nvidia.so.0",
        "nvidia-modeset",
        "libGLX_nvidia.so.0",
        "../libnvidia-allocator.so.1",
        "gbm resolves",
        f"GBM_BACKENDS_PATH={LIB}/gbm:/usr/lib/x86_64-linux-gnu/gbm:/usr/lib/aarch64-linux-gnu/gbm:"
        "/usr/lib64/gbm:/usr/lib/gbm",
        f"libGLX_nvidia.so.0 => {LIB}/libGLX_nvidia.so.0",  # what the files name resolves
        f"libEGL_nvidia.so.0 => {LIB}/libEGL_nvidia.so.0",
    ]


def test_compute_and_utility_get_no_graphics_file_and_no_modeset(
    node: FakeNode, containers: Containers
) -> None:
    assert _graphics_seen(node, containers, "compute,utility") == []


def test_display_on_a_headless_host_starts_with_the_modeset_node(
    node: FakeNode, containers: Containers
) -> None:
    out, bundle = run(
        containers,
        node.env,
        "ls /dev | grep '^nvidia' | sort",
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_DRIVER_CAPABILITIES=display",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [  # no compute: no unified memory node (issue 36.4)
        "nvidia-modeset",
        "nvidia0",
        "nvidiactl",
    ]
    why = notes(inspect(node, bundle))
    assert why["/dev/nvidia-modeset"].startswith("display capability")
    assert "headless" in " ".join(why)


# --- 5. the ld.so.cache of a distroless image ----------------------------------------------------


@pytest.mark.parametrize("with_etc", [True, False], ids=["etc-without-ld-conf", "no-etc"])
def test_a_distroless_image_gets_a_cache_with_every_injected_library(
    node: FakeNode, containers: Containers, with_etc: bool
) -> None:
    bundle = containers.bundle(args=("/usr/bin/nvidia-smi", "-L"), env=["NVIDIA_VISIBLE_DEVICES=1"])
    rootfs = bundle / "rootfs"
    driverimages.distroless(rootfs, with_etc)
    mounts = inspect(node, bundle)["edits"]["mounts"]
    out = containers.run(bundle, node.env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("GPU 0: NVIDIA H100 80GB HBM3"), out.stdout  # NVML resolved
    assert not (rootfs / "etc/ld.so.conf.d").exists()
    cached = {(e.key, e.value) for e in ldcache.read(str(rootfs / "etc/ld.so.cache"))}
    injected = [p for p in container_paths(mounts) if p.startswith(LIB + "/") and ".so." in p]
    sonames = {p for p in injected if not p.rsplit(".so.", 1)[1].count(".")}
    assert sonames and all((os.path.basename(p), p) in cached for p in sonames), (sonames, cached)
    assert ("libcuda.so", f"{LIB}/libcuda.so") in cached


def container_paths(mounts: list[dict[str, Any]]) -> list[str]:
    """The container paths of the files the mounts give: a file's bind, or each file of a bind
    mounted folder (the driver's prepared library folder)."""
    paths = []
    for m in mounts:
        if m["type"] == "bind" and os.path.isdir(m["hostPath"]):
            paths += [f"{m['containerPath']}/{n}" for n in sorted(os.listdir(m["hostPath"]))]
        else:
            paths.append(m["containerPath"])
    return paths


# --- the CDI export, applied by an engine -------------------------------------------------------


def test_the_cdi_spec_carries_the_links_and_compat_decision_to_an_engine(
    node: FakeNode, containers: Containers, tools: dict[str, Path], tmp_path: Path
) -> None:
    """podman/containerd apply gpuhook's CDI edits themselves and run plain runc: the ldcache
    hook makes the development links and decides about the image's compat libcuda itself."""
    from gpuhook.pipeline import apply

    env = node.variant(tmp_path / "cfg", cdi={"capabilities": ["compute", "utility", "graphics"]})
    spec_file = tmp_path / "cdi.json"
    assert node.gpuhook("cdi", "generate", "--output", str(spec_file), env=env).returncode == 0
    data = json.loads(spec_file.read_text())
    common = data["containerEdits"]
    device = next(d["containerEdits"] for d in data["devices"] if d["name"] == "0")
    script = f"readlink {LIB}/libcuda.so; ls /dev | grep -x nvidia-modeset; /loader libcuda.so.1"
    bundle = prepared(containers, script)
    rootfs = bundle / "rootfs"
    driverimages.install_compat(rootfs, "570.124.06", NEWER_NOTE)
    (rootfs / "loader").write_bytes(tools["loader"].read_bytes())
    (rootfs / "loader").chmod(0o755)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["env"] += common["env"]
    edits = cdi_edits(common, device)
    (bundle / "config.json").write_text(json.dumps(apply.apply(spec, edits)))
    out = containers.run(bundle, {}, runtime="runc")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "libcuda.so.1",
        "nvidia-modeset",
        "libcuda.so.1 => /usr/local/cuda-12.8/compat/libcuda.so.1: compat libcuda 570.124.06",
    ]


def cdi_edits(*parts: dict[str, Any]) -> Any:
    """The containerEdits of CDI JSON parts as gpuhook's ContainerEdits (what an engine applies)."""
    from gpuhook.model.edits import ContainerEdits, Hook, Mount
    from gpuhook.model.inventory import DeviceNode

    nodes, mounts, hooks = [], [], []
    for p in parts:
        nodes += [
            DeviceNode(n["path"], n["hostPath"], n["major"], n["minor"], 0o666, n["type"])
            for n in p.get("deviceNodes", [])
        ]
        mounts += [
            Mount(m["hostPath"], m["containerPath"], m["type"], tuple(m["options"]))
            for m in p.get("mounts", [])
        ]
        hooks += [
            Hook(h["hookName"], h["path"], tuple(h["args"]), tuple(h["env"]), h.get("timeout"))
            for h in p.get("hooks", [])
        ]
    return ContainerEdits(device_nodes=tuple(nodes), mounts=tuple(mounts), hooks=tuple(hooks))


def test_an_images_own_libcuda_never_shadows_the_injected_one(
    node: FakeNode, containers: Containers, tools: dict[str, Path], tmp_path: Path
) -> None:
    """The image ships a libcuda.so.1 in a folder its ld.so.conf lists (and its cache names):
    the injected folder is given to ldconfig first, so the cache keeps the driver's."""
    bundle = prepared(containers, "/loader libcuda.so.1", "NVIDIA_VISIBLE_DEVICES=0")
    rootfs = bundle / "rootfs"
    image = tmp_path / "image"
    driverimages.install_compat(image, "999.1.1", None)
    stub = image / "usr/local/cuda-12.8/compat/libcuda.so.999.1.1"
    (rootfs / "usr/lib/x86_64-linux-gnu/libcuda.so.999.1.1").write_bytes(stub.read_bytes())
    (rootfs / "usr/lib/x86_64-linux-gnu/libcuda.so.1").symlink_to("libcuda.so.999.1.1")
    subprocess.run(["/sbin/ldconfig", "-r", str(rootfs)], check=True)
    (rootfs / "loader").write_bytes(tools["loader"].read_bytes())
    (rootfs / "loader").chmod(0o755)
    out = containers.run(bundle, node.env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"libcuda.so.1 => {LIB}/libcuda.so.1: fake NVIDIA driver"), (
        out.stdout
    )

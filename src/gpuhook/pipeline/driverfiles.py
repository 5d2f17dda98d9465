"""The driver files a container gets for its capabilities (pure): one owner for the runtime's
edits (:mod:`gpuhook.pipeline.inject`) and the CDI export (:mod:`gpuhook.engines.cdi`).

- The libraries of the capabilities, bind-mounted read-only under their real names and sonames
  into ``inject.lib_dir`` (a tmpfs, so nothing is written into the image's layer; 32-bit ones
  into ``<lib_dir>32``), and the unversioned development links the driver itself installs
  (``libcuda.so -> libcuda.so.1``, what ``-lcuda`` and Triton's launcher build look for), made
  by gpuhook's ldcache hook inside that tmpfs before it refreshes the container's ld.so.cache
  (which then lists them).
- ``graphics``: the EGL vendor, Vulkan ICD and implicit layer files where their loaders look (and
  a library such a file names by an absolute path, at that path), the GLX indirect link
  (``libGLX_indirect.so.0 -> libGLX_nvidia.so.0``) and the GBM backend link
  (``gbm/nvidia-drm_gbm.so -> ../libnvidia-allocator.so.1``, with ``GBM_BACKENDS_PATH`` naming its
  folder ahead of the image's own), and libnvidia-allocator, which that backend is.
- ``/dev/nvidia-modeset`` only for ``graphics`` and ``display``; ``display`` on a host without X
  server driver files (headless) gets the node and nothing else, never a failure.
- The driver binaries of the capabilities, the firmware (compute, utility) and the IPC sockets.
- Where ``gpuhook inventory refresh`` prepared the library folders of the capability set on the
  host (:mod:`gpuhook.runtime.prepared`: the same files, sonames and links, made once per
  driver), each folder is ONE read-only bind mount of its prepared folder instead of the tmpfs
  and a bind per file, the links are there already, and the ldcache hook reads the folder's
  ldconfig entries prepared with it (``--cache FOLDER=DIR``) instead of running ldconfig.

Every choice that is not obvious from the capability list carries a :class:`Note` for ``inspect``.
"""

from __future__ import annotations

from gpuhook.model.edits import Mount, Note
from gpuhook.model.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gpuhook.config.types import Config
    from gpuhook.model.inventory import DeviceNode, Inventory, Library

RO_BIND = ("ro", "nosuid", "nodev", "bind")
TMPFS_OPTIONS = ("nosuid", "nodev", "mode=755")
MODESET = "/dev/nvidia-modeset"
MODESET_CAPABILITIES = frozenset({"graphics", "display"})
# CUDA's unified memory nodes: without them no CUDA context can be made (libcuda, even one an
# image ships, fails cuInit), so only the compute capability gets them, as NVIDIA's
# libnvidia-container mounts no node outside the nvidia major without it. On an MPS-shared GPU
# that makes a grant MPS (compute: the MPS plan) or no CUDA at all (utility: NVML only).
UVM = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
DISPLAY_LIBRARIES = ("libnvidia-wfb.so", "nvidia_drv.so", "libglxserver_nvidia.so")
GLX_VENDOR = "libGLX_nvidia.so"
GLX_INDIRECT = "libGLX_indirect.so.0"
GBM_LIBRARY = "libnvidia-allocator.so"
GBM_BACKEND = "nvidia-drm_gbm.so"
GBM_ENV = "GBM_BACKENDS_PATH"
# Mesa's own backend folders (its compiled-in default, which GBM_BACKENDS_PATH replaces).
GBM_DEFAULT_DIRS = (
    "/usr/lib/x86_64-linux-gnu/gbm",
    "/usr/lib/aarch64-linux-gnu/gbm",
    "/usr/lib64/gbm",
    "/usr/lib/gbm",
)


class DriverFiles(Frozen):
    """What :func:`driver_files` gives a container: ``mounts``; ``folders``, the library
    folders its ld.so.cache must list; ``links``, the hook's ``LINK=TARGET`` arguments (links
    made inside those folders); ``env``; the ``notes`` saying why; ``caches``, the hook's
    ``FOLDER=DIR`` arguments (a prepared folder's ldconfig entries, in DIR on the host)."""

    mounts: tuple[Mount, ...]
    folders: tuple[str, ...]
    links: tuple[str, ...]
    env: tuple[str, ...]
    notes: tuple[Note, ...]
    caches: tuple[str, ...] = ()


def compat32_dir(lib_dir: str) -> str:
    return lib_dir.rstrip("/") + "32"


def control_nodes(inventory: Inventory, caps: frozenset[str]) -> list[DeviceNode]:
    """The control nodes for ``caps``: /dev/nvidia-modeset only for graphics and display, the
    unified memory nodes (:data:`UVM`) only for compute."""
    modeset = bool(caps & MODESET_CAPABILITIES)
    uvm = "compute" in caps
    return [
        n
        for n in inventory.control_nodes
        if (modeset or n.path != MODESET) and (uvm or n.path not in UVM)
    ]


# A prepared capability set's folder on the host: its library folders (the mount sources) and
# beside each the folder holding that folder's ldconfig entries (gpuhook.runtime.prepared).
PREPARED_LIBS = "lib"
PREPARED_LIBS32 = "lib32"
PREPARED_CACHE_SUFFIX = ".ldcache"


def prepared_subfolder(lib_dir: str, folder: str) -> str:
    """The subfolder of a prepared set that is the container's library folder ``folder``."""
    return PREPARED_LIBS32 if folder == compat32_dir(lib_dir) else PREPARED_LIBS


def driver_files(
    inventory: Inventory,
    config: Config,
    caps: frozenset[str],
    image_env: Sequence[str] = (),
    prepared: bool = True,
) -> DriverFiles:
    """The driver files of ``caps``. ``image_env``: the container's env (GBM_BACKENDS_PATH is
    extended, not replaced). ``prepared``: one bind mount per library folder where the
    inventory has the set's prepared folder (else, and for False, a tmpfs and a bind per file)."""
    files = per_file(inventory, config, caps, image_env)
    folder = inventory.prepared_folder(caps) if prepared and files.folders else ""
    return with_prepared(files, config, folder) if folder else files


def with_prepared(files: DriverFiles, config: Config, prepared: str) -> DriverFiles:
    """``files`` with each library folder given as one read-only bind of its prepared folder
    (which holds the same files and links): its mounts under those folders and its links
    dropped, the prepared ldconfig entries named for the hook."""
    lib_dir = config.lib_dir.rstrip("/") or "/"
    inside = tuple(f + "/" for f in files.folders)
    binds = [
        Mount(f"{prepared}/{prepared_subfolder(lib_dir, f)}", f, "bind", RO_BIND)
        for f in files.folders
    ]
    rest = [
        m
        for m in files.mounts
        if m.container_path not in files.folders and not m.container_path.startswith(inside)
    ]
    caches = tuple(
        f"{f}={prepared}/{prepared_subfolder(lib_dir, f)}{PREPARED_CACHE_SUFFIX}"
        for f in files.folders
    )
    note = Note(
        f"library folders: {', '.join(files.folders)} prepared on the host ({prepared})",
        "the driver files of this capability set, made once per driver at inventory refresh: "
        "one read-only bind mount per folder instead of one per file",
    )
    return DriverFiles(
        tuple(binds + rest), files.folders, (), files.env, (*files.notes, note), caches
    )


def per_file(
    inventory: Inventory,
    config: Config,
    caps: frozenset[str],
    image_env: Sequence[str] = (),
) -> DriverFiles:
    """The driver files of ``caps`` as a tmpfs per library folder with a read-only bind mount
    per library and soname, the links made by the hook; what :mod:`gpuhook.runtime.prepared`
    makes on the host."""
    lib_dir = config.lib_dir.rstrip("/") or "/"
    libs64 = [lib for lib in inventory.libraries if _wanted(lib, caps)]
    libs32 = [x for x in inventory.libraries if x.capability == "compat32" and "compat32" in caps]
    mounts: list[Mount] = []
    folders: list[str] = []
    links: list[str] = []
    notes: list[Note] = []
    for folder, libs in ((lib_dir, libs64), (compat32_dir(lib_dir), libs32)):
        if not libs:
            continue
        folders.append(folder)
        mounts.append(Mount("tmpfs", folder, "tmpfs", TMPFS_OPTIONS))
        for lib in sorted(libs, key=lambda x: x.name):
            names = [lib.name] if lib.soname == lib.name else [lib.name, lib.soname]
            mounts += [Mount(lib.path, f"{folder}/{name}", "bind", RO_BIND) for name in names]
        links += [f"{folder}/{lib.dev_link}={lib.soname}" for lib in libs if _has_dev_link(lib)]
    dev = sorted({lib.dev_link for lib in (*libs64, *libs32) if _has_dev_link(lib)})
    if dev:
        notes.append(
            Note(
                f"development links in {lib_dir}: {', '.join(dev)}",
                "the driver installs them beside its libraries; programs that link with -lcuda "
                "or -lnvidia-ml (torch.compile, Triton) need them",
            )
        )
    env: list[str] = []
    if "graphics" in caps:
        mounts, links, env = _graphics(inventory, lib_dir, libs64, mounts, links, notes, image_env)
    mounts += file_mounts(inventory, config, caps)
    if caps & MODESET_CAPABILITIES:
        notes += _modeset_notes(inventory, caps)
    return DriverFiles(tuple(mounts), tuple(folders), tuple(links), tuple(env), tuple(notes))


def _wanted(lib: Library, caps: frozenset[str]) -> bool:
    """A 64-bit library of ``caps`` (graphics also brings libnvidia-allocator: the GBM backend)."""
    if lib.capability == "compat32":
        return False
    if lib.capability in caps:
        return True
    return "graphics" in caps and lib.soname.startswith(GBM_LIBRARY + ".")


def _has_dev_link(lib: Library) -> bool:
    return bool(lib.dev_link) and lib.dev_link not in (lib.name, lib.soname)


def _graphics(
    inventory: Inventory,
    lib_dir: str,
    libs: list[Library],
    mounts: list[Mount],
    links: list[str],
    notes: list[Note],
    image_env: Sequence[str],
) -> tuple[list[Mount], list[str], list[str]]:
    """The graphics links (GLX indirect, GBM backend) and the GBM env; the loader files are
    file mounts (:func:`file_mounts`)."""
    env: list[str] = []
    loaders = [f.container_path for f in inventory.files if f.kind == "loader"]
    notes.append(
        Note(
            "graphics loader files: " + (", ".join(loaders) or "none on this host"),
            "graphics capability: glvnd finds NVIDIA's EGL and the Vulkan loader the GPU "
            "through them",
        )
    )
    glx = _by_prefix(libs, GLX_VENDOR)
    if glx is not None:
        links.append(f"{lib_dir}/{GLX_INDIRECT}={glx.soname}")
        notes.append(
            Note(
                f"GLX indirect link {lib_dir}/{GLX_INDIRECT} -> {glx.soname}",
                "graphics capability: glvnd's vendor for indirect GLX contexts (glvnd opens it "
                "by name, which ldconfig does not list for a link: it is found where the "
                "library folder is on LD_LIBRARY_PATH; __GLX_VENDOR_LIBRARY_NAME=nvidia needs "
                "no link)",
            )
        )
    gbm = _by_prefix(libs, GBM_LIBRARY)
    if gbm is not None:
        folder = f"{lib_dir}/gbm"
        mounts = [*mounts, Mount("tmpfs", folder, "tmpfs", TMPFS_OPTIONS)]
        links.append(f"{folder}/{GBM_BACKEND}=../{gbm.soname}")
        env.append(f"{GBM_ENV}={':'.join(_gbm_path(folder, image_env))}")
        notes.append(
            Note(
                f"GBM backend link {folder}/{GBM_BACKEND} -> ../{gbm.soname}, {GBM_ENV}",
                "graphics capability: Mesa's GBM loads NVIDIA's backend (libnvidia-allocator) "
                "from the folders GBM_BACKENDS_PATH names, the image's own ones after it",
            )
        )
    return mounts, links, env


def _gbm_path(folder: str, image_env: Sequence[str]) -> list[str]:
    key = GBM_ENV + "="
    given = [e[len(key) :] for e in image_env if isinstance(e, str) and e.startswith(key)]
    rest = [p for p in given[0].split(":") if p] if given else list(GBM_DEFAULT_DIRS)
    return [folder, *[p for p in rest if p != folder]]


def _by_prefix(libs: Iterable[Library], name: str) -> Library | None:
    return next((lib for lib in libs if lib.soname.startswith(name + ".")), None)


def _modeset_notes(inventory: Inventory, caps: frozenset[str]) -> list[Note]:
    which = "/".join(sorted(caps & MODESET_CAPABILITIES))
    modeset = any(n.path == MODESET for n in inventory.control_nodes)
    notes = [
        Note(
            MODESET if modeset else f"{MODESET}: not on this host",
            f"{which} capability (compute and utility containers do not get it)",
        )
    ]
    display = [lib for lib in inventory.libraries if lib.capability == "display"]
    if "display" in caps and not display:
        notes.append(
            Note(
                "display: no X server driver files on this host (headless)",
                "display adds the modeset node and nothing else here; the container is not "
                "refused",
            )
        )
    return notes


def file_mounts(inventory: Inventory, config: Config, caps: frozenset[str]) -> list[Mount]:
    """The binds of the driver binaries of ``caps``, the firmware, the IPC sockets and the
    graphics loader files."""
    bin_dir = config.bin_dir.rstrip("/") or "/"
    mounts: list[Mount] = []
    for f in inventory.files:
        firmware_wanted = f.kind == "firmware" and bool(caps & {"compute", "utility"})
        if f.capability not in caps and not firmware_wanted:
            continue
        if f.kind == "binary":
            mounts.append(Mount(f.path, f"{bin_dir}/{f.name}", "bind", RO_BIND))
        elif f.kind in ("firmware", "loader", "loader-library"):
            mounts.append(Mount(f.path, f.container_path, "bind", RO_BIND))
        elif f.kind == "socket":
            options = ("nosuid", "nodev", "noexec", "bind")
            mounts.append(Mount(f.path, f.container_path, "bind", options))
    return mounts

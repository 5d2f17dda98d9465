"""The graphics loader files of a driver root: glvnd's EGL vendor file (``10_nvidia.json``), the
Vulkan ICD (``nvidia_icd.json``) and the Vulkan implicit layer file (``nvidia_layers.json``).

Without them glvnd finds no NVIDIA EGL and Vulkan no GPU. Each is looked for in every layout a
driver root has (:data:`gpuhook.inventory.catalog.LOADER_FILES`) and given to a ``graphics``
container where its loader looks. The library a file names must resolve in the container: a bare
name must be one of the driver libraries (found through the container's ld.so.cache, which lists
the injected ones); an absolute path is a library of the inventory, mounted at that path too. A
file that names anything else would make the loader fail, so it is left out with a warning.
"""

from __future__ import annotations

import os

from gpuhook import _fastjson
from gpuhook.fsutil import resolve_in_root
from gpuhook.inventory import catalog
from gpuhook.model.inventory import HostFile

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from gpuhook.model.inventory import Library

CAPABILITY = "graphics"


def scan(root: str, libraries: Iterable[Library], warnings: list[str]) -> list[HostFile]:
    """The loader files found under ``root`` (first of each kind), and for one that names its
    library by an absolute path, that library (kind ``loader-library``)."""
    by_name: dict[str, Library] = {}
    for lib in libraries:
        if lib.capability != "compat32":
            by_name.setdefault(lib.soname, lib)
            by_name.setdefault(lib.name, lib)
    out: list[HostFile] = []
    for kind, (container_dir, names, folders) in catalog.LOADER_FILES.items():
        found = _first(root, names, folders)
        if found is None:
            continue
        host, name = found
        problem, library = _named_library(host, by_name)
        if problem:
            warnings.append(f"{kind} file {host} left out: {problem}")
            continue
        out.append(HostFile("loader", name, host, f"{container_dir}/{name}", CAPABILITY))
        if library is not None:
            path, lib = library
            out.append(HostFile("loader-library", lib.name, lib.path, path, CAPABILITY))
    return out


def _first(root: str, names: tuple[str, ...], folders: tuple[str, ...]) -> tuple[str, str] | None:
    for folder in folders:
        for name in names:
            host = resolve_in_root(root, f"{folder}/{name}")
            if os.path.isfile(host):
                return host, name
    return None


def _named_library(
    host: str, by_name: dict[str, Library]
) -> tuple[str, tuple[str, Library] | None]:
    """("", None) when the file names a driver library by a bare name; ("", (path, library))
    when it names one by an absolute path; (what is wrong, None) otherwise."""
    try:
        with open(host, "rb") as fh:
            raw = fh.read(catalog.LOADER_FILE_MAX_BYTES + 1)
    except OSError as exc:
        return f"unreadable ({exc.strerror})", None
    if len(raw) > catalog.LOADER_FILE_MAX_BYTES:
        return f"larger than {catalog.LOADER_FILE_MAX_BYTES} bytes", None
    try:
        doc: Any = _fastjson.loads(raw)
    except ValueError as exc:
        return f"not valid JSON ({exc})", None
    section = doc.get("ICD") or doc.get("layer") if isinstance(doc, dict) else None
    path = section.get("library_path") if isinstance(section, dict) else None
    if not isinstance(path, str) or not path:
        return "names no library_path", None
    lib = by_name.get(path.rsplit("/", 1)[-1])
    if lib is None:
        return f"its library {path} is not a driver library of the inventory", None
    if "/" not in path:
        return "", None
    if not path.startswith("/") or ".." in path.split("/"):
        return f"its library path {path} is neither a bare name nor absolute", None
    return "", (path, lib)

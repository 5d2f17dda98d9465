"""CUDA forward compatibility (pure): whether a container's ld.so.cache lists the image's
``/usr/local/cuda/compat`` libraries ahead of the host driver's.

An image built for a newer CUDA than the host driver supports ships NVIDIA's forward
compatibility package: ``/usr/local/cuda/compat/libcuda.so.<driver version>`` (and its
libnvidia-ptxjitcompiler, libnvidia-nvvm). That libcuda runs on an older kernel driver of a
supported branch, on the GPUs NVIDIA supports it on; elsewhere CUDA fails (error 803/804). So the
folder goes first only when all of these hold:

- the image ships exactly one ``libcuda.so.<version>`` there, and it could be read;
- its version is newer than the host driver's, compared as numbers field by field
  (``580.82.07`` is older than ``580.126.16``, though a string comparison says otherwise);
- when the library carries NVIDIA's ``.note.cuda.fwd_compatibility`` note: the host driver's
  branch (major version) is one it lists, and every granted GPU's NVML brand is one it lists;
  without the note: its branch is newer than the host's, and every granted GPU is of a brand
  NVIDIA supports forward compatibility on (data center, workstation and vGPU brands; never
  GeForce, Titan, NVS).

What the image ships is read by :mod:`gpuhook.runtime.imagefs` (never following the image's
links on the host side); here it is only compared.
"""

from __future__ import annotations

from gpuhook.model.edits import Note
from gpuhook.model.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

COMPAT_DIR = "/usr/local/cuda/compat"
NOTE_SECTION = ".note.cuda.fwd_compatibility"
NOTE_OWNER = "NVIDIA Corporation"
# nvmlBrandType_t values of GPUs with forward compatibility: Quadro 1, Tesla 2, the vGPU brands
# 7..11, Quadro RTX 12, NVIDIA RTX 13, NVIDIA (data center) 14. The note NVIDIA's compat
# libcuda carries lists exactly these as its "Device" field.
SUPPORTED_BRANDS = frozenset({1, 2, 7, 8, 9, 10, 11, 12, 13, 14})
BRAND_NAMES = {
    0: "unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "GRID",
    5: "GeForce",
    6: "Titan",
    12: "Quadro RTX",
    13: "NVIDIA RTX",
    14: "NVIDIA",
    15: "GeForce RTX",
    16: "Titan RTX",
}
WHAT = f"CUDA forward compatibility ({COMPAT_DIR})"


class CompatLibrary(Frozen):
    """The forward compatibility libcuda an image ships: ``folder``, the container path of its
    folder (the image's links resolved inside the image); ``file`` (``libcuda.so.<version>``);
    ``version``; from its note, when it has one: ``drivers`` (host driver branches it supports)
    and ``brands`` (GPU brands). ``problem``: why it cannot be used ("" when it can be read)."""

    folder: str
    file: str = ""
    version: str = ""
    drivers: tuple[int, ...] | None = None
    brands: tuple[int, ...] | None = None
    problem: str = ""


class CompatChoice(Frozen):
    """The decision: ``folder`` to put first in the ld.so.cache ("" for none), and why."""

    folder: str
    note: Note


def parse_version(text: str) -> tuple[int, ...] | None:
    """``"580.126.16"`` -> ``(580, 126, 16)``; None for anything but 2 to 4 dotted numbers."""
    parts = text.split(".")
    if not 2 <= len(parts) <= 4 or not all(p.isdigit() and p.isascii() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def note_fields(desc: bytes) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(drivers, brands) of the JSON description of NVIDIA's forward compatibility note (its
    ``Driver`` and ``Device`` lists); a field that is missing or malformed is None."""
    from gpuhook import _fastjson

    try:
        doc = _fastjson.loads(desc.rstrip(b"\0"))
    except ValueError:
        return None, None
    if not isinstance(doc, dict):
        return None, None
    return _ints(doc.get("Driver")), _ints(doc.get("Device"))


def _ints(value: object) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(type(v) is int for v in value):
        return tuple(value)
    return None


def choose(lib: CompatLibrary, host_driver: str, brands: Iterable[int]) -> CompatChoice:
    """Whether ``lib`` goes first, for a host driver version and the granted GPUs' brands."""
    problem = _problem(lib, host_driver, tuple(brands))
    if problem:
        return CompatChoice("", Note(WHAT + ": not used", problem))
    return CompatChoice(
        lib.folder,
        Note(
            f"{WHAT}: {lib.folder} first in the ld.so.cache",
            f"the image's {lib.file} is newer than the host driver {host_driver} and supports "
            "its branch and GPUs",
        ),
    )


def _problem(lib: CompatLibrary, host_driver: str, brands: tuple[int, ...]) -> str:
    if lib.problem:
        return lib.problem
    compat, host = parse_version(lib.version), parse_version(host_driver)
    if compat is None:
        return f"the image's {lib.file} has no driver version in its name"
    if host is None:
        return f"the host driver version {host_driver!r} is unknown"
    if compat <= host:
        return f"the image's {lib.file} is not newer than the host driver {host_driver}"
    if lib.drivers is not None and host[0] not in lib.drivers:
        listed = ", ".join(str(d) for d in lib.drivers)
        return f"{lib.file} does not support the host driver branch {host[0]} (only {listed})"
    if lib.drivers is None and compat[0] <= host[0]:
        return (
            f"{lib.file} has no forward compatibility note and is of the host driver's branch "
            f"{host[0]} or older"
        )
    allowed = SUPPORTED_BRANDS if lib.brands is None else frozenset(lib.brands)
    refused = sorted({b for b in brands if b not in allowed})
    if refused:
        names = ", ".join(BRAND_NAMES.get(b, f"brand {b}") for b in refused)
        return f"forward compatibility is not supported on {names} GPUs"
    return ""

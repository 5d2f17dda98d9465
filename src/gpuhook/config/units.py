"""Sizes as gpuhook's config and CUDA MPS write them: ``512M``, ``20G``, ``1.5GiB`` (binary
units). Pure; the MPS plan (:mod:`gpuhook.pipeline.sharing`) reads its limits through it too."""

from __future__ import annotations

MIB = 1 << 20
GIB = 1 << 30
_UNITS = {"k": 1 << 10, "m": MIB, "g": GIB, "t": 1 << 40}


def parse_size(text: object) -> int:
    """``512M``, ``20G``, ``1.5GiB`` -> bytes (binary units, as MPS reads them). Raises
    ValueError with a one-line reason."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a size (e.g. 512M or 20G)")
    raw = text.strip()
    lowered = raw.lower()
    for suffix in ("ib", "b"):
        if lowered.endswith(suffix) and len(lowered) > len(suffix) + 1:
            lowered = lowered[: -len(suffix)]
            break
    unit = _UNITS.get(lowered[-1:]) if lowered else None
    number = lowered[:-1]
    if unit is None or not number or number.count(".") > 1 or not number.replace(".", "").isdigit():
        raise ValueError(f"{text!r} is not a size (a number and a unit K, M, G or T: 512M, 20G)")
    value = int(float(number) * unit) if "." in number else int(number) * unit
    if value < MIB:
        raise ValueError(f"{text!r} is less than 1M")
    return value

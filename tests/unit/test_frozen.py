"""gpuhook's value objects (gpuhook.model.frozen.Frozen): each field is written once, as an
annotation with its default; the class gets slots, an __init__ in that order, equality, hashing,
repr, replace, and refuses changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuhook.model.frozen import Frozen

SRC = Path(__file__).resolve().parents[2] / "src"


class Point(Frozen):
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()
    label: str | None = None


class Labelled(Point):
    note: str = ""


def test_fields_in_order_with_defaults_positional_or_by_name() -> None:
    assert Point(1) == Point(x=1) == Point(1, 0, (), None)
    p = Point(1, 2, ("a",), label="p")
    assert (p.x, p.y, p.tags, p.label) == (1, 2, ("a",), "p")
    assert repr(p) == "Point(x=1, y=2, tags=('a',), label='p')"
    assert vars(Point)["__slots__"] == ("x", "y", "tags", "label")
    with pytest.raises(TypeError, match="missing field 'x'"):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected or repeated field 'x'"):
        Point(1, x=2)  # type: ignore[misc]
    with pytest.raises(TypeError, match="takes 4 fields"):
        Point(1, 2, (), None, "extra")  # type: ignore[call-arg]


def test_a_tuple_field_stores_a_tuple_of_any_iterable() -> None:
    p = Point(1, tags=["a", "b"])  # type: ignore[arg-type]
    assert p.tags == ("a", "b") and hash(p) == hash(Point(1, tags=("a", "b")))
    assert Point(1, 0, iter(["c"]), None).tags == ("c",)  # type: ignore[arg-type]
    assert Point(1, label=None).label is None  # an optional field is never converted


def test_frozen_equality_hashing_and_replace() -> None:
    p = Point(1, 2)
    with pytest.raises(AttributeError, match="frozen"):
        p.x = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        p.z = 3  # type: ignore[attr-defined, unused-ignore]
    assert p.replace(y=5) == Point(1, 5) and p == Point(1, 2)
    assert len({p, Point(1, 2), Point(2, 2)}) == 2
    assert Labelled(1, note="n") != Point(1)  # another type is never equal
    assert Labelled(1, 2, (), None, "n").note == "n"
    assert Labelled._fields == ("x", "y", "tags", "label", "note")


def test_the_base_imports_nothing() -> None:
    """The create path imports it: no module of the standard library comes with it."""
    code = (
        f"import sys; sys.path.insert(0, {str(SRC)!r}); before = set(sys.modules);"
        "import gpuhook.model.frozen; print(sorted(set(sys.modules) - before))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "['gpuhook', 'gpuhook.model', 'gpuhook.model.frozen']"

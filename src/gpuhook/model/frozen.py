"""The frozen base of gpuhook's value objects: ``from gpuhook.model.frozen import Frozen``
everywhere (:mod:`gpuhook.model` itself imports nothing). A module of its own so that the
runtime shim's argv parser (:mod:`gpuhook.runtime.runc_argv`) uses it without any value type.

A value object names each field once, as an annotation, with its default when it has one::

    class Mount(Frozen):
        host_path: str
        container_path: str
        type: str = "bind"
        options: tuple[str, ...] = ()

The class gets ``__slots__`` and an ``__init__`` taking the fields in that order (positionally or
by name; a ``tuple[...]`` field stores any other iterable it is given as a tuple), equality,
hashing and repr over them, and :meth:`Frozen.replace`; an instance cannot be changed. A
subclass adds its fields after its base's. A class whose construction does more (a derived
field, a conversion) defines its own ``__init__`` and sets the fields with :func:`_init`.
Stdlib-free and cheap to import (the container-create path uses it); type checkers read the
fields through ``dataclass_transform``.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, Self, dataclass_transform
else:

    def dataclass_transform(**_options):
        return lambda cls: cls


class _FrozenType(type):
    """Derives ``__slots__``, the field names and their defaults from a class body's
    annotations (a body that states ``__slots__`` itself keeps it: slots that are no field)."""

    if TYPE_CHECKING:
        _fields: "tuple[str, ...]"
        _defaults: "dict[str, Any]"
        _tuples: "frozenset[str]"

    def __new__(
        mcs, name: str, bases: "tuple[type, ...]", namespace: "dict[str, Any]"
    ) -> "_FrozenType":
        annotations = namespace.get("__annotations__", {})
        own = [n for n in annotations if not n.startswith("_")]
        defaults = {n: namespace.pop(n) for n in own if n in namespace}
        namespace.setdefault("__slots__", tuple(own))
        cls = super().__new__(mcs, name, bases, namespace)
        inherited: tuple[str, ...] = getattr(cls, "_fields", ())
        cls._fields = (*inherited, *(n for n in own if n not in inherited))
        cls._defaults = {**getattr(cls, "_defaults", {}), **defaults}
        tuples = {n for n in own if _is_tuple(annotations[n])}
        cls._tuples = frozenset({*getattr(cls, "_tuples", ()), *tuples})
        return cls


def _is_tuple(annotation: object) -> bool:
    """``tuple[...]`` (a string under ``from __future__ import annotations``), never optional."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return text.startswith("tuple") and "|" not in text and "None" not in text


@dataclass_transform(frozen_default=True)
class Frozen(metaclass=_FrozenType):
    """Immutable, slotted value object: equality, hashing and repr follow its fields."""

    if TYPE_CHECKING:
        _fields: "ClassVar[tuple[str, ...]]"
        _defaults: "ClassVar[dict[str, Any]]"
        _tuples: "ClassVar[frozenset[str]]"

    def __init__(self, *args: "Any", **kwargs: "Any") -> None:
        cls = type(self)
        names = cls._fields
        if not kwargs and len(args) == len(names) and not cls._tuples:
            for name, value in zip(names, args, strict=True):
                object.__setattr__(self, name, value)
            return
        if len(args) > len(names):
            raise TypeError(f"{cls.__name__} takes {len(names)} fields, {len(args)} given")
        values = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name not in names or name in values:
                raise TypeError(f"{cls.__name__}: unexpected or repeated field {name!r}")
            values[name] = value
        defaults, tuples = cls._defaults, cls._tuples
        for name in names:
            if name in values:
                value = values[name]
            elif name in defaults:
                value = defaults[name]
            else:
                raise TypeError(f"{cls.__name__}: missing field {name!r}")
            if name in tuples and type(value) is not tuple:
                value = tuple(value)
            object.__setattr__(self, name, value)

    def _values(self) -> "tuple[object, ...]":
        return tuple(getattr(self, name) for name in self._fields)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, *self._values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__name__}({inner})"

    def replace(self, **changes: "Any") -> "Self":
        """A copy with some fields changed (like ``dataclasses.replace``)."""
        values: dict[str, Any] = {name: getattr(self, name) for name in self._fields}
        values.update(changes)
        return type(self)(**values)


def _init(obj: Frozen, **values: object) -> None:
    """Set the fields of a value object whose class defines its own ``__init__``."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)

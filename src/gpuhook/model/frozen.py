"""The frozen base of gpuhook's value objects: ``from gpuhook.model.frozen import Frozen, _init``
everywhere (:mod:`gpuhook.model` itself imports nothing). A module of its own so that the
runtime shim's argv parser (:mod:`gpuhook.runtime.runc_argv`) uses it without any value type.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Self


class Frozen:
    """Immutable, slotted value object: equality, hashing and repr follow ``__slots__``."""

    __slots__: tuple[str, ...] = ()

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((type(self).__name__, *self._fields()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({inner})"

    def replace(self, **changes: "Any") -> "Self":
        """A copy with some fields changed (like ``dataclasses.replace``)."""
        values: dict[str, Any] = {name: getattr(self, name) for name in self.__slots__}
        values.update(changes)
        return type(self)(**values)


def _init(obj: Frozen, **values: object) -> None:
    for name, value in values.items():
        object.__setattr__(obj, name, value)

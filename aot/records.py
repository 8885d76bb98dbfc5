"""Immutable records without dataclasses: :class:`Record`.

A record's fields are its class's ``__slots__``, in the order its ``__init__`` takes
them; equality, hashing, ``repr``, immutability, copying and pickling behave as a
frozen dataclass's do. Only the serving modules (cache/serving) still derive from it;
everything else uses ``@dataclass(frozen=True, slots=True)``, and so will they.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeVar

    R = TypeVar("R", bound="Record")


class Record:
    """Base of an immutable record; a subclass names its fields in ``__slots__`` and
    sets them in ``__init__`` with :meth:`_set`."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__match_args__ = cls.__slots__

    def _set(self, *values: Any) -> None:
        for name, value in zip(self.__slots__, values, strict=True):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self.__slots__])

    def _replace(self: R, **changes: Any) -> R:
        """A copy with some fields changed (``dataclasses.replace``)."""
        unknown = set(changes) - set(self.__slots__)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        return type(self)(*[changes.get(name, getattr(self, name)) for name in self.__slots__])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__qualname__}({fields})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), self._values()

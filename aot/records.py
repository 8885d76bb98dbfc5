"""Immutable records, and frozen dataclasses, that cost little to define.

Defining a frozen dataclass costs a process 0.5-2 ms (Python 3.11 compiles six
generated methods per class) and a ``typing.NamedTuple`` about 0.2 ms, and a serving
process defines every record on its path at start-up (issue 15). The internal records
on that path derive from :class:`Record` instead: a record's fields are its class's
``__slots__``, in the order its ``__init__`` takes them, and equality, hashing,
``repr``, immutability, copying and pickling behave as a frozen dataclass's do.

Value objects of the public interface on that path (``IndexEntry``, ``Manifest``,
``Fingerprint``, ``Artifact``) stay frozen dataclasses, declared ``init=False,
repr=False, eq=False`` over :class:`DataclassMethods`: their ``__init__`` is written
out and sets the fields with :func:`set_fields`, and :class:`DataclassMethods`
provides the ``repr``, ``==`` and ``hash``, each as dataclasses would have generated
it, without compiling it (only ``__setattr__`` and ``__delattr__`` still are).
tests/aot/test_records.py checks that each written-out ``__init__`` takes the fields,
in order, with their defaults.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, FrozenInstanceError, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeVar

    R = TypeVar("R", bound="Record")
    _Plan = tuple[
        tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...],
        tuple[tuple[str, Callable[[], Any]], ...],
    ]


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


class _Factory:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


#: The default of an ``__init__`` argument whose field has a ``default_factory``
#: (shown as ``<factory>``, as in a generated ``__init__``).
FACTORY: Any = _Factory()

# Per dataclass: the fields its repr shows, == compares, hash hashes and __init__ sets,
# and the default factories, as dataclasses chooses them from each field's options.
_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        found = fields(cls)
        plan = _PLANS[cls] = (
            tuple(f.name for f in found if f.repr),
            tuple(f.name for f in found if f.compare),
            tuple(f.name for f in found if (f.compare if f.hash is None else f.hash)),
            tuple(f.name for f in found if f.init),
            tuple((f.name, f.default_factory) for f in found if f.init and f.default_factory is not MISSING),
        )
    return plan


def set_fields(obj: Any, values: Mapping[str, Any]) -> None:
    """What the ``__init__`` dataclasses would generate does, for one written out: sets
    each field of ``obj`` from ``values`` (that ``__init__``'s ``locals()``), calling the
    field's default factory where the argument is :data:`FACTORY`, then
    ``__post_init__`` if the class has one."""
    plan = _plan(type(obj))
    setter = object.__setattr__
    for name in plan[3]:
        setter(obj, name, values[name])
    for name, factory in plan[4]:
        if values[name] is FACTORY:
            setter(obj, name, factory())
    post_init = getattr(obj, "__post_init__", None)
    if post_init is not None:
        post_init()


class DataclassMethods:
    """``repr``, ``==`` and ``hash`` of a frozen dataclass declared ``init=False,
    repr=False, eq=False``, the same as the ones dataclasses would compile for it."""

    __slots__ = ()

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in _plan(type(self))[0])
        return f"{self.__class__.__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        names = _plan(type(self))[1]
        return tuple([getattr(self, n) for n in names]) == tuple([getattr(other, n) for n in names])

    def __hash__(self) -> int:
        return hash(tuple([getattr(self, n) for n in _plan(type(self))[2]]))

"""aot.records: records and dataclass methods behave as a frozen dataclass's would."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
from typing import Any

import pytest

from aot.records import FACTORY, DataclassMethods, Record, set_fields


class Point(Record):
    __slots__ = ("x", "y", "label")
    x: int
    y: int
    label: str

    def __init__(self, x: int, y: int, label: str = "") -> None:
        self._set(x, y, label)


@dataclasses.dataclass(frozen=True)
class DataPoint:
    x: int
    y: int
    label: str = ""


def test_a_record_compares_hashes_and_prints_as_a_frozen_dataclass() -> None:
    p = Point(1, 2)
    assert p == Point(1, 2, "") and p != Point(1, 3) and hash(p) == hash(Point(1, 2))
    assert p != (1, 2, "") and p != DataPoint(1, 2)  # another class is never equal
    assert repr(p) == repr(DataPoint(1, 2)).replace("DataPoint", "Point")
    assert {p, Point(1, 2)} == {p}


def test_a_record_is_immutable() -> None:
    p = Point(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.y
    with pytest.raises(AttributeError):
        p.other = 1  # type: ignore[attr-defined]


def test_a_record_copies_pickles_replaces_and_matches() -> None:
    p = Point(1, 2, "a")
    assert copy.copy(p) == p and copy.deepcopy(p) == p and pickle.loads(pickle.dumps(p)) == p
    assert p._replace(y=5) == Point(1, 5, "a") and p == Point(1, 2, "a")
    with pytest.raises(TypeError, match="no field 'z'"):
        p._replace(z=1)
    match p:
        case Point(x, y, label):
            assert (x, y, label) == (1, 2, "a")


@dataclasses.dataclass(frozen=True, slots=True, init=False, repr=False, eq=False)
class Declared(DataclassMethods):
    a: int
    b: list[int] = dataclasses.field(default_factory=list, hash=False)
    c: str = dataclasses.field(default="", repr=False)
    d: Any = dataclasses.field(default=None, compare=False)

    def __init__(self, a: int, b: list[int] = FACTORY, c: str = "", d: Any = None) -> None:
        set_fields(self, locals())

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a < 0")


@dataclasses.dataclass(frozen=True, slots=True)
class Generated:
    a: int
    b: list[int] = dataclasses.field(default_factory=list, hash=False)
    c: str = dataclasses.field(default="", repr=False)
    d: Any = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a < 0")


def _pairs() -> list[tuple[Any, Any]]:
    values = [(1,), (1, [2]), (1, [2], "x"), (1, [2], "x", object()), (2, [], "", None)]
    return [(Declared(*v), Generated(*v)) for v in values]


def test_dataclass_methods_are_the_ones_dataclasses_would_generate() -> None:
    pairs = _pairs()
    for declared, generated in pairs:
        assert repr(declared) == repr(generated).replace("Generated", "Declared")
        assert (declared == "other") is (generated == "other") is False
        for other_declared, other_generated in pairs:
            assert (declared == other_declared) == (generated == other_generated)
            assert (declared != other_declared) == (generated != other_generated)
    frozen = Declared(1, [2], "x")
    assert hash(frozen) == hash(Generated(1, [2], "x")) == hash(Declared(1, [3], "x"))  # b: hash=False
    assert dataclasses.replace(frozen, a=5) == Declared(5, [2], "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.a = 2  # type: ignore[misc]
    assert Declared(1).b == [] and Declared(1).b is not Declared(1).b  # the factory, per instance
    assert Declared(1, d=None, c="", b=None).b is None  # an explicit value, even None
    for cls in (Declared, Generated):
        with pytest.raises(ValueError, match="a < 0"):
            cls(-1)  # __post_init__ runs
        with pytest.raises(TypeError):
            cls()  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            cls(1, [], "", None, 5)  # type: ignore[call-arg]


def test_a_recursive_repr_stops_as_dataclasses_does() -> None:
    declared_loop: list[Any] = []
    generated_loop: list[Any] = []
    declared, generated = Declared(1, d=declared_loop), Generated(1, d=generated_loop)
    declared_loop.append(declared)
    generated_loop.append(generated)
    # repr shows d, and "..." where the object recurs inside it.
    assert repr(declared) == repr(generated).replace("Generated", "Declared") == "Declared(a=1, b=[], d=[...])"


@pytest.mark.parametrize(
    "cls", ["aot.artifact:Manifest", "aot.artifact:Artifact", "aot.fingerprint:Fingerprint", "aot.cache.index.entry:IndexEntry"]
)
def test_public_value_objects_are_frozen_dataclasses_with_these_methods(cls: str) -> None:
    module, _, name = cls.partition(":")
    value_class = getattr(importlib.import_module(module), name)
    assert dataclasses.is_dataclass(value_class) and value_class.__dataclass_params__.frozen
    assert issubclass(value_class, DataclassMethods)
    for method in ("__repr__", "__eq__", "__hash__"):
        assert getattr(value_class, method) is getattr(DataclassMethods, method)
    # Its written-out __init__ takes the fields, in order, with their defaults: what the
    # generated one would take (a field added without it fails here).
    expected = [
        (f.name, f.default if f.default is not dataclasses.MISSING
         else FACTORY if f.default_factory is not dataclasses.MISSING else inspect.Parameter.empty)
        for f in dataclasses.fields(value_class) if f.init
    ]
    parameters = list(inspect.signature(value_class.__init__).parameters.values())[1:]
    assert [(p.name, p.default) for p in parameters] == expected
    assert {p.kind for p in parameters} == {inspect.Parameter.POSITIONAL_OR_KEYWORD}

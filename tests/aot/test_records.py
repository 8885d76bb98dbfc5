"""aot.records: a record behaves as a frozen dataclass would."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import pytest

from aot.records import Record


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

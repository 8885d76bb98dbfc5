"""Pytree structure <-> JSON: no pickle, no memory addresses, clear errors."""

from __future__ import annotations

import collections
import json
from typing import NamedTuple

import jax
import pytest

import aot
from aot import treedef as treedefs

Point = collections.namedtuple("Point", ["x", "y"])


class Typed(NamedTuple):
    weights: object
    bias: object


class Box:
    """A registered pytree node whose auxiliary data is JSON."""

    def __init__(self, value, label, size):
        self.value, self.label, self.size = value, label, size


jax.tree_util.register_pytree_node(
    Box,
    lambda b: ((b.value,), (b.label, b.size)),
    lambda aux, children: Box(children[0], *aux),
)


class Opaque:
    """A registered node whose auxiliary data is not JSON."""

    def __init__(self, value):
        self.value = value


jax.tree_util.register_pytree_node(
    Opaque, lambda o: ((o.value,), object()), lambda aux, children: Opaque(children[0])
)


def round_trip(tree):
    treedef = jax.tree_util.tree_structure(tree)
    text = json.dumps(treedefs.to_json(treedef))  # must be plain JSON
    rebuilt = treedefs.from_json(json.loads(text))
    return treedef, rebuilt


@pytest.mark.parametrize(
    "tree",
    [
        0,
        None,
        (),
        [],
        {},
        (0, [0, None], {"a": 0, "b": (0, 0)}),
        {"layers": [{"w": 0, "b": 0} for _ in range(3)], "scale": 0, "none": None},
        [[[[0]]], ((0,),), {"deep": {"er": [0, (None, 0)]}}],
        {1: 0, 2: [0, 0]},  # integer keys
        {("a", 1): 0, ("b", 2): 0},  # tuple keys
        ((0, 0), {}),  # the (args, kwargs) shape of every in_tree
    ],
    ids=lambda t: json.dumps(str(t))[:40],
)
def test_standard_containers_round_trip(tree):
    treedef, rebuilt = round_trip(tree)
    assert rebuilt == treedef
    # Unflattening gives the same containers back.
    leaves = list(range(treedef.num_leaves))
    assert jax.tree_util.tree_unflatten(rebuilt, leaves) == jax.tree_util.tree_unflatten(
        treedef, leaves
    )


def test_importable_namedtuples_round_trip_to_the_same_class():
    treedef, rebuilt = round_trip({"p": Point(0, [0, Typed(0, None)])})
    assert rebuilt == treedef
    value = jax.tree_util.tree_unflatten(rebuilt, [1, 2, 3])
    assert type(value["p"]) is Point
    assert type(value["p"].y[1]) is Typed
    assert value == {"p": Point(1, [2, Typed(3, None)])}


def test_a_namedtuple_that_cannot_be_imported_is_rebuilt_from_its_fields():
    Local = collections.namedtuple("Local", ["alpha", "beta"])  # not importable: <locals>
    treedef = jax.tree_util.tree_structure([Local(0, (0, 0))])
    data = treedefs.to_json(treedef)
    # collections.namedtuple sets __qualname__ to the bare name, which this module lacks.
    assert data["c"][0]["type"] == "tests.aot.test_treedef:Local"
    rebuilt = treedefs.from_json(json.loads(json.dumps(data)))
    (value,) = jax.tree_util.tree_unflatten(rebuilt, [1, 2, 3])
    assert type(value) is not Local
    assert type(value).__name__ == "Local"
    assert value._fields == ("alpha", "beta")
    assert value.alpha == 1 and value.beta == (2, 3)
    # The rebuilt class is reused: two loads give equal treedefs.
    assert treedefs.from_json(data) == rebuilt


def test_a_namedtuple_with_other_fields_is_not_mistaken_for_the_importable_one():
    data = treedefs.to_json(jax.tree_util.tree_structure(Point(0, 0)))
    data["fields"] = ["x", "z"]
    value = jax.tree_util.tree_unflatten(treedefs.from_json(data), [1, 2])
    assert type(value) is not Point
    assert value._fields == ("x", "z")


def test_custom_registered_node_with_json_aux_round_trips():
    treedef, rebuilt = round_trip({"box": Box([0, 0], "weights", 3)})
    assert rebuilt == treedef
    value = jax.tree_util.tree_unflatten(rebuilt, [7, 8])["box"]
    assert type(value) is Box
    assert (value.value, value.label, value.size) == ([7, 8], "weights", 3)


def test_custom_node_whose_class_cannot_be_imported_names_the_class():
    class Hidden:
        def __init__(self, value):
            self.value = value

    jax.tree_util.register_pytree_node(
        Hidden, lambda h: ((h.value,), "aux"), lambda aux, children: Hidden(children[0])
    )
    data = treedefs.to_json(jax.tree_util.tree_structure((Hidden(0),)))
    with pytest.raises(aot.UnsupportedComputationError) as info:
        treedefs.from_json(data)
    name = "tests.aot.test_treedef:test_custom_node_whose_class_cannot_be_imported_names_the_class.<locals>.Hidden"
    assert str(info.value).startswith(f"pytree node class {name} cannot be imported in this process")
    assert "import the module that registers it before loading" in str(info.value)


def test_custom_node_with_non_json_aux_is_stored_by_digest():
    """Auxiliary data that does not round-trip (here a bare object()) is identified by
    a digest of its description; rebuilding it needs the caller's own node."""
    data = treedefs.to_json(jax.tree_util.tree_structure(Opaque(0)))
    assert data["type"] == "tests.aot.test_treedef:Opaque" and "aux" not in data
    assert len(data["digest"]) == 64
    with pytest.raises(aot.PytreeNodeError) as info:
        treedefs.from_json(data)
    assert "auxiliary data was not stored" in str(info.value)
    # Another Opaque (another object(), another address) has the same digest...
    assert treedefs.to_json(jax.tree_util.tree_structure(Opaque(1))) == data
    # ...and a caller's own node rebuilds it.
    live = jax.tree_util.tree_structure(Opaque(2))
    rebuilt = treedefs.from_json(data, nodes=treedefs.node_table(live))
    assert rebuilt == live


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"t": "nonsense", "c": []},
        {"t": "tuple"},
        {"t": "dict", "k": ["a", "b"], "c": [{"t": "leaf"}]},
        {"c": []},
    ],
)
def test_malformed_json_is_a_corrupt_artifact(data):
    with pytest.raises(aot.CorruptArtifactError):
        treedefs.from_json(data)


def test_canonical_form_is_stable_and_has_no_addresses():
    tree = {"box": Box(0, "l", 1), "p": Point(0, None), "list": [0, (0,)]}
    first = treedefs.canonical(jax.tree_util.tree_structure(tree))
    second = treedefs.canonical(jax.tree_util.tree_structure(dict(reversed(list(tree.items())))))
    assert first == second
    assert "0x" not in first
    assert "test_treedef:Box" in first and "test_treedef:Point" in first
    # Different structures have different canonical forms.
    assert first != treedefs.canonical(jax.tree_util.tree_structure({**tree, "list": [0, [0]]}))


def test_format_1_descriptions_are_still_read():
    """Format 1 stored a custom node's JSON aux (tuples as {"tuple": [...]}) and no
    digest: it matches and rebuilds as the same structure."""
    treedef = jax.tree_util.tree_structure({"box": Box([0, 0], "weights", 3), "keys": {("k", 1): 0}})
    new = treedefs.to_json(treedef)
    box = new["c"][0]
    assert box["aux"] == {"$": "tuple", "v": ["weights", 3]} and len(box["digest"]) == 64
    assert new["c"][1]["k"] == [{"$": "tuple", "v": ["k", 1]}]
    old = json.loads(json.dumps(new))
    old["c"][1]["k"] = [{"tuple": ["k", 1]}]
    old["c"][0] = {"t": "custom", "type": box["type"], "aux": {"tuple": ["weights", 3]}, "c": box["c"]}
    assert treedefs.structure_key_of_json(old) == treedefs.structure_key(treedef)
    assert treedefs.from_json(old) == treedef


def test_values_in_auxiliary_data_are_described_without_addresses():
    sentinel = object()

    def local(x):
        return x + len(label)

    label = "abc"
    described = treedefs.encode(
        (jax.numpy.float32, {"a": (1, 2.5, float("nan"))}, frozenset({3, 1}), json.dumps, local, sentinel, b"\x00")
    )
    text = json.dumps(described)
    assert "0x" not in text
    assert {"$": "fn", "v": "json:dumps"} in described["v"]
    closure = described["v"][4]
    assert closure["opaque"] and closure["closure"] == ["abc"]  # what the closure holds
    assert described["v"][5] == {"$": "object", "v": "builtins:object"}
    assert described["v"][1] == {
        "$": "dict", "v": [["a", {"$": "tuple", "v": [1, 2.5, {"$": "float", "v": "nan"}]}]]
    }
    assert treedefs.decode(described["v"][0]) is jax.numpy.float32
    assert treedefs.decode(described["v"][2]) == frozenset({1, 3})


@pytest.mark.parametrize(
    "aux",
    [
        {"$": "bytes", "v": "!!not base64"},
        {"$": "scalar", "dtype": "float32", "v": "x"},
        {"$": "scalar", "dtype": "nonsense", "v": 1},
        {"$": "class", "v": "os:system"},
        {"$": "method", "v": "mro", "self": {"$": "class", "v": "builtins:int"}},
        {"$": "dataclass", "v": "builtins:int", "fields": []},
        {"$": "enum", "v": "builtins:int", "name": "x"},
        {"$": "treedef", "v": {"t": "bogus"}},
        {"$": "dict", "v": [[[1, 2], 3]]},  # an unhashable key
        {"$": "nonsense"},
        {"$": "tuple", "v": 7},
    ],
)
def test_hostile_auxiliary_data_is_refused_as_an_aot_error(aux):
    """Stored aux is decoded against classes already imported; anything it cannot
    decode (or that is malformed) leaves the node unrebuilt, never a raw exception."""
    node = {"t": "custom", "type": "test_treedef:Box", "digest": "0" * 64, "aux": aux, "c": [{"t": "leaf"}]}
    with pytest.raises(aot.AotError):
        treedefs.from_json(node)
    assert treedefs.from_json(node, standins=True).num_leaves == 1
    keyed = {"t": "dict", "k": [aux], "c": [{"t": "leaf"}]}
    with pytest.raises(aot.AotError):
        treedefs.from_json(keyed)

"""Pytree structure <-> JSON, with no pickle and no memory addresses.

Standard containers (tuple, list, dict, None) always round-trip. A namedtuple whose
class cannot be imported where the JSON is read is rebuilt with the same type name
and fields. Other registered pytree nodes are rebuilt when their class is importable
and their auxiliary data is JSON; otherwise ``from_json`` raises a clear error.
"""

from __future__ import annotations

import collections
import json
import logging
import sys
from typing import Any

import jax
from jax.tree_util import PyTreeDef, default_registry

from aot.errors import CorruptArtifactError, UnsupportedComputationError

log = logging.getLogger(__name__)

_LEAF = {"t": "leaf"}
_NAMEDTUPLE_CACHE: dict[tuple[str, str, tuple[str, ...]], type] = {}


def _is_namedtuple_class(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _json_aux(aux: Any, cls: type) -> Any:
    try:
        return json.loads(json.dumps(aux))
    except (TypeError, ValueError):
        raise UnsupportedComputationError(
            f"pytree node {cls.__module__}.{cls.__qualname__} has auxiliary data "
            f"{aux!r} that is not JSON; use standard containers or a node whose "
            "auxiliary data is a string, number or tuple of those"
        ) from None


def to_json(treedef: PyTreeDef) -> dict[str, Any]:
    """A JSON-able description of ``treedef``."""
    node = treedef.node_data()
    if node is None:
        return dict(_LEAF)
    cls, aux = node
    children = [to_json(child) for child in treedef.children()]
    if cls is tuple:
        return {"t": "tuple", "c": children}
    if cls is list:
        return {"t": "list", "c": children}
    if cls is dict:
        # Keys go through the tuple encoding too: JSON would turn ('a', 1) into a list.
        return {"t": "dict", "k": [_json_aux(_aux_for_json(k), cls) for k in aux], "c": children}
    if cls is type(None):
        return {"t": "none"}
    if _is_namedtuple_class(cls):
        return {
            "t": "namedtuple",
            "type": f"{cls.__module__}:{cls.__qualname__}",
            "fields": list(cls._fields),
            "c": children,
        }
    return {
        "t": "custom",
        "type": f"{cls.__module__}:{cls.__qualname__}",
        "aux": _json_aux(_aux_for_json(aux), cls),
        "c": children,
    }


def _aux_for_json(aux: Any) -> Any:
    if isinstance(aux, tuple):
        return {"tuple": [_aux_for_json(a) for a in aux]}
    return aux


def _aux_from_json(aux: Any) -> Any:
    if isinstance(aux, dict) and set(aux) == {"tuple"}:
        return tuple(_aux_from_json(a) for a in aux["tuple"])
    return aux


def _import_class(path: str) -> type | None:
    """The class at ``module:qualname`` if its module is already imported.

    Never imports: a manifest (possibly from a bundle) must not make this process run
    a module's top-level code, and serving never imports the model's code (the caller
    imports whatever registers its custom pytree nodes, as the error message says).
    """
    module_name, _, qualname = path.partition(":")
    try:
        obj: Any = sys.modules.get(module_name)
        if obj is None:
            return None
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001 - any import failure means "not available here"
        return None
    return obj if isinstance(obj, type) else None


def _namedtuple_class(path: str, fields: list[str]) -> type:
    cls = _import_class(path)
    if cls is not None and _is_namedtuple_class(cls) and list(cls._fields) == fields:
        return cls
    key = (path, path.rpartition(".")[2], tuple(fields))
    if key not in _NAMEDTUPLE_CACHE:
        name = path.rpartition(":")[2].rpartition(".")[2]
        log.info("namedtuple %s is not importable here; rebuilding it from its fields", path)
        _NAMEDTUPLE_CACHE[key] = collections.namedtuple(name, fields)  # type: ignore[misc]
    return _NAMEDTUPLE_CACHE[key]


def from_json(data: Any) -> PyTreeDef:
    """Rebuilds a ``PyTreeDef`` from :func:`to_json` output."""
    try:
        return _from_json(data)
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
        raise CorruptArtifactError(f"malformed pytree structure in manifest: {exc!r}") from None


def _from_json(data: Any) -> PyTreeDef:
    if not isinstance(data, dict):
        raise CorruptArtifactError(f"malformed pytree node {data!r}: expected an object")
    kind = data["t"]
    if kind == "leaf":
        return jax.tree_util.tree_structure(0)
    if kind == "none":
        return jax.tree_util.tree_structure(None)
    children = [_from_json(c) for c in data["c"]]
    if kind == "tuple":
        node: tuple[type, Any] = (tuple, None)
    elif kind == "list":
        node = (list, None)
    elif kind == "dict":
        keys = [_aux_from_json(k) for k in data["k"]]
        if len(keys) != len(children):
            raise CorruptArtifactError("malformed pytree dict: keys and children differ in count")
        node = (dict, keys)
    elif kind == "namedtuple":
        fields = [str(f) for f in data["fields"]]
        if len(fields) != len(children):
            raise CorruptArtifactError("malformed pytree namedtuple: fields and children differ in count")
        node = (_namedtuple_class(str(data["type"]), fields), None)
    elif kind == "custom":
        cls = _import_class(data["type"])
        if cls is None:
            raise UnsupportedComputationError(
                f"pytree node class {data['type']} cannot be imported in this process; "
                "import the module that registers it before loading, or ask for flat "
                "outputs (aot.rehydrate.load_executable(..., flat_outputs=True))"
            )
        node = (cls, _aux_from_json(data["aux"]))
    else:
        raise CorruptArtifactError(f"unknown pytree node kind {kind!r} in manifest")
    try:
        return PyTreeDef.from_node_data_and_children(default_registry, node, children)
    except Exception as exc:  # noqa: BLE001 - jaxlib raises ValueError/TypeError/RuntimeError
        raise CorruptArtifactError(f"cannot rebuild pytree node {data.get('type', kind)}: {exc}") from None


def canonical(treedef: PyTreeDef) -> str:
    """A canonical string form (stable across processes; no memory addresses)."""
    return json.dumps(to_json(treedef), sort_keys=True, separators=(",", ":"))

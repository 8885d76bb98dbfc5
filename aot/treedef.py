"""Pytree structure <-> JSON: no pickle, no imports, no memory addresses.

Every node is recorded with what identifies it::

    {"t": "leaf"} | {"t": "none"} | {"t": "tuple", "c": [...]} | {"t": "list", "c": [...]}
    {"t": "dict", "k": [KEY, ...], "c": [...]}
    {"t": "namedtuple", "type": "module:Qual", "fields": [...], "c": [...]}
    {"t": "custom", "type": "module:Qual", "digest": SHA256, ["aux": VALUE], "c": [...]}

A registered node's auxiliary data can hold anything: Equinox's ``MISSING`` sentinel,
Flax's bound ``apply_fn`` and Optax's closures, checkify's tracebacks and treedefs.
It is described by :func:`encode` as a JSON value that is the same in every process
(functions by ``module:qualname`` and the values they close over, sentinels by the
module attribute that holds them, objects by type and fields; never an address). The
``digest`` of that description identifies the node, so a caller's structure is
matched by digest in any process. The description itself is stored as ``aux`` only
when it round-trips (decoding it and describing the result gives it back), and then a
process that has imported the node's class can rebuild the node without the caller.

A manifest (possibly from a bundle) names modules. Only JAX's own modules and those of
the libraries in :data:`aot.libraries.LIBRARY_PACKAGES` are imported on demand (a checkify error
names ``jax._src.checkify``; the user need not import it first); any other module,
such as the model's own code, is looked up only if the process has imported it.

Rebuilding, :func:`from_json`: a node comes from (1) the caller's own input structure
when one of its nodes has the same type and digest (``nodes=``, see
:func:`node_table`; a train step returns the state it was given), else (2) the
stored ``aux`` decoded against classes this process has imported, else (3) JAX's
``register_pytree_node_serialization`` registry, else it is a stand-in
(:class:`Unresolved`, with ``standins=True``) or a :class:`PytreeNodeError`.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import enum
import functools
import hashlib
import json
import logging
import math
import sys
import types
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.tree_util import PyTreeDef, default_registry

from aot.errors import CorruptArtifactError, PytreeNodeError
from aot.jaxcompat.dtypes import ExtendedDType
from aot.libraries import import_library

log = logging.getLogger(__name__)

_LEAF = {"t": "leaf"}
_NAMEDTUPLE_CACHE: dict[tuple[str, tuple[str, ...]], type] = {}
_MAX_DEPTH = 16  # deeper auxiliary data is described by its type alone
_BUDGET = 20_000  # values described per node (a closure over a huge object stops here)
_HASHED_ARRAY_BYTES = 1 << 20  # larger arrays in auxiliary data: dtype and shape only


def _path(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None)}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _type_path(value: Any) -> str:
    return _path(type(value))


def _is_namedtuple_class(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _sha(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode()).hexdigest()


# ------------------------------------------------------------------ describing values


class _NotDecodable(Exception):
    """A description cannot be turned back into the value here."""


class _NotImported(_NotDecodable):
    """The module a description names is not imported in this process (and is not a
    library module the loader imports): a limit of this process, not corruption."""


def _resolve(path: str) -> Any:
    """The object at ``module:qualname`` if its module is imported, or is a library
    module :func:`import_library` imports."""
    module_name, sep, qualname = str(path).partition(":")
    if not sep or not qualname or "<locals>" in qualname or "<lambda>" in qualname:
        raise _NotDecodable(path)
    obj: Any = import_library(module_name)
    if obj is None:
        raise _NotImported(path)
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:  # noqa: BLE001 - any failure means "not available here"
            raise _NotDecodable(path) from None
    return obj


_CONSTANTS: dict[str, dict[int, str]] = {}


def _constant_name(value: Any) -> str | None:
    """``"module:NAME"`` when ``value`` is a module-level constant of its type's module
    (a sentinel such as Equinox's ``MISSING``): stable in every process."""
    module_name: str = getattr(type(value), "__module__", None) or ""
    module = sys.modules.get(module_name)
    if module is None:
        return None
    table = _CONSTANTS.get(module_name)
    if table is None or id(value) not in table:
        table = {}
        for name, attr in list(vars(module).items()):
            if not name.startswith("__") and not isinstance(attr, (type, types.ModuleType, types.FunctionType)):
                table.setdefault(id(attr), name)
        _CONSTANTS[module_name] = table
    found = table.get(id(value))
    if found is not None and getattr(module, found, None) is value:
        return f"{module_name}:{found}"
    return None


def _dtype_str(dtype: Any) -> str:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return str(dtype)
    return np.dtype(dtype).name


class _Encoder:
    """Describes a value as JSON (see the module docstring); ``aux`` decides whether
    treedefs nested in the value carry their own round-tripping ``aux``."""

    def __init__(self, aux: bool) -> None:
        self.aux = aux
        self.budget = _BUDGET
        self.active: set[int] = set()
        self.nested_treedef = False

    def encode(self, v: Any, depth: int = 0) -> Any:
        self.budget -= 1
        t = type(v)
        if v is None or t is bool or t is str or t is int:
            return v
        if t is float:
            return v if math.isfinite(v) else {"$": "float", "v": repr(v)}
        if depth > _MAX_DEPTH or self.budget < 0:
            return {"$": "object", "v": _type_path(v), "truncated": True}
        if id(v) in self.active:
            return {"$": "object", "v": _type_path(v), "cycle": True}
        self.active.add(id(v))
        try:
            return self._encode(v, t, depth + 1)
        finally:
            self.active.discard(id(v))

    def _items(self, items: Any, depth: int) -> list[Any]:
        return [self.encode(x, depth) for x in items]

    def _encode(self, v: Any, t: type, depth: int) -> Any:  # noqa: C901 - one dispatch table
        if t is complex:
            return {"$": "complex", "v": [self.encode(v.real), self.encode(v.imag)]}
        if t is bytes:
            return {"$": "bytes", "v": base64.b64encode(v).decode()}
        if isinstance(v, enum.Enum):
            return {"$": "enum", "v": _type_path(v), "name": v.name}
        if isinstance(v, PyTreeDef):
            self.nested_treedef = True
            return {"$": "treedef", "v": to_json(v, aux=self.aux)}
        if isinstance(v, type):
            return {"$": "class", "v": _path(v)}
        if t is tuple:
            return {"$": "tuple", "v": self._items(v, depth)}
        if t is list:
            return self._items(v, depth)
        if t is dict:
            return {"$": "dict", "v": [[self.encode(k, depth), self.encode(x, depth)] for k, x in v.items()]}
        if t is set or t is frozenset:
            items = sorted(self._items(v, depth), key=_canonical)
            return {"$": t.__name__, "v": items}
        if _is_namedtuple_class(t):
            return {
                "$": "namedtuple", "v": _type_path(v),
                "fields": [[f, self.encode(getattr(v, f), depth)] for f in getattr(t, "_fields")],
            }
        if isinstance(v, (np.dtype, ExtendedDType)):
            return {"$": "dtype", "v": _dtype_str(v)}
        if isinstance(v, jax.ShapeDtypeStruct):
            return {
                "$": "sds", "shape": [int(d) for d in v.shape], "dtype": _dtype_str(v.dtype),
                "weak": bool(v.weak_type),
            }
        if isinstance(v, (np.ndarray, jax.Array)):
            return self._array(v)
        if isinstance(v, np.generic):
            return {"$": "scalar", "dtype": _dtype_str(v.dtype), "v": self.encode(v.item(), depth)}
        if t.__name__ == "Traceback" and t.__module__.startswith("jaxlib"):
            # Where a checkify check was traced: not the same in two processes, and
            # only used to point at the source line in an error message.
            return {"$": "traceback"}
        if isinstance(v, functools.partial):
            return {
                "$": "partial", "fn": self.encode(v.func, depth),
                "args": self._items(v.args, depth),
                "kw": [[k, self.encode(x, depth)] for k, x in sorted(v.keywords.items())],
            }
        if isinstance(v, types.MethodType):
            return {"$": "method", "v": v.__func__.__name__, "self": self.encode(v.__self__, depth)}
        if callable(v) and isinstance(getattr(v, "__qualname__", None), str) and isinstance(
            getattr(v, "__module__", None), str
        ):
            return self._function(v, depth)
        constant = _constant_name(v)
        if constant is not None:
            return {"$": "const", "v": constant}
        if dataclasses.is_dataclass(v):
            return {
                "$": "dataclass", "v": _type_path(v),
                "fields": [[f.name, self.encode(getattr(v, f.name, None), depth)] for f in dataclasses.fields(v)],
            }
        state = getattr(v, "__dict__", None)
        out: dict[str, Any] = {"$": "object", "v": _type_path(v)}
        if isinstance(state, dict) and state:
            out["state"] = [[str(k), self.encode(x, depth)] for k, x in sorted(state.items(), key=lambda kv: str(kv[0]))]
        return out

    def _array(self, v: Any) -> Any:
        out: dict[str, Any] = {"$": "array", "dtype": _dtype_str(v.dtype), "shape": [int(d) for d in v.shape]}
        try:
            if v.dtype != object and v.size * v.dtype.itemsize <= _HASHED_ARRAY_BYTES:
                out["sha256"] = hashlib.sha256(np.ascontiguousarray(np.asarray(v)).tobytes()).hexdigest()
        except Exception:  # noqa: BLE001 - tracers, deleted arrays: shape and dtype only
            pass
        return out

    def _function(self, v: Any, depth: int) -> Any:
        path = _path(v)
        try:
            if _resolve(path) is v:
                return {"$": "fn", "v": path}
        except _NotDecodable:
            pass
        out: dict[str, Any] = {"$": "fn", "v": path, "opaque": True}
        # A closure's behaviour is its code and the values it closes over (optax's
        # learning rate is in a closure cell): they are part of its identity.
        closure = getattr(v, "__closure__", None)
        if closure:
            cells = []
            for cell in closure:
                try:
                    cells.append(self.encode(cell.cell_contents, depth))
                except ValueError:  # an empty cell
                    cells.append({"$": "object", "v": "empty-cell"})
            out["closure"] = cells
        defaults = getattr(v, "__defaults__", None)
        if defaults:
            out["defaults"] = self._items(defaults, depth)
        return out


def encode(value: Any, *, aux: bool = True) -> Any:
    """A JSON description of ``value`` that is the same in every process."""
    return _Encoder(aux).encode(value)


def _legacy_dict(value: dict[str, Any]) -> bool:
    return "$" not in value and not (set(value) == {"tuple"})


def decode(data: Any) -> Any:
    """The value an :func:`encode` description stands for; raises ``_NotDecodable``."""
    if data is None or isinstance(data, (bool, str, int, float)):
        return data
    if isinstance(data, list):
        return [decode(x) for x in data]
    if not isinstance(data, dict):
        raise _NotDecodable(repr(data)[:40])
    if set(data) == {"tuple"} and isinstance(data["tuple"], list):  # format 1
        return tuple(decode(x) for x in data["tuple"])
    if "$" not in data:  # format 1: a JSON object was a dict with string keys
        return {str(k): decode(v) for k, v in data.items()}
    kind = data["$"]
    v: Any = data.get("v")  # its type depends on kind; each branch checks what it needs
    if kind == "tuple":
        return tuple(decode(x) for x in v)
    if kind == "dict":
        return {_hashable(decode(k)): decode(x) for k, x in v}
    if kind in ("set", "frozenset"):
        items = [_hashable(decode(x)) for x in v]
        return set(items) if kind == "set" else frozenset(items)
    if kind == "float":
        return float(v)
    if kind == "complex":
        return complex(decode(v[0]), decode(v[1]))
    if kind == "bytes":
        return base64.b64decode(str(v), validate=True)
    if kind == "class":
        cls = _resolve(v)
        if not isinstance(cls, type):
            raise _NotDecodable(v)
        return cls
    if kind == "fn":
        if data.get("opaque"):
            raise _NotDecodable(v)
        fn = _resolve(v)
        if not callable(fn):
            raise _NotDecodable(v)
        return fn
    if kind == "const":
        return _resolve(v)
    if kind == "enum":
        cls = _resolve(v)
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise _NotDecodable(v)
        return cls[str(data["name"])]
    if kind == "dtype":
        from aot.specs import parse_dtype

        try:
            return parse_dtype(str(v))
        except Exception:  # noqa: BLE001
            raise _NotDecodable(v) from None
    if kind == "sds":
        from aot.specs import parse_dtype

        return jax.ShapeDtypeStruct(
            tuple(int(d) for d in data["shape"]), parse_dtype(str(data["dtype"])),
            weak_type=bool(data.get("weak")),
        )
    if kind == "scalar":
        from aot.specs import parse_dtype

        return np.dtype(parse_dtype(str(data["dtype"]))).type(decode(v))
    if kind == "treedef":
        try:
            return from_json(v)
        except Exception:  # noqa: BLE001 - a node inside cannot be rebuilt here
            raise _NotDecodable("treedef") from None
    if kind == "traceback":
        from aot.jaxcompat.pytrees import current_traceback

        return current_traceback()
    if kind == "partial":
        fn = decode(data["fn"])
        return functools.partial(fn, *(decode(a) for a in data["args"]), **{str(k): decode(x) for k, x in data["kw"]})
    if kind == "method":
        owner = decode(data["self"])
        name = str(v)
        attr = _static_attribute(type(owner), name)
        if not isinstance(attr, (types.FunctionType, classmethod, staticmethod)):
            raise _NotDecodable(name)
        return getattr(owner, name)
    if kind == "namedtuple":
        cls = _resolve(v)
        fields = [str(f) for f, _ in data["fields"]]
        if not _is_namedtuple_class(cls) or list(cls._fields) != fields:
            raise _NotDecodable(v)
        return cls(*(decode(x) for _, x in data["fields"]))
    if kind == "dataclass":
        cls = _resolve(v)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise _NotDecodable(v)
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        values = {str(k): decode(x) for k, x in data["fields"]}
        if set(values) != init:  # a field set after __init__ cannot be restored
            raise _NotDecodable(v)
        return cls(**values)
    raise _NotDecodable(str(kind))  # objects, arrays: described, not stored


def _static_attribute(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return None


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        raise _NotDecodable("unhashable key") from None
    return value


def _round_trips(description: Any) -> bool:
    """Decoding ``description`` here and describing the result gives it back."""
    try:
        return encode(decode(description)) == description
    except Exception:  # noqa: BLE001 - user constructors can raise anything
        return False


def _digest(encoder: _Encoder, description: Any) -> str:
    if encoder.nested_treedef:  # nested treedefs are identified without their aux
        description = _strip_nested(description)
    return _sha(description)


def _strip_nested(value: Any) -> Any:
    if isinstance(value, list):
        return [_strip_nested(v) for v in value]
    if isinstance(value, dict):
        if value.get("$") == "treedef":
            return {"$": "treedef", "v": key_form(value["v"])}
        return {k: _strip_nested(v) for k, v in value.items()}
    return value


def describe_aux(aux: Any) -> tuple[str, Any]:
    """``(digest, description)`` of a node's auxiliary data."""
    encoder = _Encoder(aux=True)
    description = encoder.encode(aux)
    return _digest(encoder, description), description


# ------------------------------------------------------------------ structures


def _jax_serialization(cls: type, aux: Any) -> dict[str, Any] | None:
    """The node's auxiliary data through JAX's ``register_pytree_node_serialization``."""
    try:
        from aot.jaxcompat.pytrees import node_serializer

        registered = node_serializer(cls)
        if registered is None:
            return None
        name, serialize = registered
        return {"name": name, "data": base64.b64encode(bytes(serialize(aux))).decode()}
    except Exception as exc:  # noqa: BLE001 - a user serializer failing: not stored
        log.debug("jax serialization of %s failed: %s", _path(cls), exc)
        return None


def _jax_deserialization(ser: Any) -> tuple[type, Any] | None:
    try:
        from aot.jaxcompat.pytrees import node_deserializer

        registered = node_deserializer(str(ser["name"]))
        if registered is None:
            return None
        cls, deserialize = registered
        return cls, deserialize(base64.b64decode(str(ser["data"]), validate=True))
    except Exception:  # noqa: BLE001
        return None


def to_json(treedef: PyTreeDef, *, aux: bool = True) -> dict[str, Any]:
    """A JSON description of ``treedef``.

    ``aux=False`` leaves out the round-tripping auxiliary data (and skips checking it):
    what matching a caller's structure needs, nothing more.
    """
    node = treedef.node_data()
    if node is None:
        return dict(_LEAF)
    cls, data = node
    children = [to_json(child, aux=aux) for child in treedef.children()]
    if cls is tuple:
        return {"t": "tuple", "c": children}
    if cls is list:
        return {"t": "list", "c": children}
    if cls is dict:
        # Keys are described like any value: JSON would turn ('a', 1) into a list.
        return {"t": "dict", "k": [encode(k, aux=aux) for k in data], "c": children}
    if cls is type(None):
        return {"t": "none"}
    if _is_namedtuple_class(cls):
        return {"t": "namedtuple", "type": _path(cls), "fields": list(cls._fields), "c": children}
    if cls is Unresolved:
        path, digest = data
        return {"t": "custom", "type": path, "digest": digest, "c": children}
    encoder = _Encoder(aux)
    description = encoder.encode(data)
    out: dict[str, Any] = {"t": "custom", "type": _path(cls), "digest": _digest(encoder, description)}
    if aux:
        if _round_trips(description):
            out["aux"] = description
        else:
            serialized = _jax_serialization(cls, data)
            if serialized is not None:
                out["ser"] = serialized
    out["c"] = children
    return out


def key_form(data: Any) -> Any:
    """The identifying part of a :func:`to_json` description: auxiliary data replaced
    by its digest (computed for format-1 manifests, which stored no digest)."""
    if not isinstance(data, dict):
        raise CorruptArtifactError(f"malformed pytree node {str(data)[:60]!r}: expected an object")
    kind = data["t"]
    if kind in ("leaf", "none"):
        return {"t": kind}
    children = [key_form(c) for c in data["c"]]
    if kind in ("tuple", "list"):
        return {"t": kind, "c": children}
    if kind == "dict":
        return {"t": "dict", "k": [_key_description(k) for k in data["k"]], "c": children}
    if kind == "namedtuple":
        return {"t": kind, "type": str(data["type"]), "fields": [str(f) for f in data["fields"]], "c": children}
    if kind == "custom":
        return {"t": kind, "type": str(data["type"]), "digest": _node_digest(data), "c": children}
    raise CorruptArtifactError(f"unknown pytree node kind {kind!r} in manifest")


def _key_description(key: Any) -> Any:
    if isinstance(key, dict) and set(key) == {"tuple"}:  # format 1 wrote tuples so
        try:
            return encode(decode(key))
        except _NotDecodable:
            raise CorruptArtifactError(f"malformed dict key {str(key)[:60]!r}") from None
    return _strip_nested(key)


def _node_digest(data: Mapping[str, Any]) -> str:
    digest = data.get("digest")
    if digest is not None:
        if not isinstance(digest, str):
            raise CorruptArtifactError(f"malformed pytree node digest {str(digest)[:60]!r}")
        return digest
    try:  # format 1: the JSON auxiliary data is the whole identity
        value = decode(data["aux"])
    except _NotDecodable as exc:
        raise CorruptArtifactError(f"malformed auxiliary data of {data.get('type')!r}: {exc}") from None
    return describe_aux(value)[0]


def canonical(treedef: PyTreeDef) -> str:
    """A canonical string form (stable across processes; no memory addresses)."""
    return _canonical(key_form(to_json(treedef, aux=False)))


def structure_key(treedef: PyTreeDef) -> str:
    """What identifies ``treedef`` for matching: equal for equal structures in any
    process (``sha256:...``); the program fingerprint's ``in_tree`` / ``out_tree``."""
    return "sha256:" + hashlib.sha256(canonical(treedef).encode()).hexdigest()


def structure_key_of_json(data: Any) -> str:
    """:func:`structure_key` of a stored description; raises CorruptArtifactError."""
    try:
        text = _canonical(key_form(data))
    except CorruptArtifactError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
        raise CorruptArtifactError(f"malformed pytree structure in manifest: {exc!r}") from None
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


# ------------------------------------------------------------------ rebuilding


class Unresolved:
    """Stands for a recorded pytree node this process cannot rebuild (its class is not
    imported here, or its auxiliary data does not round-trip). Input structures use it
    for their leaf count and paths; an output that still holds one is refused."""

    __slots__ = ("node", "children")

    def __init__(self, node: tuple[str, str], children: tuple[Any, ...]) -> None:
        self.node = node
        self.children = children

    def __repr__(self) -> str:
        return f"Unresolved({self.node[0]}, {len(self.children)} children)"


jax.tree_util.register_pytree_with_keys(
    Unresolved,
    lambda u: ([(jax.tree_util.FlattenedIndexKey(i), c) for i, c in enumerate(u.children)], u.node),
    lambda node, children: Unresolved(node, tuple(children)),
    flatten_func=lambda u: (u.children, u.node),
)


NodeTable = Mapping[str, tuple[type, Any]]


def _custom_id(path: str, digest: str) -> str:
    return f"custom {path} {digest}"


def _namedtuple_id(path: str, fields: list[str]) -> str:
    return f"namedtuple {path} {','.join(fields)}"


def node_table(treedef: PyTreeDef) -> dict[str, tuple[type, Any]]:
    """The custom nodes and namedtuples of a live structure, by what identifies them:
    the ``nodes=`` of :func:`from_json` (outputs rebuilt from the caller's inputs)."""
    table: dict[str, tuple[type, Any]] = {}
    stack = [treedef]
    while stack:
        tree = stack.pop()
        node = tree.node_data()
        if node is None:
            continue
        cls, data = node
        stack.extend(tree.children())
        if cls in (tuple, list, dict, type(None), Unresolved):
            continue
        if _is_namedtuple_class(cls):
            table.setdefault(_namedtuple_id(_path(cls), list(cls._fields)), (cls, None))
            continue
        digest, _ = describe_aux(data)
        table.setdefault(_custom_id(_path(cls), digest), (cls, data))
    return table


def _namedtuple_class(path: str, fields: list[str]) -> type:
    try:
        cls = _resolve(path)
    except _NotDecodable:
        cls = None
    if cls is not None and _is_namedtuple_class(cls) and list(cls._fields) == fields:
        return cls
    key = (path, tuple(fields))
    if key not in _NAMEDTUPLE_CACHE:
        name = path.rpartition(":")[2].rpartition(".")[2]
        log.info("namedtuple %s is not importable here; rebuilding it from its fields", path)
        _NAMEDTUPLE_CACHE[key] = collections.namedtuple(name, fields)  # type: ignore[misc]
    return _NAMEDTUPLE_CACHE[key]


def from_json(data: Any, *, nodes: NodeTable | None = None, standins: bool = False) -> PyTreeDef:
    """Rebuilds a ``PyTreeDef`` from :func:`to_json` output (see the module docstring).

    A node that cannot be rebuilt is an :class:`Unresolved` stand-in with
    ``standins=True``, else a :class:`PytreeNodeError` naming it.
    """
    try:
        return _from_json(data, nodes or {}, standins)
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError, IndexError) as exc:
        raise CorruptArtifactError(f"malformed pytree structure in manifest: {exc!r}") from None


def _from_json(data: Any, nodes: NodeTable, standins: bool) -> PyTreeDef:
    if not isinstance(data, dict):
        raise CorruptArtifactError(f"malformed pytree node {str(data)[:60]!r}: expected an object")
    kind = data["t"]
    if kind == "leaf":
        return jax.tree_util.tree_structure(0)
    if kind == "none":
        return jax.tree_util.tree_structure(None)
    if not isinstance(data["c"], list):
        raise CorruptArtifactError("malformed pytree node: children are not a list")
    children = [_from_json(c, nodes, standins) for c in data["c"]]
    if kind == "tuple":
        node: tuple[type, Any] = (tuple, None)
    elif kind == "list":
        node = (list, None)
    elif kind == "dict":
        try:
            keys = [_hashable(decode(k)) for k in data["k"]]
        except _NotImported as exc:
            module = str(exc).partition(":")[0]
            raise PytreeNodeError(
                f"a pytree dict key is {exc}, and its module {module!r} is not imported in "
                "this process (the loader imports only JAX and allow-listed libraries, never "
                "model code); import it before loading",
                str(exc),
            ) from None
        except _NotDecodable as exc:
            raise CorruptArtifactError(f"malformed pytree dict key: {exc}") from None
        if len(keys) != len(children):
            raise CorruptArtifactError("malformed pytree dict: keys and children differ in count")
        node = (dict, keys)
    elif kind == "namedtuple":
        path = str(data["type"])
        fields = [str(f) for f in data["fields"]]
        if len(fields) != len(children):
            raise CorruptArtifactError("malformed pytree namedtuple: fields and children differ in count")
        found = nodes.get(_namedtuple_id(path, fields))
        node = (found[0] if found is not None else _namedtuple_class(path, fields), None)
    elif kind == "custom":
        rebuilt = _custom_node(data, nodes)
        if rebuilt is None:
            path = str(data["type"])
            if not standins:
                raise _unrebuildable(path, data)
            return PyTreeDef.from_node_data_and_children(
                default_registry, (Unresolved, (path, _node_digest(data))), children
            )
        node = rebuilt
    else:
        raise CorruptArtifactError(f"unknown pytree node kind {kind!r} in manifest")
    try:
        return PyTreeDef.from_node_data_and_children(default_registry, node, children)
    except Exception as exc:  # noqa: BLE001 - jaxlib raises ValueError/TypeError/RuntimeError
        raise CorruptArtifactError(f"cannot rebuild pytree node {data.get('type', kind)}: {exc}") from None


def _custom_node(data: Mapping[str, Any], nodes: NodeTable) -> tuple[type, Any] | None:
    path = str(data["type"])
    if nodes:
        found = nodes.get(_custom_id(path, _node_digest(data)))
        if found is not None:
            return found
    try:
        cls = _resolve(path)
    except _NotDecodable:
        cls = None
    if isinstance(cls, type) and "aux" in data:
        try:
            return cls, decode(data["aux"])
        except Exception:  # noqa: BLE001 - _NotDecodable, or a constructor refusing
            pass
    if "ser" in data:
        found = _jax_deserialization(data["ser"])
        if found is not None and _path(found[0]) == path:
            return found
    return None


def _unrebuildable(path: str, data: Mapping[str, Any]) -> PytreeNodeError:
    module = path.partition(":")[0]
    try:
        found = isinstance(_resolve(path), type)
    except _NotDecodable:
        found = False
    if not found:
        where = (
            f"its module {module!r} is not imported (the loader imports only the modules "
            f"of known libraries, never one a manifest names): `import {module}` before "
            "loading" if module not in sys.modules
            else "it is not a module-level class of an imported module"
        )
        why = f"pytree node class {path} cannot be imported in this process ({where})"
    elif "aux" in data or "ser" in data:
        why = f"pytree node {path} cannot be rebuilt here: its stored auxiliary data does not decode"
    else:
        why = (
            f"pytree node {path} cannot be rebuilt here: its auxiliary data was not stored "
            "(it holds values that do not round-trip, such as closures or objects)"
        )
    return PytreeNodeError(
        f"{why}; import the module that registers it before loading, pass an input of "
        "that type (an output node equal to an input node is rebuilt from it), or ask "
        "for flat outputs (aot.rehydrate.load_executable(..., flat_outputs=True))",
        path,
    )


def unresolved(treedef: PyTreeDef) -> list[str]:
    """Type paths of the :class:`Unresolved` stand-ins in ``treedef``."""
    found: list[str] = []
    stack = [treedef]
    while stack:
        tree = stack.pop()
        node = tree.node_data()
        if node is None:
            continue
        if node[0] is Unresolved:
            found.append(node[1][0])
        stack.extend(tree.children())
    return found


def resolve(data: Any, nodes: NodeTable) -> PyTreeDef:
    """The output structure ``data`` rebuilt with the caller's ``nodes`` first; raises
    a :class:`PytreeNodeError` naming a node that still cannot be rebuilt.

    An output node of a known library's class (an Equinox module returned but not
    passed in) imports that library's module on demand (:func:`aot.libraries.import_library`)."""
    tried: set[str] = set()
    while True:
        try:
            return from_json(data, nodes=nodes, standins=False)
        except PytreeNodeError as exc:
            module = exc.node.partition(":")[0]
            if module in tried or module in sys.modules or import_library(module) is None:
                raise
            tried.add(module)

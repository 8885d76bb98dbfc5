"""Input signatures with pytree paths: ``params['Dense_0']['kernel']: f32[128,256]``.

The index stores a flat signature (``"f32[512], f32[784,512], ..."``); every manifest
also records each flat input's path (``args[].path``). :class:`Signature` pairs the two
so that ``aot ls``, ``show``, ``why``, ``verify`` and the loader's errors can name the
argument a shape belongs to, at any width:

* :meth:`Signature.lines`: one ``path: aval`` per leaf (``aot show``);
* :meth:`Signature.compact`: a tree, ``params: [{b: f32[512], w: f32[784,512]}, ...],
  x: f32[8,784]``, whose inner levels fold into ``[6 arrays]`` until it fits a width
  (``aot ls``);
* :func:`leaf_differences`: the leaves that differ between two signatures, by path
  (``aot why``, like the loader's "x: stored f32[1,784], got f32[4,784]").

No JAX import at module level: the paths are strings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from aot.dtype_names import short_dtype

__all__ = [
    "ArgLeaf",
    "LeafDifference",
    "Signature",
    "describe_call",
    "leaf_differences",
    "path_head",
    "shorten_middle",
    "shorten_tokens",
    "short_dtype",
]

# One step of a path as jax.tree_util.keystr renders it: ['key'], ["key"], [0], .attr
_STEP = re.compile(
    r"""\[\s*'((?:[^'\\]|\\.)*)'\s*\]|\[\s*"((?:[^"\\]|\\.)*)"\s*\]|\[([^\]]*)\]|\.([A-Za-z_]\w*)"""
)
_HEAD = re.compile(r"^(args\[\d+\]|[^\[.]+)")
# A comma between the avals of a flat signature (not one inside a shape's brackets).
_FLAT_SPLIT = re.compile(r",\s*(?![^\[]*\])")


def shorten_middle(text: str, width: int) -> str:
    """Keeps both ends (a signature's last argument is usually the batch)."""
    if len(text) <= width:
        return text
    if width < 9:
        return text[: max(width - 3, 0)] + "..."[: max(width, 0)]
    head = (width - 5) // 2
    return f"{text[:head]} ... {text[-(width - 5 - head):]}"


def shorten_tokens(parts: Sequence[str], width: int) -> str:
    """``parts`` joined by ``", "``, middle parts replaced by ``...`` until it fits
    ``width``: never cut inside a part (the first and the last are always kept)."""
    text = ", ".join(parts)
    if len(text) <= width or len(parts) < 3:
        return text
    for keep in range(len(parts) - 1, 1, -1):
        head = keep // 2  # the tail keeps the extra part (the batch is usually last)
        text = ", ".join([*parts[:head], "...", *parts[len(parts) - (keep - head):]])
        if len(text) <= width:
            return text
    return text


@dataclass(frozen=True, slots=True)
class ArgLeaf:
    """One flat input: where it sits in the arguments, and its aval (``f32[8,784]``)."""

    path: str
    aval: str

    def describe(self) -> str:
        return f"{self.path}: {self.aval}" if self.path else self.aval

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "aval": self.aval}


def _steps(path: str) -> tuple[str, list[tuple[str, str]]]:
    """``"params[0]['b']"`` -> ``("params", [("index", "0"), ("key", "b")])``."""
    match = _HEAD.match(path)
    if match is None:
        return path, []
    head, rest, steps = match.group(1), path[match.end():], []
    position = 0
    for step in _STEP.finditer(rest):
        if step.start() != position:  # not a keystr path: keep it whole
            return path, []
        position = step.end()
        quoted = step.group(1) if step.group(1) is not None else step.group(2)
        if quoted is not None:
            steps.append(("key", quoted))
        elif step.group(3) is not None:
            raw = step.group(3).strip()
            steps.append(("index" if raw.isdigit() else "key", raw))
        else:
            steps.append(("attr", step.group(4)))
    if position != len(rest):
        return path, []
    return head, steps


def path_head(path: str) -> str:
    """The argument a leaf path starts with: ``"params[0]['b']"`` -> ``"params"``."""
    return _steps(path)[0]


class _Node:
    __slots__ = ("kind", "children", "aval")

    def __init__(self) -> None:
        self.kind: str | None = None  # "key", "index" or "attr" for inner nodes
        self.children: dict[str, _Node] = {}
        self.aval: str | None = None

    def count(self) -> int:
        if self.aval is not None:
            return 1
        return sum(child.count() for child in self.children.values())

    def render(self, depth: int, limit: int) -> str:
        if self.aval is not None:
            return self.aval
        n = self.count()
        opening, closing = {"index": ("[", "]"), "attr": ("(", ")")}.get(self.kind or "", ("{", "}"))
        if depth >= limit:
            return f"{opening}{n} array{'s' if n != 1 else ''}{closing}"
        if self.kind == "index":
            inner = ", ".join(c.render(depth + 1, limit) for c in self.children.values())
        elif self.kind == "attr":
            inner = ", ".join(f"{k}={c.render(depth + 1, limit)}" for k, c in self.children.items())
        else:
            inner = ", ".join(f"{k}: {c.render(depth + 1, limit)}" for k, c in self.children.items())
        return f"{opening}{inner}{closing}"

    def depth(self) -> int:
        if self.aval is not None or not self.children:
            return 0
        return 1 + max(child.depth() for child in self.children.values())


@dataclass(frozen=True, slots=True)
class Signature:
    """The flat inputs of a program, each with its path (``()`` for no arguments), and
    its static arguments' values (``("act='relu'",)``), shown after the inputs."""

    leaves: tuple[ArgLeaf, ...]
    statics: tuple[str, ...] = ()

    # ---------------------------------------------------------------- building

    @classmethod
    def from_manifest_args(
        cls, args: Iterable[Mapping[str, Any]], statics: Iterable[Any] = (),
    ) -> Signature:
        """From a manifest's ``args`` (``path``, ``shape``, ``dtype``, optional
        ``weak_type`` per leaf): ``~f32[]``, ``key<fry>[2]``, ``i4[8]``, ``f32[b,784]``."""
        leaves = []
        for arg in args:
            # A symbolic dimension is stored as its expression ("b", "2*b").
            dims = ",".join(str(d) if isinstance(d, str) else str(int(d)) for d in arg["shape"])
            weak = "~" if arg.get("weak_type") is True else ""
            leaves.append(ArgLeaf(
                str(arg.get("path", "")), f"{weak}{short_dtype(str(arg['dtype']))}[{dims}]"
            ))
        return cls(tuple(leaves), tuple(s.describe() for s in statics))

    @classmethod
    def from_manifest_json(cls, text: str, fallback: str = "") -> Signature:
        """From an index row's manifest JSON; a row whose manifest cannot be read falls
        back to its flat signature, without paths."""
        try:
            from aot.statics import statics_from_json

            data = json.loads(text)
            return cls.from_manifest_args(data["args"], statics_from_json(data.get("statics")))
        except Exception:  # noqa: BLE001 - verify reports unreadable manifests
            return cls.flat(fallback)

    @classmethod
    def flat(cls, signature: str) -> Signature:
        """A flat ``"f32[8], f32[8]"`` signature, without paths."""
        return cls(_flat_leaves(signature))

    @classmethod
    def with_paths(cls, signature: str, paths: Sequence[str]) -> Signature:
        """A flat signature given its leaves' paths (a loaded program's): by argument
        name when the counts agree, else flat."""
        flat = cls.flat(signature)
        if len(paths) != len(flat.leaves) or not any(paths):
            return flat
        return cls(tuple(ArgLeaf(path, leaf.aval) for path, leaf in zip(paths, flat.leaves)))

    @classmethod
    def from_specs(
        cls, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
        arg_names: Sequence[str] = (),
    ) -> Signature:
        """From pytrees of ``jax.ShapeDtypeStruct`` (or arrays), named like the loader
        names them: ``arg_names[i]`` (else ``args[i]``) for positional arguments,
        keyword arguments in sorted-name order after them."""
        import jax

        from aot.specs import format_aval

        def leaves_of(name: str, tree: Any) -> list[ArgLeaf]:
            out = []
            for key_path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
                shape, dtype, weak = _shape_dtype(leaf)
                out.append(ArgLeaf(name + jax.tree_util.keystr(tuple(key_path)), format_aval(shape, dtype, weak)))
            return out

        leaves: list[ArgLeaf] = []
        for i, tree in enumerate(args):
            leaves += leaves_of(arg_names[i] if i < len(arg_names) else f"args[{i}]", tree)
        for name in sorted(kwargs or {}):
            leaves += leaves_of(name, (kwargs or {})[name])
        return cls(tuple(leaves))

    # ---------------------------------------------------------------- rendering

    @property
    def flat_text(self) -> str:
        """``"f32[512], f32[784,512], ..., act='relu'"``: the index's signature column."""
        return ", ".join([*(leaf.aval for leaf in self.leaves), *self.statics])

    @property
    def has_paths(self) -> bool:
        return any(leaf.path for leaf in self.leaves)

    def lines(self) -> list[str]:
        """One ``path: aval`` per leaf, then one ``name=value`` per static."""
        return [leaf.describe() for leaf in self.leaves] + list(self.statics)

    def _tree(self) -> list[tuple[str, _Node]]:
        roots: dict[str, _Node] = {}
        for leaf in self.leaves:
            head, steps = _steps(leaf.path)
            node = roots.setdefault(head, _Node())
            for kind, step in steps:
                node.kind = node.kind or kind
                node = node.children.setdefault(step, _Node())
            node.aval = leaf.aval
        return list(roots.items())

    def compact(self, width: int | None = None) -> str:
        """A tree per argument; inner levels fold into ``[N arrays]`` until it fits
        ``width`` (then both ends are kept). Without paths: the flat signature."""
        if not self.has_paths:
            flat = [*(leaf.aval for leaf in self.leaves), *self.statics]
            return ", ".join(flat) if width is None else shorten_tokens(flat, width)
        roots = self._tree()
        deepest = max((node.depth() for _, node in roots), default=0)
        parts: list[str] = []
        for limit in range(deepest, -1, -1):
            parts = [f"{head}: {node.render(0, limit)}" for head, node in roots] + list(self.statics)
            text = ", ".join(parts)
            if width is None or len(text) <= width:
                return text
        assert width is not None  # the loop above returned otherwise (limit 0 always renders)
        # Still too wide: drop leading arguments (the last one is usually the batch).
        for start in range(1, len(parts)):
            text = "..., " + ", ".join(parts[start:])
            if len(text) <= width:
                return text
        return shorten_middle(", ".join(parts), width)

    def to_list(self) -> list[dict[str, str]]:
        return [leaf.to_dict() for leaf in self.leaves]


@lru_cache(maxsize=4096)
def _flat_leaves(signature: str) -> tuple[ArgLeaf, ...]:
    """The leaves of a flat signature (cached: a report shows the same few signatures
    on thousands of rows; the leaves are immutable)."""
    parts = [p.strip() for p in _FLAT_SPLIT.split(signature) if p.strip()]
    return tuple(ArgLeaf("", p) for p in parts)




def _shape_dtype(leaf: Any) -> tuple[tuple[Any, ...], Any, bool]:
    """Shape, dtype and weak type of a spec (``ShapeDtypeStruct``) or an argument, as
    ``jax.jit`` sees it (x64 off: a NumPy float64 array is f32; a Python float is
    ``~f32[]``)."""
    import jax

    if isinstance(leaf, jax.ShapeDtypeStruct):
        return tuple(leaf.shape), leaf.dtype, bool(leaf.weak_type)
    from aot.specs import leaf_aval

    try:
        return leaf_aval(leaf)
    except TypeError:  # not a JAX type: described by what it claims
        return tuple(getattr(leaf, "shape", ())), getattr(leaf, "dtype", None), False


# ---------------------------------------------------------------- differences


@dataclass(frozen=True, slots=True)
class LeafDifference:
    """A leaf that differs between a stored signature and a requested one."""

    path: str
    stored: str | None  # None: the request has a leaf the stored signature lacks
    requested: str | None  # None: the request lacks a leaf the stored one has

    def describe(self) -> str:
        where = self.path or "an argument"
        if self.requested is None:
            return f"{where}: stored {self.stored}, missing from the request"
        if self.stored is None:
            return f"{where}: not in the stored signature (got {self.requested})"
        return f"{where}: stored {self.stored}, got {self.requested}"

    def to_dict(self) -> dict[str, str | None]:
        return {"path": self.path, "stored": self.stored, "requested": self.requested}

    def distance(self) -> int:
        """How far apart the two shapes are (a batch of 8 is nearer 4 than 1)."""
        if self.stored is None or self.requested is None:
            return 1 << 40
        a, b = _dims(self.stored), _dims(self.requested)
        if a is None or b is None or len(a[1]) != len(b[1]):
            return 1 << 40
        return sum(abs(x - y) for x, y in zip(a[1], b[1])) + (0 if a[0] == b[0] else 1 << 30)


_AVAL = re.compile(r"^\s*(~?[\w<>]+)\[([\d,\s]*)\]\s*$")


def _dims(aval: str) -> tuple[str, tuple[int, ...]] | None:
    match = _AVAL.match(aval)
    if match is None:
        return None
    dims = tuple(int(d) for d in match.group(2).split(",") if d.strip())
    return match.group(1), dims


def leaf_differences(stored: Signature, requested: Signature) -> tuple[LeafDifference, ...]:
    """The leaves that differ, by path when both sides have the same paths (or the
    request has none), else matched by path: changed, missing and unexpected leaves."""
    s, r = stored.leaves, requested.leaves
    same_paths = [a.path for a in s] == [b.path for b in r]
    if len(s) == len(r) and (same_paths or not requested.has_paths):
        return tuple(
            LeafDifference(a.path, a.aval, b.aval) for a, b in zip(s, r) if a.aval != b.aval
        )
    mine = {leaf.path: leaf.aval for leaf in s}
    theirs = {leaf.path: leaf.aval for leaf in r}
    out = [
        LeafDifference(leaf.path, leaf.aval, theirs.get(leaf.path))
        for leaf in s if theirs.get(leaf.path) != leaf.aval
    ]
    out += [LeafDifference(leaf.path, None, leaf.aval) for leaf in r if leaf.path not in mine]
    return tuple(out)


# ---------------------------------------------------------------- a call's arguments


def describe_call(args: Sequence[Any], kwargs: Mapping[str, Any], arg_names: Sequence[str] = ()) -> str:
    """The arguments of a call in one line, per top-level argument: arrays as avals,
    pytrees of arrays as a compact tree, and a container of Python values (a list of
    1000 floats where an array belongs) as ``a list of 1000 floats``, not 1000 leaves."""
    parts = []
    for i, value in enumerate(args):
        name = arg_names[i] if i < len(arg_names) else f"args[{i}]"
        parts.append(f"{name}: {_describe_value(value)}")
    for name in sorted(kwargs):
        parts.append(f"{name}: {_describe_value(kwargs[name])}")
    return ", ".join(parts)


_MAX_TREE_TEXT = 160


def _describe_value(value: Any) -> str:
    import jax

    from aot.specs import format_aval

    if hasattr(value, "shape") and hasattr(value, "dtype") and jax.tree_util.treedef_is_leaf(
        jax.tree_util.tree_structure(value)
    ):
        return format_aval(*_shape_dtype(value))
    if isinstance(value, (bool, int, float, complex)):
        return f"Python {type(value).__name__} {value!r}"
    leaves = jax.tree_util.tree_leaves(value)
    if not leaves:
        return _container(value, 0, "")
    python = [leaf for leaf in leaves if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype"))]
    if python:
        kinds = sorted({type(leaf).__name__ for leaf in python})
        what = f"Python {'/'.join(kinds)}s" if len(python) == len(leaves) else "leaves"
        return _container(value, len(leaves), what)
    text = Signature.from_specs([value], arg_names=["_"]).compact(_MAX_TREE_TEXT)
    return text[len("_: "):]


def _container(value: Any, n: int, what: str) -> str:
    if value is None:
        return "None"
    kind = type(value).__name__
    if not what:
        return f"an empty {kind}" if hasattr(value, "__len__") else f"{_article(kind)} {kind}"
    if n == 1 and what.endswith("s"):
        what = what[:-1]
    return f"{_article(kind)} {kind} of {n} {what}"


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"

"""MeshExecutable / PmapExecutable: compiled programs that check their inputs first."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.tree_util import PyTreeDef

from aot import treedef as treedefs
from aot.errors import AvalMismatchError
from aot.fingerprint import Fingerprint, combined_key
from aot.specs import format_aval, leaf_signature

log = logging.getLogger(__name__)

_PY_SCALARS = frozenset({bool, int, float, complex})


@dataclass(frozen=True, slots=True)
class ArgAval:
    """One flat input of a program: where it sits in the arguments and what it must be."""

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    donated: bool
    kept: bool

    def describe(self) -> str:
        return format_aval(self.shape, self.dtype)


@dataclass(frozen=True, slots=True)
class ExecutableInfo:
    """Everything about a compiled program except the compiled code itself."""

    name: str
    kind: str
    in_tree: PyTreeDef
    out_tree: PyTreeDef
    args: tuple[ArgAval, ...]
    out_avals: tuple[jax.ShapeDtypeStruct, ...]
    in_shardings: tuple[Any, ...]
    out_shardings: tuple[Any, ...]
    device_ids: tuple[int, ...]
    program_fingerprint: Fingerprint
    environment_fingerprint: Fingerprint
    compile_seconds: float = 0.0
    # Names of the positional (non-static) parameters, for error messages; empty
    # when unknown (they are then recovered from the leaf paths where possible).
    arg_names: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return combined_key(self.program_fingerprint, self.environment_fingerprint)

    @property
    def signature(self) -> str:
        return ", ".join(a.describe() for a in self.args)


def arg_paths(in_tree: PyTreeDef, arg_names: Sequence[str] = ()) -> list[str]:
    """Readable paths for each flat input: ``params['layers'][3]['w1']``."""
    placeholder = jax.tree_util.tree_unflatten(in_tree, range(in_tree.num_leaves))
    paths: list[str] = []
    for key_path, _ in jax.tree_util.tree_flatten_with_path(placeholder)[0]:
        paths.append(_render_path(key_path, arg_names))
    return paths


def _render_path(key_path: Sequence[Any], arg_names: Sequence[str]) -> str:
    # key_path starts with (args|kwargs index) then the argument position or name.
    head, rest = key_path[:2], key_path[2:]
    group = getattr(head[0], "idx", 0)
    if group == 0:
        position = getattr(head[1], "idx", 0)
        name = arg_names[position] if position < len(arg_names) else f"args[{position}]"
    else:
        name = str(getattr(head[1], "key", head[1]))
    return name + jax.tree_util.keystr(tuple(rest))


class MeshExecutable:
    """A compiled jit program (single device or mesh-sharded). Call it like the function."""

    kind = "jit"

    def __init__(self, compiled: jax.stages.Compiled, info: ExecutableInfo) -> None:
        self._compiled = compiled
        self.info = info
        self._expected = tuple((a.shape, a.dtype) for a in info.args)
        # The computation this was compiled from, when compiled in this process (it can
        # export the portable HLO); None for executables loaded from an artifact.
        self.computation: Any = None
        self._fast_call: Any = None

    # -- identity
    @property
    def name(self) -> str:
        return self.info.name

    @property
    def key(self) -> str:
        return self.info.key

    @property
    def fingerprint(self) -> str:
        return self.info.key

    @property
    def program_fingerprint(self) -> Fingerprint:
        return self.info.program_fingerprint

    @property
    def environment_fingerprint(self) -> Fingerprint:
        return self.info.environment_fingerprint

    @property
    def in_avals(self) -> tuple[jax.ShapeDtypeStruct, ...]:
        return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in self.info.args)

    @property
    def out_avals(self) -> tuple[jax.ShapeDtypeStruct, ...]:
        return self.info.out_avals

    @property
    def signature(self) -> str:
        return self.info.signature

    @property
    def compiled(self) -> jax.stages.Compiled:
        """The underlying ``jax.stages.Compiled`` (no input checks of ours)."""
        return self._compiled

    # -- calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        if treedef != self.info.in_tree or not self._leaves_match(leaves):
            raise self.mismatch_error(args, kwargs)
        return self.call_checked(args, kwargs)

    def call_checked(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Runs on inputs whose structure, shapes and dtypes were already checked."""
        try:
            if self._fast_call is not None:
                return self._fast_call(*args, **kwargs)
            out = self._compiled(*args, **kwargs)
            # The first call built JAX's C++ dispatch function; call it directly from
            # now on (one Python frame less per call).
            self._fast_call = getattr(self._compiled, "_call", None)
            return out
        except (TypeError, ValueError) as exc:
            # Avals matched, so what JAX refuses is placement (committed arrays on
            # other devices or with another sharding).
            raise AvalMismatchError(
                f"{self.name}: inputs match the compiled shapes and dtypes but JAX refused "
                f"them: {exc}. Put the inputs on the compiled shardings "
                "(jax.device_put(x, sharding)) or pass uncommitted arrays."
            ) from exc

    def matches(self, leaves: Sequence[Any]) -> bool:
        return self._leaves_match(leaves)

    def _leaves_match(self, leaves: Sequence[Any]) -> bool:
        return all(
            _leaf_matches(leaf, shape, dtype) for leaf, (shape, dtype) in zip(leaves, self._expected)
        )

    def mismatch_error(self, args: Sequence[Any], kwargs: dict[str, Any]) -> AvalMismatchError:
        return input_mismatch_error(self.info, args, kwargs)

    # -- analysis
    def cost_analysis(self) -> Any:
        return self._compiled.cost_analysis()

    def memory_analysis(self) -> Any:
        return self._compiled.memory_analysis()

    def as_text(self) -> str | None:
        return self._compiled.as_text()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, ({self.signature}), key={self.key[:12]})"


class PmapExecutable(MeshExecutable):
    """A compiled pmap program (``jax.jit(jax.pmap(f))``), one shard per device."""

    kind = "pmap"


def executable_class(kind: str) -> type[MeshExecutable]:
    return PmapExecutable if kind == "pmap" else MeshExecutable


def _leaf_matches(leaf: Any, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """The one rule for an input leaf: Python scalars of the right kind, else shape+dtype."""
    if type(leaf) in _PY_SCALARS:
        # As JAX: a Python scalar is a weakly typed value of the default dtype of its kind.
        return shape == () and np.dtype(jax.dtypes.canonicalize_dtype(type(leaf))) == dtype
    try:
        return tuple(leaf.shape) == tuple(shape) and leaf.dtype == dtype
    except (AttributeError, TypeError):
        return False


def input_mismatch_error(
    info: ExecutableInfo, args: Sequence[Any], kwargs: dict[str, Any]
) -> AvalMismatchError:
    """Lists every mismatch between the inputs and the compiled avals, by path.

    Structure is compared argument by argument and node by node, so a wrong pytree is
    reported where it differs (``batch: unexpected keys ['y']``), and the leaves of the
    parts whose structure matches are still compared (``params['w']: expected f32[4],
    got f32[5]``).
    """
    problems = _input_problems(info, tuple(args), dict(kwargs))
    message = (
        f"{info.name}: inputs do not match the compiled signature ({info.signature}):\n  "
        + "\n  ".join(problems)
        + "\nPass inputs of the compiled shapes and dtypes, or compile this signature too."
    )
    return AvalMismatchError(message, tuple(problems))


def _input_problems(
    info: ExecutableInfo, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[str]:
    problems: list[str] = []
    expected_args, expected_kwargs = info.in_tree.children()
    arg_trees = expected_args.children()
    names = _positional_names(info)
    offsets = _offsets([t.num_leaves for t in arg_trees])
    if len(args) != len(arg_trees):
        listed = f" ({', '.join(names)})" if names else ""
        problems.append(
            f"expected {len(arg_trees)} positional arguments{listed}, got {len(args)}"
        )
    for i, (tree, value) in enumerate(zip(arg_trees, args)):
        problems += _compare(tree, value, names[i], info.args[offsets[i] :])

    kw_node = expected_kwargs.node_data()
    kw_keys = list(kw_node[1]) if kw_node is not None and kw_node[1] is not None else []
    kw_trees = expected_kwargs.children()
    kw_offsets = _offsets([t.num_leaves for t in kw_trees], start=expected_args.num_leaves)
    for key, tree, offset in zip(kw_keys, kw_trees, kw_offsets):
        if key not in kwargs:
            problems.append(f"missing keyword argument {key!r} (expected {_expected(tree, info.args[offset:])})")
        else:
            problems += _compare(tree, kwargs[key], str(key), info.args[offset:])
    for key in kwargs:
        if key not in kw_keys:
            problems.append(f"unexpected keyword argument {key!r}")
    if not problems:  # should not happen; never raise an empty list
        _, treedef = jax.tree_util.tree_flatten((args, kwargs))
        problems.append(
            f"expected pytree structure {_structure(info.in_tree)}, got {_structure(treedef)}"
        )
    return problems


def _offsets(sizes: Sequence[int], start: int = 0) -> list[int]:
    out = []
    for size in sizes:
        out.append(start)
        start += size
    return out


def _positional_names(info: ExecutableInfo) -> list[str]:
    """The names of the positional arguments, recovered from the recorded leaf paths."""
    names = []
    offset = 0
    for i, tree in enumerate(info.in_tree.children()[0].children()):
        name = info.arg_names[i] if i < len(info.arg_names) else f"args[{i}]"
        if tree.num_leaves and i >= len(info.arg_names):
            placeholder = tree.unflatten(range(tree.num_leaves))
            first = jax.tree_util.tree_flatten_with_path(placeholder)[0][0][0]
            inner = jax.tree_util.keystr(tuple(first))
            path = info.args[offset].path
            if path.endswith(inner) and len(path) > len(inner):
                name = path[: len(path) - len(inner)]
        names.append(name)
        offset += tree.num_leaves
    return names


def _compare(expected: PyTreeDef, value: Any, path: str, args: Sequence[ArgAval]) -> list[str]:
    """Mismatches between one expected subtree (whose leaves start at ``args``) and a value."""
    leaves, got = jax.tree_util.tree_flatten(value)
    if got == expected:
        return [
            f"{arg.path}: expected {arg.describe()}, got {_describe_leaf(leaf)}"
            for arg, leaf in zip(args, leaves)
            if not _leaf_matches(leaf, arg.shape, arg.dtype)
        ]
    node = expected.node_data()
    got_node = got.node_data()
    mismatch = [f"{path}: expected {_expected(expected, args)}, got {_got(value, got)}"]
    if node is None or got_node is None or node[0] is not got_node[0]:
        return mismatch
    cls, aux = node
    children = expected.children()
    offsets = _offsets([c.num_leaves for c in children])
    if cls is dict:
        got_keys = list(value)
        keys = list(aux)
        problems = []
        missing = [k for k in keys if k not in value]
        extra = [k for k in got_keys if k not in keys]
        if missing:
            problems.append(f"{path}: missing keys {sorted(missing, key=repr)}")
        if extra:
            problems.append(f"{path}: unexpected keys {sorted(extra, key=repr)}")
        for key, child, offset in zip(keys, children, offsets):
            if key in value:
                problems += _compare(child, value[key], f"{path}[{key!r}]", args[offset:])
        return problems
    if cls in (list, tuple) or _is_namedtuple(cls):
        if len(value) != len(children):
            return mismatch
        fields = getattr(cls, "_fields", None)
        problems = []
        for i, (child, offset) in enumerate(zip(children, offsets)):
            sub = f"{path}.{fields[i]}" if fields else f"{path}[{i}]"
            problems += _compare(child, value[i], sub, args[offset:])
        return problems
    return mismatch


def _is_namedtuple(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def _expected(tree: PyTreeDef, args: Sequence[ArgAval]) -> str:
    if tree.node_data() is None:  # a leaf
        return args[0].describe() if args else "an array"
    return _describe_node(tree)


def _got(value: Any, tree: PyTreeDef) -> str:
    if tree.node_data() is None:
        return _describe_leaf(value)
    return _describe_node(tree)


def _describe_node(tree: PyTreeDef) -> str:
    cls, aux = tree.node_data()
    n = len(tree.children())
    if cls is type(None):
        return "None"
    if cls is dict:
        return f"a dict with keys {sorted(aux, key=repr)}"
    if cls is list or cls is tuple:
        return f"a {cls.__name__} of {n} item{'s' if n != 1 else ''}"
    if _is_namedtuple(cls):
        return f"{cls.__name__}({', '.join(cls._fields)})"
    return f"a {cls.__qualname__} node"


def _describe_leaf(leaf: Any) -> str:
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return format_aval(leaf.shape, leaf.dtype)
    if type(leaf) in _PY_SCALARS:
        return f"{leaf_signature([leaf])} (Python {type(leaf).__name__} {leaf!r})"
    return f"{type(leaf).__name__} {leaf!r}"[:80]


def _structure(treedef: PyTreeDef) -> str:
    text = str(treedef)
    return text if len(text) < 300 else treedefs.canonical(treedef)[:300] + "..."

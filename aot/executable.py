"""MeshExecutable / PmapExecutable: compiled programs that check their inputs first."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from aot import treedef as treedefs
from aot.errors import AvalMismatchError, DeviceTargetError
from aot.fingerprint import Fingerprint, combined_key
from aot.jaxcompat.dispatch import ARRAY_TYPE, dispatch_function, first_call, flat_call
from aot.specs import format_aval, leaf_signature

log = logging.getLogger(__name__)

_PY_SCALARS = frozenset({bool, int, float, complex})
_flatten = jax.tree_util.tree_flatten
# Caller structures and input keys remembered per executable: enough for every
# structure a service really passes, bounded against a caller making new ones forever.
FAST_CACHE_LIMIT = 4096


# The concrete type of jax.Array: leaves of this type are keyed by their avals.
JAX_ARRAY = ARRAY_TYPE


def raw_leaf_key(leaf: Any) -> Any:
    """What the per-call cache keys one leaf by when :func:`call_key` cannot do it
    in one tuple build: its aval, else type, shape, dtype and weak type, else its type
    (a Python scalar's aval depends on its type alone)."""
    aval = getattr(leaf, "aval", None)
    if aval is not None:
        return aval
    try:
        return (type(leaf), leaf.shape, leaf.dtype, getattr(leaf, "weak_type", None))
    except AttributeError:
        return (type(leaf),)


def call_key(leaves: Sequence[Any]) -> tuple[Any, ...]:
    """The per-call cache key of flat inputs (with the caller's treedef): the avals of
    JAX arrays (shape, dtype, weak type, explicit sharding) in one tuple build; type,
    shape, dtype and weak type of NumPy arrays in another; a call per leaf only when
    Python scalars are among them. The call paths inline the first case."""
    if not leaves or type(leaves[0]) is JAX_ARRAY:
        try:
            return tuple([leaf.aval for leaf in leaves])
        except AttributeError:
            pass
    try:
        return tuple([(type(x), x.shape, x.dtype, getattr(x, "weak_type", None)) for x in leaves])
    except AttributeError:
        return tuple(map(raw_leaf_key, leaves))


@dataclass(frozen=True, slots=True)
class ArgAval:
    """One flat input of a program: where it sits in the arguments and what it must be."""

    path: str
    shape: tuple[int, ...]
    dtype: Any  # a numpy dtype, or a typed-key dtype (key<fry>)
    donated: bool
    kept: bool
    weak_type: bool = False

    def describe(self) -> str:
        return format_aval(self.shape, self.dtype, self.weak_type)


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
    # treedef.structure_key of in_tree: how a caller's structure is matched (a loaded
    # in_tree may hold stand-ins for nodes this process cannot rebuild). Empty: computed.
    in_structure: str = ""
    # The stored output structure when out_tree holds stand-ins: each caller's outputs
    # are rebuilt from it with the caller's own input nodes (treedef.resolve).
    out_json: Any = None
    # The static arguments' values (aot.statics), shown in the signature.
    statics: tuple[Any, ...] = ()
    # The host callbacks the program calls, bound by name (aot.callbacks); format 4.
    host_callbacks: tuple[dict[str, Any], ...] = ()
    # A GPU entry's autotuning (aot.platforms.cuda.compile_tuned): "tuned sha256:...",
    # "defaults" or "measured"; None elsewhere.
    autotune: str | None = None
    # The constants JAX hoisted into the executable's leading arguments (aot.constants):
    # their avals, with the shardings the executable expects them on.
    constants: tuple[jax.ShapeDtypeStruct, ...] = ()

    def __post_init__(self) -> None:
        if not self.in_structure:
            object.__setattr__(self, "in_structure", treedefs.structure_key(self.in_tree))

    @property
    def key(self) -> str:
        return combined_key(self.program_fingerprint, self.environment_fingerprint)

    @property
    def signature(self) -> str:
        from aot.statics import with_statics

        return with_statics(", ".join(a.describe() for a in self.args), self.statics)


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
        # The device target (aot.targets) it was compiled for without the device: it
        # runs on that accelerator only, after aot.load there.
        self.target: Any = None
        self._bindings: dict[PyTreeDef, Binding] = {}
        self._cpp = _dispatch_of(self)

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
        # JAX's C++ dispatch (what jax.jit and Compiled run): a signature it has not
        # seen goes to _first_call, which checks structure and avals in Python once.
        return self._cpp(*args, **kwargs)

    def _first_call(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, bool]:
        leaves, treedef = _flatten((args, kwargs))
        if not self.accepts_structure(treedef):
            mapped = self._by_keyword(leaves, treedef)
            if mapped is not None:  # never cached by the C++ dispatch: mapped per call
                try:
                    return mapped[0](mapped[1]), None, False
                except (TypeError, ValueError) as exc:
                    raise placement_error(self.name, exc) from exc
        binding = self._admit(args, kwargs, leaves, treedef)
        try:
            return first_call(binding.fn, leaves)
        except (TypeError, ValueError) as exc:
            raise placement_error(self.name, exc) from exc

    def _admit(self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef) -> Binding:
        """Checks structure and avals; the binding for this caller's structure."""
        if not self.accepts_structure(treedef) or not self._leaves_match(leaves):
            raise self.mismatch_error(args, kwargs)
        if self.target is not None:
            raise DeviceTargetError(
                f"{self.name} was compiled for {self.target} without the device and runs only "
                "there: store it (cache.put) and serve it with aot.load on that accelerator"
            )
        return self.bind(treedef)

    def _by_keyword(self, leaves: list[Any], treedef: PyTreeDef) -> tuple[Binding, list[Any]] | None:
        """The call with its arguments moved to where they were compiled, by parameter
        name (:mod:`aot.keywords`): by keyword where compiled by position, or the reverse."""
        from aot.keywords import layout_of, permutations

        layout = layout_of(self.info.in_tree, self.info.arg_names)
        for perm, form in permutations(treedef, [layout] if layout is not None else []):
            moved = [leaves[i] for i in perm]
            if self.accepts_structure(form) and self._leaves_match(moved):
                return self.bind(form), moved
        return None

    def accepts_structure(self, treedef: PyTreeDef) -> bool:
        """``treedef`` is the structure compiled for (by digest, in any process)."""
        if treedef == self.info.in_tree:
            return True
        return treedefs.structure_key(treedef) == self.info.in_structure

    def bind(self, treedef: PyTreeDef) -> Binding:
        """The flat call for inputs of structure ``treedef`` (already matched), whose
        outputs get the structure this caller expects."""
        binding = self._bindings.get(treedef)
        if binding is None:
            binding = Binding(self, self._out_tree_for(treedef))
            if len(self._bindings) < FAST_CACHE_LIMIT:
                self._bindings[treedef] = binding
        return binding

    def _out_tree_for(self, treedef: PyTreeDef) -> PyTreeDef:
        if self.info.out_json is None:
            return self.info.out_tree
        # Nodes this process could not rebuild from the manifest alone: the caller's
        # own input nodes of the same type and digest stand in (a train step returns
        # the state it was given); else PytreeNodeError names the node.
        return treedefs.resolve(self.info.out_json, treedefs.node_table(treedef))

    def call_checked(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Runs on inputs whose structure, shapes and dtypes were already checked."""
        leaves, treedef = _flatten((tuple(args), dict(kwargs)))
        return self.bind(treedef)(leaves)

    def matches(self, leaves: Sequence[Any]) -> bool:
        return self._leaves_match(leaves)

    def _leaves_match(self, leaves: Sequence[Any]) -> bool:
        return len(leaves) == len(self._expected) and all(
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


def _dispatch_of(executable: MeshExecutable) -> Any:
    """JAX's C++ dispatch for ``executable``, whose cache miss does not keep it alive."""
    ref = weakref.ref(executable)

    def cache_miss(*args: Any, **kwargs: Any) -> tuple[Any, Any, bool]:
        live = ref()
        if live is None:  # pragma: no cover - the C++ function outlived its executable
            raise ReferenceError(f"the executable {executable_name} was garbage-collected")
        return live._first_call(*args, **kwargs)

    executable_name = executable.name
    return dispatch_function(executable_name, cache_miss)


class Binding:
    """An executable called with flat inputs of one caller structure, returning that
    caller's output structure. ``fn(*leaves)`` is JAX's C++ dispatch function itself:
    the per-call path of a dispatcher or an executable calls it directly."""

    __slots__ = ("executable", "out_tree", "fn")

    def __init__(self, executable: MeshExecutable, out_tree: PyTreeDef) -> None:
        self.executable = executable
        self.out_tree = out_tree
        self.fn = flat_call(executable.compiled, executable.info.args, out_tree)

    def __call__(self, leaves: Sequence[Any]) -> Any:
        try:
            return self.fn(*leaves)
        except (TypeError, ValueError) as exc:
            raise placement_error(self.executable.name, exc) from exc


def placement_error(name: str, exc: Exception) -> AvalMismatchError:
    # Avals matched before the call, so what JAX refuses is placement (committed arrays
    # on other devices or with another sharding).
    return AvalMismatchError(
        f"{name}: inputs match the compiled shapes and dtypes but JAX refused them: {exc}. "
        "Put the inputs on the compiled shardings (jax.device_put(x, sharding)) or pass "
        "uncommitted arrays."
    )


def executable_class(kind: str) -> type[MeshExecutable]:
    return PmapExecutable if kind == "pmap" else MeshExecutable


def _leaf_matches(leaf: Any, shape: tuple[int, ...], dtype: Any) -> bool:
    """The one rule for an input leaf, JAX's own: the shape and the dtype ``jax.jit``
    makes of it (x64 off: a NumPy float64 array is f32; a Python float is f32).
    Weak types are not compared, as JAX's compiled executables do not."""
    try:
        aval = leaf.aval
    except AttributeError:
        try:
            aval = jax.typeof(leaf)
        except (TypeError, OverflowError):  # a string, an object: not a JAX type
            return False
    try:
        return tuple(aval.shape) == tuple(shape) and aval.dtype == dtype
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
    if _same_structure(got, expected):
        return [
            f"{arg.path}: expected {arg.describe()}, got {_describe_leaf(leaf)}"
            for arg, leaf in zip(args, leaves)
            if not _leaf_matches(leaf, arg.shape, arg.dtype)
        ]
    # PyTreeDef.node_data: in jaxlib's pytree module since 0.4, not in its type stubs.
    node = expected.node_data()  # type: ignore[attr-defined]
    got_node = got.node_data()  # type: ignore[attr-defined]
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


def _same_structure(got: PyTreeDef, expected: PyTreeDef) -> bool:
    return got == expected or treedefs.structure_key(got) == treedefs.structure_key(expected)


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
    if cls is treedefs.Unresolved:
        return f"a {aux[0]} node"
    return f"a {cls.__module__}:{cls.__qualname__} node"


def _describe_leaf(leaf: Any) -> str:
    if type(leaf) in _PY_SCALARS:
        return f"{leaf_signature([leaf])} (Python {type(leaf).__name__} {leaf!r})"
    try:
        return leaf_signature([leaf])
    except (TypeError, OverflowError):
        text = f"{type(leaf).__name__} {leaf!r}"
        return (text if len(text) <= 80 else text[:77] + "...") + " (not a JAX type)"


def _structure(treedef: PyTreeDef) -> str:
    text = str(treedef)
    return text if len(text) < 300 else treedefs.canonical(treedef)[:300] + "..."

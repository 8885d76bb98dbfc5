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

_SCALAR_KINDS = {bool: "b", int: "iu", float: "f", complex: "c"}


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
            return self._compiled(*args, **kwargs)
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
        for leaf, (shape, dtype) in zip(leaves, self._expected):
            kinds = _SCALAR_KINDS.get(type(leaf))
            if kinds is not None:
                if shape != () or dtype.kind not in kinds:
                    return False
                continue
            try:
                if leaf.shape != shape or leaf.dtype != dtype:
                    return False
            except AttributeError:
                return False
        return True

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


def input_mismatch_error(
    info: ExecutableInfo, args: Sequence[Any], kwargs: dict[str, Any]
) -> AvalMismatchError:
    """Lists every mismatch between the inputs and the compiled avals, by path."""
    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)))
    problems: list[str] = []
    if treedef != info.in_tree:
        expected_args = len(info.in_tree.children()[0].children())
        got_args = len(args)
        if expected_args != got_args:
            problems.append(f"expected {expected_args} positional arguments, got {got_args}")
        problems.append(
            f"expected pytree structure {_structure(info.in_tree)}, got {_structure(treedef)}"
        )
    else:
        for arg, leaf in zip(info.args, leaves):
            got = _describe_leaf(leaf)
            if got != arg.describe():
                problems.append(f"{arg.path}: expected {arg.describe()}, got {got}")
    message = (
        f"{info.name}: inputs do not match the compiled signature ({info.signature}):\n  "
        + "\n  ".join(problems)
        + "\nPass inputs of the compiled shapes and dtypes, or compile this signature too."
    )
    return AvalMismatchError(message, tuple(problems))


def _describe_leaf(leaf: Any) -> str:
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return format_aval(leaf.shape, leaf.dtype)
    try:
        return leaf_signature([leaf])
    except Exception:  # noqa: BLE001 - anything that is not an array
        return f"{type(leaf).__name__} {leaf!r}"[:80]


def _structure(treedef: PyTreeDef) -> str:
    text = str(treedef)
    return text if len(text) < 300 else treedefs.canonical(treedef)[:300] + "..."

"""Symbolic (shape-polymorphic) dimensions: parsing, scopes, and binding to shapes.

A spec such as ``"f32[b,784]"`` or ``"i32[2*b]"`` has dimensions that are
``jax.export`` dimension expressions. A program lowered against them is stored once,
as portable HLO (``jax.export``), and compiled for each concrete shape asked for at
serve time. This module holds the pure pieces of that: turning dimension text into
``jax.export`` dimension expressions (all in one scope), formatting them for
signatures, and solving a stored symbolic signature against concrete shapes (which
``b`` does ``f32[8,784]`` give, and does it satisfy the constraints).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aot.errors import SpecError, SymbolicShapeError

# The characters a dimension expression may use (jax.export's grammar: identifiers,
# integers, + - * and parentheses, floordiv/mod/max/min calls with commas).
_DIM_TEXT_RE = re.compile(r"^[A-Za-z0-9_+\-*(), ]+$")
_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The longest dimension expression a spec or manifest may carry (hostile input).
MAX_DIM_TEXT = 200

_SPEC_SCOPE: Any = None


def spec_scope() -> Any:
    """The scope of every symbolic dimension parsed from a spec string in this process.

    Dimensions that interact must share one ``jax.export.SymbolicScope``, so
    ``aot.spec("f32[b,784]")`` and ``aot.spec("i32[b]")`` called separately give the
    same ``b``.
    """
    global _SPEC_SCOPE
    if _SPEC_SCOPE is None:
        import jax

        _SPEC_SCOPE = jax.export.SymbolicScope()
    return _SPEC_SCOPE


def is_symbolic_dim(dim: Any) -> bool:
    """True for a ``jax.export`` dimension expression (not for ints or numpy ints)."""
    if isinstance(dim, (int, np.integer)):
        return False
    from aot.jaxcompat.shape_poly import is_symbolic_dim as is_expression

    return is_expression(dim)


def is_symbolic_shape(shape: Iterable[Any]) -> bool:
    return any(is_symbolic_dim(d) for d in shape)


def format_dim(dim: Any) -> str:
    """``8`` -> ``"8"``; ``2*b + 1`` -> ``"2*b+1"`` (no spaces: one canonical text)."""
    if isinstance(dim, str):
        return dim.replace(" ", "")
    if is_symbolic_dim(dim):
        return str(dim).replace(" ", "")
    return str(int(dim))


def split_dims(text: str) -> list[str]:
    """``"b, max(a, b), 3"`` -> ``["b", "max(a, b)", "3"]`` (commas inside calls stay)."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def parse_dim(text: str, scope: Any = None) -> Any:
    """A dimension's text -> an int, or a ``jax.export`` dimension expression.

    Raises :class:`SpecError` (with jax.export's reason) for text that is neither.
    """
    raw = text.strip()
    if raw.isascii() and raw.isdigit():
        return int(raw)
    what = (
        f"dimension {text!r} is not a non-negative integer or a symbolic dimension "
        "expression (an identifier such as 'b', or an expression such as '2*b', 'b+1', "
        "'max(a, b)')"
    )
    if not raw or len(raw) > MAX_DIM_TEXT or not _DIM_TEXT_RE.match(raw):
        raise SpecError(what)
    import jax

    try:
        (dim,) = jax.export.symbolic_shape(raw, scope=scope or spec_scope())
    except Exception as exc:  # noqa: BLE001 - jax raises ValueError/TypeError/others
        raise SpecError(f"{what}: {_first_line(exc)}") from None
    if not is_symbolic_dim(dim):  # a constant expression such as "-1" or "2*3"
        value = int(dim)
        if value < 0:
            raise SpecError(what)
        return value
    return dim


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------- scopes


def _scope_of(dim: Any) -> Any:
    return dim.scope


def constraints_of(scope: Any) -> tuple[str, ...]:
    """The user's constraints of a scope, as they were written (``"b >= 16"``)."""
    return tuple(str(c.debug_str) for c in getattr(scope, "_explicit_constraints", ()))


def unify_scopes(structs: Sequence[Any], *, name: str) -> list[Any]:
    """``ShapeDtypeStruct``s whose symbolic dimensions all share one scope.

    ``jax.export`` refuses to mix scopes. Specs parsed from strings share
    :func:`spec_scope`; structs made with ``jax.export.symbolic_shape`` have their
    own. The dimensions are re-created in the one scope that carries constraints (or
    the first one); two scopes with different constraints cannot be merged.
    """
    import jax

    scopes: list[Any] = []
    for struct in structs:
        for dim in struct.shape:
            if is_symbolic_dim(dim) and not any(_scope_of(dim) is s for s in scopes):
                scopes.append(_scope_of(dim))
    if len(scopes) <= 1:
        return list(structs)
    constrained = [s for s in scopes if constraints_of(s)]
    if len({constraints_of(s) for s in constrained}) > 1:
        raise SymbolicShapeError(
            f"{name}: the symbolic dimensions come from scopes with different constraints "
            f"({'; '.join(', '.join(constraints_of(s)) for s in constrained)}); create every "
            "symbolic shape of one program with one jax.export.SymbolicScope (pass scope= "
            "to jax.export.symbolic_shape)"
        )
    target = constrained[0] if constrained else scopes[0]
    out = []
    for struct in structs:
        if not is_symbolic_shape(struct.shape) or all(
            _scope_of(d) is target for d in struct.shape if is_symbolic_dim(d)
        ):
            out.append(struct)
            continue
        shape = tuple(
            parse_dim(format_dim(d), target) if is_symbolic_dim(d) else int(d) for d in struct.shape
        )
        out.append(jax.ShapeDtypeStruct(shape, struct.dtype, sharding=struct.sharding))
    return out


# ---------------------------------------------------------------- binding


@dataclass(frozen=True, slots=True)
class Binding:
    """The outcome of matching concrete shapes against a symbolic signature."""

    values: dict[str, int] | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.values is not None


@functools.lru_cache(maxsize=256)
def _solver(
    patterns: tuple[tuple[Any, ...], ...], constraints: tuple[str, ...]
) -> tuple[Any, Any, Any, tuple[str, ...]]:
    import jax

    from aot.jaxcompat.shape_poly import all_dim_vars, solve_dim_vars

    scope = jax.export.SymbolicScope(constraints)
    avals = tuple(
        jax.core.ShapedArray(
            tuple(parse_dim(str(d), scope) if isinstance(d, str) else int(d) for d in shape),
            np.float32,
        )
        for shape in patterns
    )
    tree = jax.tree_util.tree_structure((tuple(range(len(avals))), {}))
    solution, shape_constraints, synthetic = solve_dim_vars(avals, tree)
    return solution, shape_constraints, synthetic, all_dim_vars(avals)


def bind(
    patterns: Sequence[Sequence[int | str]],
    shapes: Sequence[Sequence[int]],
    constraints: Sequence[str] = (),
    *,
    paths: Sequence[str] = (),
) -> Binding:
    """Solves the symbolic dimensions of ``patterns`` for concrete ``shapes``.

    ``patterns`` are the stored shapes (ints and dimension texts such as ``"2*b"``),
    one per flat input; ``shapes`` the caller's. Returns the values of every
    dimension variable, or ``values=None`` and a reason (a rank or constant dimension
    that differs, an inconsistent ``b``, a violated constraint).
    """
    if len(patterns) != len(shapes):
        return Binding(None, f"{len(shapes)} inputs for {len(patterns)}")
    for i, (pattern, shape) in enumerate(zip(patterns, shapes)):
        where = paths[i] if i < len(paths) else f"input {i}"
        if len(pattern) != len(shape):
            return Binding(None, f"{where}: rank {len(shape)} != {len(pattern)}")
        for axis, (want, have) in enumerate(zip(pattern, shape)):
            if not isinstance(want, str) and int(want) != int(have):
                return Binding(None, f"{where}: dimension {axis} is {have}, not {want}")
    from aot.jaxcompat.shape_poly import shape_evaluator

    key = tuple(tuple(d if isinstance(d, str) else int(d) for d in p) for p in patterns)
    try:
        solution, shape_constraints, synthetic, variables = _solver(key, tuple(constraints))
    except Exception as exc:  # noqa: BLE001 - an unsolvable signature (e.g. only b*c)
        return Binding(None, f"jax.export cannot solve the dimensions: {_first_line(exc)}")
    env = {name: int(shapes[arg][axis]) for (name, arg, axis) in synthetic}
    evaluator = shape_evaluator(env)
    try:
        shape_constraints.check_statically(evaluator)
        values = {var: int(evaluator.evaluate(solution[var])) for var in variables}
    except Exception as exc:  # noqa: BLE001 - ValueError / InconclusiveDimensionOperation
        return Binding(None, _short_reason(str(exc)))
    return Binding(values)


def _short_reason(message: str) -> str:
    # jax's messages end with the whole specification and a link; keep the first
    # sentence, which names the dimension and the constraint.
    first = message.split(" Using the following polymorphic shapes")[0]
    return first.replace("Input shapes do not match the polymorphic shapes specification. ", "")


def check_dim_text(text: Any) -> str:
    """A manifest's dimension text, refused unless it looks like a dimension expression."""
    if not isinstance(text, str) or not text or len(text) > MAX_DIM_TEXT or not _DIM_TEXT_RE.match(text):
        raise ValueError(f"malformed symbolic dimension {str(text)[:40]!r}")
    return text


def variables_of(patterns: Iterable[Iterable[int | str]]) -> list[str]:
    """The identifiers used in dimension texts, sorted (``["b", "s"]``)."""
    names: set[str] = set()
    for pattern in patterns:
        for dim in pattern:
            if isinstance(dim, str):
                names.update(
                    t for t in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", dim)
                    if t not in ("max", "min", "mod", "floordiv", "non_negative")
                )
    return sorted(names)


def patterns_of(args: Iterable[Any]) -> tuple[tuple[int | str, ...], ...]:
    """The stored shape of each flat input of a manifest: ints and dimension texts."""
    return tuple(tuple(d if isinstance(d, str) else int(d) for d in a["shape"]) for a in args)

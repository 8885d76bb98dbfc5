"""Padding to stored shape buckets, for serving stacks (``aot.load(name, pad=...)``).

A service compiles a few batch sizes (buckets: 1, 8, 32) and pads each request up to
the smallest bucket that fits, then slices the padding off the outputs. Whether that
is correct depends on the program: padded rows must not change the real rows' results
(no batch norm over the batch, no sum or softmax across it, no sort of the whole
batch). That cannot be seen in a compiled executable, so it is the caller's
declaration: passing ``pad=`` says "rows along these axes are independent".

The rules (docs/symbolic.md):

* ``pad`` maps an input path to the axis to pad: ``{"x": 0}``, ``{"batch": 0}``
  (every array under the argument ``batch``), ``{"batch['mask']": 1}``. Paths are
  the ones errors and ``aot show`` print: the parameter name, then pytree keys.
* A call whose padded inputs all have ``n`` rows along their axes is served by the
  stored signature with the smallest bucket ``B >= n`` whose other dimensions and
  dtypes match exactly; the padded inputs get ``B - n`` rows of ``pad_value``.
* Outputs: with ``pad_outputs=None`` every output array whose size along the padded
  axis equals ``B`` is sliced back to ``n`` (the same axis as the inputs'; when the
  inputs are padded along different axes, ``pad_outputs`` must be given).
  ``pad_outputs=k`` uses axis ``k`` with the same size rule. A mapping
  ``{output_path: axis}`` slices exactly those outputs (``""`` is a bare array
  output, ``"[0]"`` the first of a tuple, ``"['logits']"`` a dict entry).
* No bucket large enough: :class:`~aot.errors.SignatureNotFoundError` naming the
  largest bucket stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from aot.errors import AvalMismatchError, SignatureNotFoundError, SpecError

if TYPE_CHECKING:
    from aot.cache.serving.programs import LeafKey, Program


@dataclass(frozen=True, slots=True)
class PadPlan:
    """What a dispatcher pads: input paths -> axis, the output rule, the pad value."""

    inputs: tuple[tuple[str, int], ...]
    outputs: int | tuple[tuple[str, int], ...] | None = None
    value: Any = 0

    @classmethod
    def of(
        cls, pad: Mapping[str, int], outputs: int | Mapping[str, int] | None = None, value: Any = 0,
    ) -> PadPlan:
        if not isinstance(pad, Mapping) or not pad:
            raise SpecError(
                f"pad={pad!r}: expected a non-empty mapping from an input path to the axis "
                "to pad, e.g. pad={'x': 0}"
            )
        for path, axis in pad.items():
            if not isinstance(path, str) or not _is_axis(axis):
                raise SpecError(
                    f"pad={dict(pad)!r}: {path!r}: {axis!r} is not an axis; expected "
                    "{'input path': non-negative axis}, e.g. pad={'x': 0}"
                )
        if outputs is not None and not _is_axis(outputs):
            if not isinstance(outputs, Mapping) or not all(
                isinstance(p, str) and _is_axis(a) for p, a in outputs.items()
            ):
                raise SpecError(
                    f"pad_outputs={outputs!r}: expected None (the padded axis), an axis, "
                    "or a mapping from an output path to an axis, e.g. {'[0]': 0}"
                )
        out_axes: int | tuple[tuple[str, int], ...] | None = (
            tuple(sorted(outputs.items())) if isinstance(outputs, Mapping) else outputs
        )
        if out_axes is None and len({axis for axis in pad.values()}) > 1:
            raise SpecError(
                f"pad={dict(pad)!r} pads different axes, so the output axis to slice is "
                "ambiguous; pass pad_outputs= (an axis, or {output path: axis})"
            )
        return cls(tuple(sorted(pad.items())), out_axes, value)

    def axes_for(self, paths: Sequence[str]) -> dict[int, int]:
        """Flat input index -> axis to pad, for the stored leaf ``paths``."""
        out: dict[int, int] = {}
        for wanted, axis in self.inputs:
            hits = [i for i, path in enumerate(paths) if _under(path, wanted)]
            if not hits:
                raise SpecError(
                    f"pad: no input is named {wanted!r}; the stored inputs are "
                    f"{', '.join(paths) or '(none)'}"
                )
            for i in hits:
                out[i] = axis
        return out

    @property
    def default_axis(self) -> int:
        return self.inputs[0][1]


def _is_axis(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _under(path: str, wanted: str) -> bool:
    """``batch['x']`` is under ``batch``; ``batches`` is not."""
    return path == wanted or (path.startswith(wanted) and path[len(wanted)] in "[.")


@dataclass(frozen=True, slots=True)
class Bucket:
    """A stored signature a padded call can use: its index and its padded size."""

    index: int
    size: int


def rows(leaves: Sequence[Any], keys: Sequence[LeafKey], axes: Mapping[int, int]) -> int:
    """The common size of the padded inputs along their axes (``n``)."""
    sizes: dict[int, int] = {}
    for i, axis in axes.items():
        shape = keys[i][0]
        if len(shape) <= axis:
            raise AvalMismatchError(
                f"pad: input {i} has shape {tuple(shape)}, which has no axis {axis} to pad"
            )
        sizes[i] = int(shape[axis])
    if len(set(sizes.values())) > 1:
        detail = ", ".join(f"input {i}: {n}" for i, n in sorted(sizes.items()))
        raise AvalMismatchError(
            f"pad: the padded inputs must have the same size along their padded axes; got {detail}"
        )
    return next(iter(sizes.values()))


def fits(
    stored: Sequence[LeafKey], got: Sequence[LeafKey], axes: Mapping[int, int], n: int
) -> int | None:
    """The bucket size if ``stored`` can serve ``got`` padded along ``axes``, else None.

    Returns the stored size even when it is smaller than ``n`` (the caller reports
    the largest bucket); other dimensions and every dtype must match exactly.
    """
    if len(stored) != len(got):
        return None
    size: int | None = None
    for i, ((want_shape, want_dtype, want_weak), (have_shape, have_dtype, have_weak)) in enumerate(
        zip(stored, got)
    ):
        if want_dtype != have_dtype or want_weak != have_weak or len(want_shape) != len(have_shape):
            return None
        axis = axes.get(i)
        for d, (want, have) in enumerate(zip(want_shape, have_shape)):
            if d == axis:
                if size is not None and size != int(want):
                    return None
                size = int(want)
            elif int(want) != int(have):
                return None
    return size


def pad_leaf(leaf: Any, axis: int, size: int, value: Any) -> Any:
    """``leaf`` with rows of ``value`` appended along ``axis`` up to ``size``.

    Host arrays are padded on the host (numpy); a ``jax.Array`` with ``jax.lax.pad``
    (a small program JAX compiles once per shape, not the model).
    """
    extra = size - int(np.shape(leaf)[axis])
    if extra == 0:
        return leaf
    if isinstance(leaf, jax.Array):
        config = [(0, 0, 0)] * leaf.ndim
        config[axis] = (0, extra, 0)
        return jax.lax.pad(leaf, np.asarray(value, dtype=leaf.dtype), config)
    array = np.asarray(leaf)
    shape = list(array.shape)
    shape[axis] = size
    out = np.full(shape, value, dtype=array.dtype)  # a few times faster than np.pad
    index = [slice(None)] * array.ndim
    index[axis] = slice(0, array.shape[axis])
    out[tuple(index)] = array
    return out


def unpad_outputs(out: Any, plan: PadPlan, size: int, n: int) -> Any:
    """Slices the padding off the outputs, by the rule of ``plan.outputs``."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(out)
    if isinstance(plan.outputs, tuple):
        wanted = dict(plan.outputs)
        paths = [jax.tree_util.keystr(path) for path, _ in flat]
        unknown = sorted(set(wanted) - set(paths))
        if unknown:
            raise SpecError(
                f"pad_outputs names outputs {unknown} that the program does not return; "
                f"its outputs are {', '.join(repr(p) for p in paths)}"
            )
        leaves = []
        for path, (_, leaf) in zip(paths, flat):
            if path in wanted:
                axis = wanted[path]
                if np.ndim(leaf) <= axis or np.shape(leaf)[axis] != size:
                    raise AvalMismatchError(
                        f"pad_outputs: output {path!r} has shape {tuple(np.shape(leaf))}, "
                        f"not {size} (the padded size) along axis {axis}; it cannot be sliced "
                        "back to the request's rows"
                    )
                leaf = _slice(leaf, axis, n)
            leaves.append(leaf)
    else:
        axis = plan.default_axis if plan.outputs is None else plan.outputs
        leaves = [
            _slice(leaf, axis, n) if np.ndim(leaf) > axis and np.shape(leaf)[axis] == size else leaf
            for _, leaf in flat
        ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _slice(leaf: Any, axis: int, n: int) -> Any:
    if isinstance(leaf, jax.Array):
        return jax.lax.slice_in_dim(leaf, 0, n, axis=axis)
    index = [slice(None)] * np.ndim(leaf)
    index[axis] = slice(0, n)
    return np.asarray(leaf)[tuple(index)]


def choose_bucket(
    name: str, candidates: Sequence[Program], leaves: Sequence[Any], got: Sequence[LeafKey],
    axes: Mapping[int, int], notes: list[str], *, symbolic_may_serve: bool,
) -> tuple[Program, int, int] | None:
    """The program with the smallest bucket that fits the call, its size and the
    call's rows ``n``; None when no bucket differs from the call only along the
    padded axes (not a padding question).

    No bucket large enough: refused, naming the largest; unless a symbolic program
    may serve the exact shape (``symbolic_may_serve``), which is then tried (the
    refusal becomes a note of the miss).
    """
    n = rows(leaves, got, axes)
    sizes = [(fits(p.leaves, got, axes, n), p) for p in candidates]
    usable = [(size, p) for size, p in sizes if size is not None]
    if not usable:
        return None
    large = [(size, p) for size, p in usable if size >= n]
    if not large:
        largest, program = max(usable, key=lambda pair: pair[0])
        message = f"{n} rows do not fit any stored bucket: the largest is {largest} ({program.signature})"
        if symbolic_may_serve:
            notes.append(f"Padding: {message}.")
            return None
        raise SignatureNotFoundError(
            f"{name}: {message}. Compile a bucket of at least {n} rows "
            "(aot compile / aot warmup), or split the request.",
            tuple(sorted(p.signature for _, p in usable)),
        )
    size, program = min(large, key=lambda pair: pair[0])
    return program, size, n


class PaddedCall:
    """A kind of call served by padding to a bucket: ``fn(*leaves)`` pads the declared
    inputs, runs the bucket's executable and slices the outputs back (the dispatcher's
    per-call cache holds it like a bound executable)."""

    __slots__ = ("run", "axes", "size", "n", "plan")

    def __init__(self, run: Callable[..., Any], axes: Mapping[int, int], size: int, n: int, plan: PadPlan) -> None:
        self.run = run  # the bucket's executable, bound to the call's pytree structure
        self.axes = axes
        self.size = size
        self.n = n
        self.plan = plan

    def fn(self, *leaves: Any) -> Any:
        axes, size, value = self.axes, self.size, self.plan.value
        padded = [
            pad_leaf(leaf, axes[i], size, value) if i in axes else leaf
            for i, leaf in enumerate(leaves)
        ]
        return unpad_outputs(self.run(*padded), self.plan, size, self.n)

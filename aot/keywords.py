"""Calls whose arguments are passed by keyword where the entry was compiled with them
by position, or the reverse: ``serve(x, y=y)`` on an entry compiled as ``f(x, y)``.

``jax.jit`` binds both forms to the function's parameters; a stored entry knows its
parameters by name (``Manifest.arg_names``), so such a call is rearranged into the
form that was compiled. Only the Python path does this (``aot.load``'s dispatcher
remembers the permutation of the leaves per kind of call; a ``MeshExecutable`` maps
each such call): a call of the compiled form itself is served by JAX's C++ dispatch
untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.tree_util import PyTreeDef


@dataclass(frozen=True, slots=True)
class Layout:
    """How a stored program takes its arguments: how many by position, which by
    keyword, and the parameter names (positional ones first)."""

    positional: int
    keywords: tuple[str, ...]
    names: tuple[str, ...]


def layout_of(treedef: PyTreeDef, names: Sequence[str]) -> Layout | None:
    """The layout of a stored ``(args, kwargs)`` input structure (None: not one)."""
    children = treedef.children()
    if len(children) != 2:
        return None
    data = children[1].node_data()
    keys = tuple(str(k) for k in data[1]) if data is not None and data[1] is not None else ()
    return Layout(len(children[0].children()), keys, tuple(names))


def rearrange(args: Sequence[Any], kwargs: dict[str, Any], layout: Layout) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The call's arguments in the layout's form, or None when the names do not fit
    (an argument given twice, missing, or unknown is refused as jax.jit refuses it)."""
    names = layout.names
    if len(args) > len(names):
        return None
    values: dict[str, Any] = dict(zip(names, args))
    for key, value in kwargs.items():
        if key in values:
            return None
        values[key] = value
    if layout.positional > len(names):
        return None
    new_args = []
    for name in names[: layout.positional]:
        if name not in values:
            return None
        new_args.append(values.pop(name))
    new_kwargs = {}
    for key in layout.keywords:
        if key not in values:
            return None
        new_kwargs[key] = values.pop(key)
    if values:
        return None
    return tuple(new_args), new_kwargs


def permutations(treedef: PyTreeDef, layouts: Iterable[Layout]) -> Iterable[tuple[list[int], PyTreeDef]]:
    """For each layout the call fits: which of the call's flat leaves goes where
    (``leaves[perm[i]]`` is the i-th input of the compiled form), and that form's
    input structure."""
    indexed_args, indexed_kwargs = jax.tree_util.tree_unflatten(treedef, range(treedef.num_leaves))
    for layout in layouts:
        form = rearrange(indexed_args, indexed_kwargs, layout)
        if form is None:
            continue
        perm, new_treedef = jax.tree_util.tree_flatten(form)
        if new_treedef != treedef:
            yield perm, new_treedef

"""The wording of a miss: what a call that no stored program serves is told.

A miss names the call per argument (a list of 1000 floats is one phrase, not 1000
leaves), lists the stored signatures, the entries that cannot serve in this process,
why padding or a symbolic program did not fit, and the nearest stored signature with
what differs: which leaves (and how far their shapes are), or which arguments differ
in pytree structure.

Imported on the first miss only: serving exact signatures never needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from aot import treedef as treedefs
from aot.errors import AvalMismatchError, IntegrityError, SignatureNotFoundError
from aot.specs import format_aval, leaf_aval

from aot.cache.serving.programs import LeafKey, Program, ProgramTable, SymbolicProgram
from aot.signatures import describe_call, path_head
from aot.cache.units import counted

WEAK_HINT = (
    " (a Python scalar is weakly typed under jax.jit, an array is not: pass the kind "
    "that was compiled, or compile the other)"
)


def describe_keys(keys: Sequence[LeafKey]) -> str:
    """A call's leaves as avals (``f32[8,784], i32[]``)."""
    return ", ".join(format_aval(shape, dtype, weak) for shape, dtype, weak in keys)


def arg_names(table: ProgramTable) -> list[str]:
    """The positional parameter names: as the manifest records them, else from the
    stored leaf paths."""
    names: list[str] = []
    for program in table.concrete.values():
        if program.names:
            return list(program.names)
        for path in program.paths:
            head = path_head(path)
            if head not in names:
                names.append(head)
        break
    return names


def describe_the_call(table: ProgramTable, args: Any, kwargs: Any) -> str:
    """The call, per argument and by name."""
    return describe_call(args, kwargs, arg_names(table))


def not_a_jax_type(name: str, args: Any, kwargs: Any, names: Sequence[str] = ()) -> AvalMismatchError:
    """A call with an input jax.jit refuses too (a string, an object), named by the
    parameter's name where it is known."""
    bad = []
    for path, leaf in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]:
        try:
            leaf_aval(leaf)
        except TypeError:
            bad.append(f"{_render(path, names)} is {_short(leaf)}")
    return AvalMismatchError(
        f"{name}: {'; '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}: not an array "
        "or a Python scalar (jax.jit refuses it too); pass arrays",
        tuple(bad),
    )


def refused_for(table: ProgramTable, got: tuple[LeafKey, ...]) -> tuple[str, str, str] | None:
    """The (key, signature, why) of a stored row of exactly this call's signature that
    the signing checks refused (unsigned, another key, altered), if any."""
    if not got:
        return None
    flat = describe_keys(got)
    for key, signature, reason in getattr(table, "refused", ()):
        if signature == flat:
            return key, signature, reason
    return None


def miss_reason(table: ProgramTable, args: Any, kwargs: Any, structure: str, got: tuple[LeafKey, ...]) -> str:
    """Why a call missed, as ``aot stats`` files it (under the call's flat signature):
    a stored row of that signature was refused by the signing checks; the signature is
    stored but the call's pytree differs (a structure mismatch, not a signature that is
    not stored); or no stored signature."""
    if refused_for(table, got) is not None:
        return "refused: stored but not signed with this key (or altered)"
    for program in table.concrete.values():
        if program.leaves == got and program.structure != structure:
            diffs = structure_differences(program, args, kwargs)
            return "pytree structure mismatch with the stored signature" + (
                f": {'; '.join(diffs)[:300]}" if diffs else ""
            )
    return "no stored signature"


def refused_call(table: ProgramTable, args: Any, kwargs: Any, row: tuple[str, str, str]) -> IntegrityError:
    """A call whose signature is stored, but in a row the signing checks refused: not a
    miss of something not stored."""
    key, signature, reason = row
    return IntegrityError(
        f"{table.name}: ({describe_the_call(table, args, kwargs)}) is stored ({key[:12]}, {signature}) "
        f"but was refused: expected an artifact signed with this cache's signing key, got {reason}. "
        "Sign it: store it again with the key set (AOT_SIGNING_KEY; aot warmup / aot compile), "
        "or `aot push` it from a cache that signs; or load without a key if this cache is not "
        "meant to be signed."
    )


def not_found(
    table: ProgramTable, args: Any, kwargs: Any, structure: str, got: tuple[LeafKey, ...],
    notes: Sequence[str] = (),
) -> SignatureNotFoundError | IntegrityError:
    """No stored program serves the call: what is stored, and the nearest; an
    :class:`IntegrityError` when the call's signature is stored in a refused row."""
    row = refused_for(table, got)
    if row is not None:
        return refused_call(table, args, kwargs, row)
    stored = table.signatures
    lines = [f"  {s}" for s in stored] or ["  (none: nothing is stored under this name here)"]
    message = (
        f"{table.name}: no executable compiled for ({describe_the_call(table, args, kwargs)}).\n"
        f"Stored signatures:\n" + "\n".join(lines)
    )
    if table.skipped:
        message += "\nNot servable in this process:\n" + "\n".join(
            f"  {sig} ({key[:12]}): {reason}" for key, sig, reason in table.skipped[:5]
        )
    for note in notes:
        message += f"\n{note}"
    found = nearest(table, args, kwargs, structure, got)
    if found is not None:
        program, diffs = found
        message += f"\nNearest: ({program.signature}); differs in " + ", ".join(diffs)
    message += (
        "\nCompile this signature in CI (aot compile / aot warmup), or pass fallback=fn "
        "to aot.load to compile it on demand."
    )
    return SignatureNotFoundError(message, tuple(stored))


def pad_hint(table: ProgramTable, structure: str, got: tuple[LeafKey, ...]) -> str | None:
    """When the call differs from a stored signature only along one axis of some
    inputs (a batch size), the ``pad=`` that would serve it from that bucket.

    Only an axis padding could be right along: every input that differs differs
    along that same axis only, from one stored size ``B`` to one call size, every
    other dimension and dtype matches exactly, and every output of the stored
    program keeps that axis with size ``B`` (so ``pad=`` slices each of them back).
    A contracting or transposed axis fails the last rule (jax.jit raises on such a
    call; padding would return a wrong-shaped result), so it gets no suggestion.
    """
    best: tuple[bool, Program, int, dict[str, int]] | None = None
    for program in table.concrete.values():
        if program.structure != structure or len(program.leaves) != len(got):
            continue
        axes: set[int] = set()
        stored: set[int] = set()
        called: set[int] = set()
        heads: dict[str, int] = {}
        for path, (want, want_dtype, want_weak), (have, have_dtype, have_weak) in zip(
            program.paths, program.leaves, got
        ):
            if (want_dtype, want_weak, len(want)) != (have_dtype, have_weak, len(have)):
                break
            differ = [d for d, (a, b) in enumerate(zip(want, have)) if int(a) != int(b)]
            if len(differ) > 1:
                break
            if differ:
                axes.add(differ[0])
                stored.add(int(want[differ[0]]))
                called.add(int(have[differ[0]]))
                heads[path_head(path)] = differ[0]
        else:
            if len(axes) != 1 or len(stored) != 1 or len(called) != 1 or not heads:
                continue
            axis, size = next(iter(axes)), next(iter(stored))
            if not _outputs_keep(program, axis, size):
                continue
            fits = size > next(iter(called))
            if best is None or (fits and not best[0]):
                best = (fits, program, axis, heads)
    if best is None:
        return None
    _, program, axis, heads = best
    pad = "{" + ", ".join(f"{head!r}: {a}" for head, a in heads.items()) + "}"
    return (
        f"Only axis {axis} of {', '.join(heads)} differs from the stored ({program.signature}): "
        f"aot.load({table.name!r}, pad={pad}) pads such calls up to a stored size "
        "(docs/symbolic.md)."
    )


def _outputs_keep(program: Program, axis: int, size: int) -> bool:
    """Whether every output of ``program`` (per its manifest) has ``size`` along
    ``axis``; False when no stored row says what the outputs are."""
    for entry in (*program.local, *program.foreign, *program.quarantined):
        try:
            outs = entry.manifest_dict().get("out_avals")
        except (ValueError, TypeError):
            continue
        if not isinstance(outs, list) or not outs:
            continue
        shapes = [aval.get("shape") if isinstance(aval, dict) else None for aval in outs]
        return all(
            isinstance(shape, (list, tuple)) and len(shape) > axis and shape[axis] == size
            for shape in shapes
        )
    return False


def strict_symbolic_error(
    table: ProgramTable, program: SymbolicProgram, got: tuple[LeafKey, ...], values: dict[str, int],
) -> SignatureNotFoundError:
    """A symbolic program would serve the call, but ``strict=True`` forbids compiling."""
    concrete = sorted(p.signature for p in table.concrete.values())
    lines = [f"  {s}" for s in concrete] or ["  (none)"]
    bound = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
    return SignatureNotFoundError(
        f"{table.name}: no executable compiled for ({describe_keys(got)}). The symbolic "
        f"program ({program.signature}) would serve it ({bound}), but strict=True "
        "forbids compiling. Concrete signatures stored:\n" + "\n".join(lines)
        + "\nCompile this shape in CI (aot compile / aot warmup with concrete specs), or "
        "load with strict=False to compile it from the stored portable HLO.",
        tuple(concrete),
    )


def nearest(
    table: ProgramTable, args: Any, kwargs: Any, structure: str, got: tuple[LeafKey, ...],
) -> tuple[Program, list[str]] | None:
    """The stored program nearest to the call, and how it differs."""
    best: tuple[tuple[int, int], Program, list[str]] | None = None
    for program in table.concrete.values():
        if program.structure != structure or len(program.leaves) != len(got):
            diffs = structure_differences(program, args, kwargs)
            score: tuple[int, int] = (1000, 0)
        else:
            differing = [
                (path, want, have)
                for path, want, have in zip(program.paths, program.leaves, got)
                if want != have
            ]
            diffs = [
                f"{path}: stored {format_aval(*want)}, got {format_aval(*have)}"
                + (WEAK_HINT if want[2] != have[2] else "")
                for path, want, have in differing
            ]
            # Fewest differing leaves first, then the closest shapes (batch 8 is
            # nearer to the batch-4 bucket than to the batch-1 bucket).
            score = (len(diffs), sum(_distance(want, have) for _, want, have in differing))
        if best is None or score < best[0]:
            best = (score, program, diffs)
    return (best[1], best[2]) if best is not None else None


def structure_differences(program: Program, args: Any, kwargs: Any) -> list[str]:
    """Which arguments differ in pytree structure from a stored program's."""
    try:
        stored_args, stored_kwargs = program.treedef.children()
        arg_trees = stored_args.children()
    except (ValueError, AttributeError):
        return ["pytree structure"]
    names = _argument_names(program, arg_trees)
    diffs: list[str] = []
    if len(arg_trees) != len(args):
        diffs.append(f"pytree structure ({len(arg_trees)} positional arguments stored, {len(args)} given)")
    for i, (tree, value) in enumerate(zip(arg_trees, args)):
        got = jax.tree_util.tree_structure(value)
        if treedefs.structure_key(tree) != treedefs.structure_key(got):
            where = first_difference(tree, got, names[i])
            diffs.append(f"pytree structure of {names[i]}: " + (
                where if where is not None and where.split(":")[0] != names[i]
                else f"stored {describe_tree(tree)}, got {describe_value(value)}"
            ))
    stored_keys = list((stored_kwargs.node_data() or (None, []))[1] or [])
    if sorted(map(str, stored_keys)) != sorted(map(str, kwargs)):
        diffs.append(f"pytree structure of keyword arguments: stored {sorted(map(str, stored_keys))}, got {sorted(map(str, kwargs))}")
    return diffs or [f"pytree structure ({counted(len(program.leaves), 'leaf')} stored)"]


def first_difference(stored: PyTreeDef, got: PyTreeDef, path: str) -> str | None:
    """The first place where two structures differ, by its path
    (``params['Dense_1']['bias'] is missing``), or None when none is found."""
    node, other = stored.node_data(), got.node_data()
    if (node is None) != (other is None) or (node is not None and other is not None and node[0] is not other[0]):
        return f"{path}: stored {describe_tree(stored)}, got {describe_tree(got)}"
    if node is None or other is None:
        return None
    children, got_children = stored.children(), got.children()
    if node[0] is dict:
        mine = dict(zip(node[1], children))
        theirs = dict(zip(other[1], got_children))
        for key in sorted(mine, key=str):
            if key not in theirs:
                return f"{path}[{key!r}] is missing (stored {describe_tree(mine[key])})"
        for key in sorted(theirs, key=str):
            if key not in mine:
                return f"{path}[{key!r}] was not stored (got {describe_tree(theirs[key])})"
        pairs = [(f"{path}[{key!r}]", mine[key], theirs[key]) for key in sorted(mine, key=str)]
    elif len(children) != len(got_children):
        return f"{path}: stored {describe_tree(stored)}, got {describe_tree(got)}"
    else:
        pairs = [(f"{path}[{i}]", a, b) for i, (a, b) in enumerate(zip(children, got_children))]
    for child_path, a, b in pairs:
        if treedefs.structure_key(a) != treedefs.structure_key(b):
            return first_difference(a, b, child_path)
    return f"{path}: {describe_tree(stored)} with other auxiliary data"


def describe_tree(tree: PyTreeDef) -> str:
    """One short phrase for a stored pytree node (``a dict with keys [...]``)."""
    node = tree.node_data()
    if node is None:
        return "an array"
    cls, aux = node
    n = len(tree.children())
    if cls in (list, tuple):
        return f"a {cls.__name__} of {n} item{'s' if n != 1 else ''}"
    if cls is dict:
        return f"a dict with keys {sorted(map(str, aux))[:6]}"
    if cls is type(None):
        return "None"
    if cls is treedefs.Unresolved:
        return f"a {aux[0]}"
    return f"a {getattr(cls, '__qualname__', cls)}"


def describe_value(value: Any) -> str:
    """One short phrase for one argument: its aval, or what kind of pytree it is."""
    leaves, flat_tree = jax.tree_util.tree_flatten(value)
    tree: Any = flat_tree  # PyTreeDef's num_leaves / num_nodes are not in jaxlib's stubs
    if tree.num_leaves == 1 and tree.num_nodes == 1:
        try:
            return format_aval(*leaf_aval(leaves[0]))
        except TypeError:
            return _short(value)
    kind = describe_tree(tree)  # not a leaf: handled above
    if kind == "None":
        return kind
    if tree.num_leaves <= 4:
        try:
            return kind + " (" + ", ".join(format_aval(*leaf_aval(x)) for x in leaves) + ")"
        except TypeError:
            return kind
    return f"{kind} ({tree.num_leaves} leaves)"


def _argument_names(program: Program, arg_trees: Sequence[PyTreeDef]) -> list[str]:
    names, offset = [], 0
    for i, tree in enumerate(arg_trees):
        name = f"args[{i}]"
        if tree.num_leaves and offset < len(program.paths):
            path = program.paths[offset]
            placeholder = tree.unflatten(range(tree.num_leaves))
            inner = jax.tree_util.keystr(tuple(jax.tree_util.tree_flatten_with_path(placeholder)[0][0][0]))
            if path.endswith(inner) and len(path) > len(inner):
                name = path[: len(path) - len(inner)]
            elif not inner:
                name = path
        names.append(name)
        offset += tree.num_leaves
    return names


def _distance(want: LeafKey, have: LeafKey) -> int:
    (want_shape, want_dtype, _), (have_shape, have_dtype, _) = want, have
    if len(want_shape) != len(have_shape):
        return 1 << 40
    return sum(abs(a - b) for a, b in zip(want_shape, have_shape)) + (
        0 if want_dtype == have_dtype else 1 << 30
    )


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001
        text = "?"
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"a {type(value).__name__} ({text})"


def _render(key_path: Sequence[Any], names: Sequence[str] = ()) -> str:
    head, rest = key_path[:2], key_path[2:]
    if getattr(head[0], "idx", 0) == 0:
        position = getattr(head[1], "idx", 0)
        name = names[position] if position < len(names) else f"args[{position}]"
    else:
        name = str(getattr(head[1], "key", head[1]))
    return name + jax.tree_util.keystr(tuple(rest))

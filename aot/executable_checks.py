"""Cross-checks of a manifest with what only XLA or the portable HLO can confirm: the
per-device parameter and result shapes and dtypes of the deserialized executable,
the shardings XLA compiled for, its output memory kinds, and the avals and device
count of the portable HLO. The pure checks against the fingerprints are
:func:`aot.artifact.manifest_problems`. These need no ``pxla``, so ``aot verify``
runs them too; what they read of XLA goes through :mod:`aot.jaxcompat.checks`.
"""

from __future__ import annotations

from typing import Any

import jax

from aot.artifact import Manifest, parse_manifest_dtype
from aot.errors import AotError, CorruptArtifactError
from aot.executable import ArgAval, ExecutableInfo
from aot.jaxcompat.releases import same_release
from aot.jaxcompat.checks import (
    hlo_module_header,
    output_memory_kinds,
    output_shardings,
    parameter_shardings,
    physical_shape_text,
)
from aot.jaxcompat.shardings import hlo_sharding, hlo_sharding_from_proto, hlo_shardings_equal
from aot.specs import format_aval


def check_executable(manifest: Manifest, info: ExecutableInfo, xla_executable: Any) -> None:
    """Raises :class:`CorruptArtifactError` when the deserialized executable does not
    take or return what the manifest says (see :func:`executable_problems`)."""
    problems = executable_problems(manifest, info, xla_executable)
    if problems:
        raise CorruptArtifactError(
            f"manifest of {manifest.name!r} ({manifest.key[:12]}) does not describe its "
            f"executable: {'; '.join(problems)}. The index row was altered or the executable "
            "blob belongs to another program; it is not run. Run `aot verify` (it quarantines "
            "the entry) and recompile it (the loader does so from its portable HLO)"
        )


def executable_problems(manifest: Manifest, info: ExecutableInfo, xla_executable: Any) -> list[str]:
    """Where the executable's parameters and results (per-device shapes and dtypes,
    shardings, output memory kinds) differ from the manifest."""
    problems: list[str] = []
    # The constants JAX hoisted lead the executable's parameters (aot.constants).
    kept = [
        ArgAval(f"constants[{i}]", tuple(c.shape), c.dtype, False, True) for i, c in enumerate(info.constants)
    ] + [a for a in info.args if a.kept]
    in_shardings = [c.sharding for c in info.constants] + list(info.in_shardings)
    signature = _entry_signature(xla_executable)
    if signature is not None:
        params, results = signature
        if len(params) == 1 and isinstance(params[0], list) and len(kept) != 1:
            params = params[0]  # arguments passed as one tuple
        results = results if isinstance(results, list) else [results]
        if len(results) == 1 and isinstance(results[0], list) and len(info.out_avals) != 1:
            results = results[0]
        if len(params) != len(kept):
            problems.append(f"the executable takes {len(params)} arguments, the manifest keeps {len(kept)}")
        else:
            for i, (got, arg, sharding) in enumerate(zip(params, kept, in_shardings)):
                problems += _shape_problem(f"argument {arg.path!r}", got, arg.shape, arg.dtype, sharding)
        if len(results) != len(info.out_avals):
            problems.append(
                f"the executable returns {len(results)} values, the manifest has {len(info.out_avals)} out_avals"
            )
        else:
            for i, (got, aval, sharding) in enumerate(zip(results, info.out_avals, info.out_shardings)):
                problems += _shape_problem(f"out_avals[{i}]", got, tuple(aval.shape), aval.dtype, sharding)
    if len(info.device_ids) > 1:
        problems += _sharding_problems(
            "in_shardings", _per_value(parameter_shardings(xla_executable), len(kept)),
            in_shardings, [a.shape for a in kept],
        )
        problems += _sharding_problems(
            "out_shardings", _per_value(output_shardings(xla_executable), len(info.out_avals)),
            info.out_shardings, [tuple(a.shape) for a in info.out_avals],
        )
    memory_kinds = output_memory_kinds(xla_executable)
    if len(memory_kinds) == len(info.out_shardings):
        for i, (kind, stored) in enumerate(zip(memory_kinds, manifest.out_shardings)):
            claimed = stored.get("memory_kind")
            if claimed is not None and kind is not None and claimed != kind:
                problems.append(f"out_shardings[{i}] memory_kind {claimed!r} != the executable's {kind!r}")
    return problems


def _shape_problem(what: str, got: Any, shape: tuple[int, ...], dtype: Any, sharding: Any) -> list[str]:
    if isinstance(got, list):
        return [f"{what}: the executable has a tuple there"]
    try:
        local = _local_shape(tuple(shape), sharding)
    except Exception as exc:  # noqa: BLE001 - jax refuses the sharding for this shape
        return [f"{what}: the manifest's shape {list(shape)} does not fit its sharding ({exc})"]
    try:
        expected = _physical_shape(local, dtype)
    except Exception:  # noqa: BLE001 - a dtype XLA has no array shape for: nothing to compare
        return []
    if got == expected:
        return []
    return [f"{what} is {expected} per device in the manifest, {got} in the executable"]


def _physical_shape(shape: tuple[int, ...], dtype: Any) -> str:
    """How XLA shows an array of ``dtype`` (``s4[2,3]`` for int4): a typed-key array
    is its key data, ``key<fry>[4]`` is ``u32[4,2]``."""
    return _strip_layout(physical_shape_text(tuple(shape), dtype))


def _local_shape(shape: tuple[int, ...], sharding: Any) -> tuple[int, ...]:
    """The shape of one device's part, as XLA lays it out (padded when uneven)."""
    if sharding is None:
        return shape
    try:
        return tuple(sharding.shard_shape(shape))
    except ValueError:  # uneven: XLA pads each tile to ceil(dim / tiles)
        hlo = hlo_sharding(sharding, len(shape))
        tiles = list(hlo.tile_assignment_dimensions())[: len(shape)]
        if hlo.is_replicated() or len(tiles) != len(shape):
            raise
        return tuple(-(-d // t) for d, t in zip(shape, tiles))


def _sharding_problems(what: str, compiled: list[Any] | None, stored: Any, shapes: list[tuple[int, ...]]) -> list[str]:
    if compiled is None:
        return []
    if len(compiled) != len(stored):
        return [f"the executable has {len(compiled)} {what}, the manifest {len(stored)}"]
    problems = []
    for i, (op, sharding, shape) in enumerate(zip(compiled, stored, shapes)):
        try:
            got = hlo_sharding_from_proto(op)
            if got.is_manual() or 0 in shape:
                continue
            want = hlo_sharding(sharding, len(shape))
        except Exception as exc:  # noqa: BLE001 - a sharding jax cannot express for this rank
            problems.append(f"{what}[{i}] cannot be compared with the executable's: {exc}")
            continue
        if not hlo_shardings_equal(got, want):
            problems.append(f"{what}[{i}] is {want} in the manifest, {got} in the executable")
    return problems


def _per_value(shardings: list[Any] | None, count: int) -> list[Any] | None:
    if shardings is None:
        return None
    # XLA puts one sharding on the root tuple when all outputs share it.
    if len(shardings) == 1 and count > 1:
        shardings *= count
    return shardings


def _entry_signature(xla_executable: Any) -> tuple[list[Any], Any] | None:
    """The entry computation's parameter and result shapes (per device), from the
    first line of the HLO module's text; None where XLA does not tell."""
    first_line = hlo_module_header(xla_executable)
    if first_line is None:
        return None
    header = without_comments(first_line)  # long tuples carry /*index=N*/
    start = header.find("entry_computation_layout={")
    if start < 0:
        return None
    try:
        parser = _ShapeParser(header, start + len("entry_computation_layout={"))
        params = parser.shape()
        parser.expect("->")
        result = parser.shape()
    except ValueError:
        return None
    if not isinstance(params, list):
        return None
    return params, result


def without_comments(line: str) -> str:
    """``line`` without its ``/*...*/`` comments, as a non-greedy ``re.sub`` would
    remove them, without compiling a pattern in every serving process."""
    parts, pos = [], 0
    while (start := line.find("/*", pos)) >= 0 and (end := line.find("*/", start + 2)) >= 0:
        parts.append(line[pos:start])
        pos = end + 2
    parts.append(line[pos:])
    return "".join(parts)


class _ShapeParser:
    """Reads HLO shapes: ``f32[2,2]{1,0}`` -> ``"f32[2,2]"``, ``(a, b)`` -> a list."""

    def __init__(self, text: str, pos: int) -> None:
        self.text = text
        self.pos = pos

    def expect(self, token: str) -> None:
        if not self.text.startswith(token, self.pos):
            raise ValueError(f"expected {token!r} at {self.pos}")
        self.pos += len(token)

    def shape(self) -> Any:
        text = self.text
        if text.startswith("(", self.pos):
            self.pos += 1
            items = []
            while not text.startswith(")", self.pos):
                items.append(self.shape())
                if text.startswith(", ", self.pos):
                    self.pos += 2
                elif not text.startswith(")", self.pos):
                    raise ValueError(f"expected ',' or ')' at {self.pos}")
            self.pos += 1
            return items
        end = text.find("]", self.pos)
        if end < 0 or "[" not in text[self.pos : end]:
            raise ValueError(f"expected an array shape at {self.pos}")
        shape = text[self.pos : end + 1]
        self.pos = end + 1
        if text.startswith("{", self.pos):  # the layout: skip it, braces balanced
            depth = 0
            while self.pos < len(text):
                depth += {"{": 1, "}": -1}.get(text[self.pos], 0)
                self.pos += 1
                if depth == 0:
                    break
        return shape


def _strip_layout(shape: str) -> str:
    return shape.split("{", 1)[0]


def portable_hlo_problems(manifest: Manifest, hlo: bytes) -> list[str]:
    """Where the manifest's argument and output avals or device count differ from the
    portable HLO's (``jax.export``: public API, no XLA needed)."""
    # Imported here, as in hlo_avals: a serving process never reads a portable HLO
    # unless it recompiles.
    from aot.symbolic import check_dim_text

    try:
        exported = jax.export.deserialize(bytearray(hlo))
    except Exception as exc:  # noqa: BLE001
        if not same_release(manifest.jax_version):
            # Another release's export outside this one's window (aot.export_window):
            # not corruption, and that release's hosts still serve it.
            return []
        from aot.export_rules import judge

        verdict = judge(hlo, manifest.jax_version, jax.__version__)
        if verdict is not None and verdict.refused:
            # A format this release refuses (JAX 0.11.1+'s export rules): expired, not
            # corrupt; the executable still serves, `aot verify --jax-release` names it.
            return []
        return [f"the portable HLO cannot be read: {exc}"]
    problems: list[str] = []
    hlo_in, hlo_out = hlo_avals(manifest, exported)
    pairs = (
        ("args", [(a.get("shape"), a.get("dtype")) for a in manifest.args], hlo_in),
        ("out_avals", [(a.get("shape"), a.get("dtype")) for a in manifest.out_avals], hlo_out),
    )
    for what, stored, avals in pairs:
        try:
            # Dimensions as text: a symbolic entry's are expressions ("b", "2*b").
            mine = [
                (tuple(check_dim_text(d) if isinstance(d, str) else int(d) for d in _dims(shape)), parse_manifest_dtype(dtype))
                for shape, dtype in stored
            ]
        except (AotError, TypeError, ValueError) as exc:
            problems.append(f"{what} cannot be read: {exc}")
            continue
        theirs = avals
        if mine != theirs:
            problems.append(f"{what} ({avals_text(mine)}) != the portable HLO's ({avals_text(theirs)})")
    if exported.nr_devices != len(manifest.device_ids):
        problems.append(
            f"device_ids name {len(manifest.device_ids)} devices, the portable HLO was "
            f"exported for {exported.nr_devices}"
        )
    return problems


def hlo_avals(manifest: Manifest, exported: Any) -> tuple[list[Any], list[Any]]:
    """The portable HLO's input and output avals as ``(dims, dtype)``: symbolic
    dimensions as their text (``"b"``), or, for a concrete entry compiled from a
    symbolic one (which keeps the symbolic portable HLO), evaluated for the entry's
    argument shapes. Shapes that do not bind stay symbolic, so they compare unequal."""
    from aot.jaxcompat.shape_poly import shape_evaluator
    from aot.symbolic import bind, format_dim, is_symbolic_dim

    def as_text(avals: Any) -> list[Any]:
        return [
            (tuple(format_dim(d) if is_symbolic_dim(d) else int(d) for d in a.shape), a.dtype)
            for a in avals
        ]

    ins, outs = as_text(exported.in_avals), as_text(exported.out_avals)
    if manifest.is_symbolic or not any(isinstance(d, str) for dims, _ in ins for d in dims):
        return ins, outs
    try:
        shapes = [tuple(int(d) for d in a["shape"]) for a in manifest.args]
    except (KeyError, TypeError, ValueError):
        return ins, outs  # unreadable: the caller says so
    binding = bind([dims for dims, _ in ins], shapes)
    if not binding.ok:
        return ins, outs
    evaluator = shape_evaluator(binding.values or {})

    def concrete(avals: Any) -> list[Any]:
        return [
            (tuple(int(evaluator.evaluate(d)) if is_symbolic_dim(d) else int(d) for d in a.shape), a.dtype)
            for a in avals
        ]

    try:
        return concrete(exported.in_avals), concrete(exported.out_avals)
    except Exception:  # noqa: BLE001 - an expression jax cannot evaluate here
        return ins, outs


def avals_text(avals: Any) -> str:
    return ", ".join(format_aval(shape, dtype) for shape, dtype in avals) or "nothing"


def _dims(shape: Any) -> list[Any] | tuple[Any, ...]:
    """A stored shape: a JSON list (a tuple when built in this process)."""
    if not isinstance(shape, (list, tuple)):
        raise TypeError(f"the shape {shape!r} is not a list of dimensions")
    return shape

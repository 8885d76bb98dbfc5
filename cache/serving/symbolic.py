"""Serving a call from a stored symbolic signature (``f32[b,784]``).

A call whose shapes match no stored executable may still fit a shape-polymorphic
program: its portable HLO is compiled for the call's shapes (no tracing, no model
code), the executable is stored under the same name and filed as a concrete program,
so later calls of that shape are exact hits. ``strict=True`` refuses to compile.

Imported on the first miss of a name that has symbolic entries: serving exact
signatures never needs it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from aot.artifact import PORTABLE_HLO
from aot.errors import AotError, CorruptArtifactError, IntegrityError
from aot.recompile import compile_symbolic
from aot.rehydrate import load_executable
from aot.specs import dtype_to_str, format_aval
from aot.symbolic import bind

from aot.cache.serving.misses import describe_keys, strict_symbolic_error
from aot.cache.serving.programs import LeafKey, Program, ProgramTable, SymbolicProgram

if TYPE_CHECKING:
    from aot.cache.index.entry import IndexEntry
    from aot.executable import MeshExecutable

log = logging.getLogger(__name__)


def serve_symbolic(
    table: ProgramTable, structure: str, got: tuple[LeafKey, ...], notes: list[str],
) -> MeshExecutable | None:
    """The executable compiled for ``got`` from the first symbolic program it fits
    (filed in ``table`` under ``(structure, got)``), or None when none fits (why each
    did not is appended to ``notes``). ``strict=True`` raises instead of compiling."""
    for program in table.symbolic.values():
        if program.structure != structure or len(program.patterns) != len(got):
            continue
        wrong = [
            f"{path}: {format_aval(shape, have, have_weak)} is not "
            f"{'weakly typed ' if want_weak else ''}{dtype_to_str(want)}"
            for path, (want, want_weak), (shape, have, have_weak) in zip(program.paths, program.dtypes, got)
            if (want, want_weak) != (have, have_weak)
        ]
        if wrong:
            notes.append(f"Symbolic ({program.signature}) does not fit: {wrong[0]}")
            continue
        binding = bind(
            program.patterns, [shape for shape, _, _ in got], program.constraints,
            paths=program.paths,
        )
        if not binding.ok:
            notes.append(f"Symbolic ({program.signature}) does not fit: {binding.reason}")
            continue
        stats = table.cache.stats
        if table.strict:
            stats.missed(table.env, table.name, describe_keys(got), "a symbolic program fits; strict")
            raise strict_symbolic_error(table, program, got, binding.values or {})
        stats.missed(table.env, table.name, describe_keys(got), "compiled from a symbolic program")
        return _compile(table, program, structure, got, binding.values or {})
    return None


def _compile(
    table: ProgramTable, program: SymbolicProgram, structure: str, got: tuple[LeafKey, ...],
    values: dict[str, int],
) -> MeshExecutable:
    cache, name = table.cache, table.name
    with table.symbolic_lock:
        existing = table.concrete.get((structure, got))
        if existing is not None:  # another thread compiled it meanwhile
            return existing.executable or table.executable(existing)
        errors: list[str] = []
        for entry in program.entries:
            start = time.perf_counter()
            try:
                artifact = cache.artifact(entry, roles=(PORTABLE_HLO,))
                concrete = compile_symbolic(artifact, [shape for shape, _, _ in got])
                executable = load_executable(concrete, current=cache.environment)
            except IntegrityError:
                raise  # unsigned or tampered: never compiled from, and said as such
            except AotError as exc:
                errors.append(f"{entry.key[:12]}: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 - jax/XLA refusing the program
                errors.append(f"{entry.key[:12]}: {type(exc).__name__}: {exc}")
                continue
            bound = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
            log.warning(
                "%s: compiled (%s) from the symbolic portable HLO (%s; %s)", name,
                concrete.manifest.signature, program.signature, bound,
            )
            cache.stats.recompiled(
                table.env, name, concrete.manifest.signature,
                f"symbolic ({program.signature}) with {bound}", time.perf_counter() - start,
                after_miss=True,  # its miss was counted just before
            )
            stored: list[IndexEntry] = []
            if not cache.read_only:
                stored.append(cache.put_artifact(concrete))
            table.concrete[(structure, got)] = Program(
                concrete.manifest.signature, structure, program.treedef, got, program.paths,
                stored, [], [], executable,
            )
            return executable
        raise CorruptArtifactError(
            f"{name}: cannot compile ({describe_keys(got)}) from the symbolic "
            f"program ({program.signature}): " + "; ".join(errors)
        )

"""Serving: ``aot.load(name)`` -> a dispatcher over every stored signature of ``name``.

A call computes the input signature (pytree structure + shape/dtype per leaf), picks
the executable compiled for it and runs it. Nothing is traced or lowered and the
model's module is never imported. The fallback ladder for an executable that does not
fit this environment, or whose blob is corrupt: recompile from the stored portable HLO
and store the result; ``strict=True`` raises instead (fleets that must never compile).
"""

from __future__ import annotations

import difflib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.tree_util import PyTreeDef

from aot import treedef as treedefs
from aot.artifact import PORTABLE_HLO, Manifest, manifest_problems
from aot.rehydrate import compile_symbolic, load_executable, recompile
from aot.errors import (
    AotError,
    CacheError,
    CorruptArtifactError,
    IncompatibleEnvironmentError,
    IntegrityError,
    SignatureNotFoundError,
)
from aot.executable import MeshExecutable
from aot.fingerprint import describe_differences
from aot.specs import format_aval, parse_dtype
from aot.symbolic import bind, patterns_of
from aot.cache.cache import Cache, default_location, is_url
from aot.cache.entry import IndexEntry
from aot.cache.padding import PadPlan, fits, pad_leaf, rows, unpad_outputs
from aot.cache.signatures import describe_call, path_head

log = logging.getLogger(__name__)

LeafKey = tuple[tuple[int, ...], np.dtype]


@dataclass
class _Program:
    """One stored signature of a name: its rows for this and other environments, and
    quarantined rows (never executed; their portable HLO can still be recompiled)."""

    signature: str
    treedef: PyTreeDef
    leaves: tuple[LeafKey, ...]
    paths: tuple[str, ...]
    local: list[IndexEntry] = field(default_factory=list)
    foreign: list[IndexEntry] = field(default_factory=list)
    quarantined: list[IndexEntry] = field(default_factory=list)
    executable: MeshExecutable | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Statistics (aot.cache.stats): calls served, and how many were already flushed.
    calls: int = 0
    counted: int = 0


@dataclass
class _SymbolicProgram:
    """A stored shape-polymorphic signature of a name (``f32[b,784]``): its intact
    rows, newest first, any environment (portable HLO compiles anywhere)."""

    signature: str
    treedef: PyTreeDef
    patterns: tuple[tuple[int | str, ...], ...]
    dtypes: tuple[np.dtype, ...]
    paths: tuple[str, ...]
    constraints: tuple[str, ...]
    entries: list[IndexEntry] = field(default_factory=list)


_NO_MATCH = object()

_flatten = jax.tree_util.tree_flatten


def _leaf_key(leaf: Any) -> LeafKey:
    try:
        return (leaf.shape, leaf.dtype)
    except AttributeError:
        if isinstance(leaf, (bool, int, float, complex)):
            return ((), np.dtype(jax.dtypes.canonicalize_dtype(type(leaf))))
        return ((-1,), np.dtype("V"))  # matches nothing


class Dispatcher:
    """Calls the executable whose input signature matches the arguments."""

    def __init__(
        self,
        cache: Cache,
        name: str,
        *,
        strict: bool = False,
        fallback: Callable[..., Any] | None = None,
        pad: PadPlan | None = None,
    ) -> None:
        self.cache = cache
        self.name = name
        self.strict = strict
        self.fallback = fallback
        self.pad = pad
        self._programs: dict[tuple[PyTreeDef, tuple[LeafKey, ...]], _Program] = {}
        self._symbolic: dict[tuple[Any, ...], _SymbolicProgram] = {}
        self._symbolic_lock = threading.Lock()
        self._pad_axes: dict[PyTreeDef, dict[int, int]] = {}
        # (treedef, leaf keys) -> (bucket program, its size, rows): a request size seen
        # before skips the search.
        self._pad_choice: dict[tuple[PyTreeDef, tuple[LeafKey, ...]], tuple[_Program, int, int]] = {}
        # Rows this dispatcher could not place, for the start-up error: (entry, why).
        self.unusable: list[tuple[IndexEntry, str]] = []
        # Quarantined rows too: their executable is never run, but the signature stays
        # servable by recompiling their portable HLO (the fallback ladder).
        for entry in cache.entries_named(name, state=None):
            try:
                manifest = Manifest.from_json(entry.manifest)
                treedef = treedefs.from_json(manifest.in_tree)
            except AotError as exc:
                cache.quarantine(entry, f"unreadable manifest: {exc}")
                self.unusable.append((entry, f"unreadable manifest: {exc}"))
                continue
            if manifest.is_symbolic:
                self._add_symbolic(entry, manifest, treedef)
                continue
            problems = manifest_problems(manifest)
            if any(p.startswith("in_tree") for p in problems):
                # Its input structure cannot be trusted, so it cannot even be filed
                # under a signature; never served, never recompiled.
                reason = "manifest contradicts its fingerprints: " + "; ".join(problems)
                cache.quarantine(entry, reason)
                self.unusable.append((entry, reason))
                continue
            if problems and entry.ok and cache.quarantine(
                entry, "manifest contradicts its fingerprints: " + "; ".join(problems)
            ):
                entry = cache.reread(entry) or entry
            leaves = tuple(
                (tuple(int(d) for d in a["shape"]), parse_dtype(a["dtype"])) for a in manifest.args
            )
            program = self._programs.setdefault(
                (treedef, leaves),
                _Program(manifest.signature, treedef, leaves, tuple(str(a["path"]) for a in manifest.args)),
            )
            self._place(program, entry, front=True)
            # Rows come oldest first and are inserted at the front: the newest row of
            # a signature is tried first (a name recompiled from changed code must not
            # keep serving the old program).
        log.info(
            "aot.load(%r): %d signatures, %d symbolic", name, len(self._programs), len(self._symbolic)
        )
        self._env = cache.environment.digest
        cache.stats.watch(self, self._programs, self._env, name)
        if pad is not None:
            self._check_pad_paths()

    def _place(self, program: _Program, entry: IndexEntry, *, front: bool = False) -> None:
        """Files a row under local, foreign or quarantined by its state and environment."""
        if not entry.ok:
            bucket = program.quarantined
        elif entry.env_fp == self.cache.environment.digest:
            bucket = program.local
        else:
            bucket = program.foreign
        if front:
            bucket.insert(0, entry)
        else:
            bucket.append(entry)

    def servable(self) -> list[str]:
        """Signatures this dispatcher can serve: with a row for this environment, or
        (unless strict) with any row whose portable HLO can be recompiled, and (unless
        strict) symbolic signatures, compiled per concrete shape."""
        concrete = [
            p.signature for p in self._programs.values()
            if p.executable is not None or p.local
            or (not self.strict and (p.foreign or p.quarantined))
        ]
        symbolic = [] if self.strict else [p.signature for p in self._symbolic.values() if p.entries]
        return sorted(concrete + symbolic)

    # ------------------------------------------------------------ inspection

    @property
    def signatures(self) -> list[str]:
        """Every stored signature: concrete ones, and symbolic ones (``f32[b,784]``)."""
        return sorted(
            [p.signature for p in self._programs.values()]
            + [p.signature for p in self._symbolic.values()]
        )

    def __repr__(self) -> str:
        return f"Dispatcher({self.name!r}, {len(self.signatures)} signatures)"

    def warm(self, *, workers: int | None = None) -> Dispatcher:
        """Loads every signature now (in parallel threads: XLA releases the GIL)."""
        programs = [p for p in self._programs.values() if p.executable is None]
        if not programs:
            return self
        if len(programs) == 1 or workers == 1:
            for program in programs:
                self._executable(program)
            return self
        with ThreadPoolExecutor(max_workers=workers or min(8, len(programs))) as pool:
            list(pool.map(self._executable, programs))
        return self

    # ------------------------------------------------------------ calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, treedef = _flatten((args, kwargs))
        try:  # the common case, arrays only, without a Python call per leaf
            signature = tuple([(leaf.shape, leaf.dtype) for leaf in leaves])
        except AttributeError:
            signature = tuple(map(_leaf_key, leaves))
        program = self._programs.get((treedef, signature))
        if program is None:
            return self._miss(args, kwargs, leaves, treedef)
        program.calls += 1  # the only statistics on the call path (aot.cache.stats)
        executable = program.executable or self._executable(program)
        return executable.call_checked(args, kwargs)

    def _executable(self, program: _Program) -> MeshExecutable:
        with program.lock:
            if program.executable is None:
                program.executable = self._load(program)
            return program.executable

    def _load(self, program: _Program) -> MeshExecutable:
        problems: list[str] = []
        unusable: list[IndexEntry] = []  # rows of this environment that failed to load
        rereads = 0
        while program.local:
            entry = program.local[0]
            try:
                return self.cache.load(entry)  # not a use: the calls are (aot.cache.stats)
            except (CorruptArtifactError, IncompatibleEnvironmentError) as exc:
                program.local.remove(entry)
                # The row may have changed since this dispatcher read it (gc and a new
                # warm-up rewrite a key with fresh blobs): a stale snapshot must neither
                # condemn the fresh row nor hide it. Quarantine only the row that failed.
                fresh = self.cache.reread(entry)
                if fresh is not None and not _same_row(fresh, entry) and rereads < _MAX_REREADS:
                    rereads += 1
                    log.info(
                        "%s (%s): row %s changed since it was read (%s); using the row as it is now",
                        self.name, program.signature, entry.key[:12], exc,
                    )
                    self._place(program, fresh, front=True)
                    continue
                problems.append(str(exc))
                if fresh is None:
                    continue  # deleted meanwhile: nothing to quarantine
                if not self.cache.quarantine(entry, str(exc)) and not self.cache.read_only:
                    changed = self.cache.reread(entry)
                    if changed is not None and rereads < _MAX_REREADS:
                        rereads += 1
                        self._place(program, changed, front=True)
                        continue
                if isinstance(exc, CorruptArtifactError):
                    program.quarantined.append(entry)
                    if self.strict:
                        raise
                else:
                    # XLA refused the executable although the fingerprint matched: never
                    # try it again (quarantined, so the recompiled artifact replaces it).
                    unusable.append(entry)
        candidates = program.foreign + program.quarantined + unusable
        if not candidates:
            raise CorruptArtifactError(
                f"{self.name} ({program.signature}): no intact artifact is left "
                f"({'; '.join(problems) or 'its rows were deleted'}); recompile it "
                "(aot warmup / aot compile)"
            )
        if self.strict:
            if program.foreign or unusable:
                entry = program.foreign[0] if program.foreign else unusable[0]
                manifest = Manifest.from_json(entry.manifest)
                diffs = manifest.environment.diff(self.cache.environment)
                described = tuple(d.describe() for d in diffs) or tuple(problems)
                raise IncompatibleEnvironmentError(
                    f"{self.name} ({program.signature}): no executable for this environment "
                    f"and strict=True forbids compiling: {'; '.join(described)}. Compile it for "
                    "this environment in CI (aot warmup) or load with strict=False",
                    described,
                )
            reasons = "; ".join(problems) or "; ".join(
                f"{e.key[:12]}: {e.state_reason or 'quarantined'}" for e in program.quarantined
            )
            raise CorruptArtifactError(
                f"{self.name} ({program.signature}): the stored executable is quarantined "
                f"({reasons}) and strict=True forbids recompiling it. Run `aot verify`, "
                "recompile it (aot warmup / aot compile) or load with strict=False"
            )
        return self._recompile(program, candidates)

    def _recompile(self, program: _Program, candidates: Sequence[IndexEntry]) -> MeshExecutable:
        errors: list[str] = []
        environment = self.cache.environment
        pending = list(candidates)
        rereads = 0
        while pending:
            entry = pending.pop(0)
            start = time.perf_counter()
            try:
                # Only the portable HLO is needed: the executable blob may be corrupt.
                artifact = self.cache.artifact(entry, roles=(PORTABLE_HLO,))
                manifest = artifact.manifest
                diffs = manifest.environment.diff(environment)
                rebuilt = recompile(artifact)
                executable = load_executable(rebuilt, current=environment)
            except IntegrityError:
                raise  # unsigned or tampered: never compiled from, and said as such
            except AotError as exc:
                fresh = self.cache.reread(entry)
                if fresh is not None and not _same_row(fresh, entry) and rereads < _MAX_REREADS:
                    rereads += 1  # a stale snapshot: try the row as it is now, first
                    if fresh.ok and fresh.env_fp == environment.digest:
                        try:
                            return self.cache.load(fresh)
                        except AotError as again:
                            errors.append(f"{fresh.key[:12]}: {again}")
                    pending.insert(0, fresh)
                    continue
                errors.append(f"{entry.key[:12]}: {exc}")
                continue
            reason = describe_differences(diffs) or f"stored executable unusable: {entry.state_reason}"
            log.warning("%s (%s): recompiled from portable HLO (%s)", self.name, program.signature, reason)
            self.cache.stats.recompiled(
                self._env, self.name, program.signature, reason, time.perf_counter() - start
            )
            if not self.cache.read_only:
                # Replaces a quarantined row of the same key; rewrites corrupt blobs.
                stored = self.cache.put_artifact(rebuilt)
                program.local.append(stored)
            return executable
        raise CorruptArtifactError(
            f"{self.name} ({program.signature}): cannot recompile from portable HLO: "
            + "; ".join(errors)
        )

    def _miss(self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef) -> Any:
        notes: list[str] = []
        if self.pad is not None:
            result = self._padded_call(leaves, treedef, notes)
            if result is not _NO_MATCH:
                return result
        if self._symbolic:
            result = self._symbolic_call(args, kwargs, leaves, treedef, notes)
            if result is not _NO_MATCH:
                return result
        if self.fallback is not None:
            log.warning(
                "aot.load(%r): no stored signature for (%s); compiling with the fallback",
                self.name, _describe(leaves),
            )
            self.cache.stats.missed(self._env, self.name, _describe(leaves), "compiled by the fallback")
            result = self.cache.compile_entry(self.fallback, *args, name=self.name, **kwargs)
            executable = result.executable
            key = (treedef, tuple(map(_leaf_key, leaves)))
            self._programs[key] = _Program(
                executable.signature, treedef, key[1],
                tuple(a.path for a in executable.info.args), [result.entry], [], executable,
            )
            return executable(*args, **kwargs)
        self.cache.stats.missed(self._env, self.name, _describe(leaves), "no stored signature")
        raise self._not_found(leaves, treedef, notes, args, kwargs)

    def _not_found(
        self, leaves: list[Any], treedef: PyTreeDef, notes: Sequence[str] = (),
        args: Any = (), kwargs: Any = None,
    ) -> SignatureNotFoundError:
        got = tuple(map(_leaf_key, leaves))
        stored = self.signatures
        lines = [f"  {s}" for s in stored] or ["  (none: nothing is stored under this name here)"]
        # Per argument, by name: a list of 1000 floats is one phrase, not 1000 leaves.
        call = describe_call(args, kwargs or {}, self._arg_names()) if args or kwargs else _describe(leaves)
        message = (
            f"{self.name}: no executable compiled for ({call}).\n"
            f"Stored signatures:\n" + "\n".join(lines)
        )
        for note in notes:
            message += f"\n{note}"
        nearest = self._nearest(treedef, got)
        if nearest is not None:
            program, diffs = nearest
            message += f"\nNearest: ({program.signature}); differs in " + ", ".join(diffs)
        message += (
            "\nCompile this signature in CI (aot compile / aot warmup), or pass fallback=fn "
            "to aot.load to compile it on demand."
        )
        return SignatureNotFoundError(message, tuple(stored))

    def _arg_names(self) -> list[str]:
        """The positional parameter names, from the stored leaf paths."""
        names: list[str] = []
        for program in self._programs.values():
            for path in program.paths:
                head = path_head(path)
                if head not in names:
                    names.append(head)
            break
        return names

    def _nearest(
        self, treedef: PyTreeDef, got: tuple[LeafKey, ...]
    ) -> tuple[_Program, list[str]] | None:
        best: tuple[tuple[int, int], _Program, list[str]] | None = None
        for program in self._programs.values():
            if program.treedef != treedef or len(program.leaves) != len(got):
                diffs = [f"pytree structure ({len(program.leaves)} leaves vs {len(got)})"]
                score: tuple[int, int] = (1000, 0)
            else:
                differing = [
                    (path, want, have)
                    for path, want, have in zip(program.paths, program.leaves, got)
                    if want != have
                ]
                diffs = [
                    f"{path}: stored {format_aval(*want)}, got {format_aval(*have)}"
                    for path, want, have in differing
                ]
                # Fewest differing leaves first, then the closest shapes (batch 8 is
                # nearer to the batch-4 bucket than to the batch-1 bucket).
                score = (len(diffs), sum(_distance(want, have) for _, want, have in differing))
            if best is None or score < best[0]:
                best = (score, program, diffs)
        return (best[1], best[2]) if best is not None else None


    # ------------------------------------------------------------ symbolic shapes

    def _add_symbolic(self, entry: IndexEntry, manifest: Manifest, treedef: PyTreeDef) -> None:
        if not entry.ok:  # its portable HLO is what is damaged: nothing to compile from
            log.warning("%s (%s): symbolic entry %s is quarantined: %s", self.name,
                        manifest.signature, entry.key[:12], entry.state_reason)
            return
        patterns = patterns_of(manifest.args)
        dtypes = tuple(parse_dtype(a["dtype"]) for a in manifest.args)
        key = (treedef, patterns, dtypes, manifest.symbolic_constraints)
        program = self._symbolic.setdefault(key, _SymbolicProgram(
            manifest.signature, treedef, patterns, dtypes,
            tuple(str(a["path"]) for a in manifest.args), manifest.symbolic_constraints,
        ))
        # Newest first; this environment's rows before others (same portable HLO kind).
        program.entries.insert(0, entry)
        program.entries.sort(key=lambda e: e.env_fp != self.cache.environment.digest)

    def _symbolic_call(
        self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef, notes: list[str],
    ) -> Any:
        """Serves a call with no stored executable from a symbolic signature: compiles
        its portable HLO for these shapes (no tracing, no model code), stores the
        executable under the same name, and runs it. ``strict=True`` refuses."""
        got = tuple(map(_leaf_key, leaves))
        for program in self._symbolic.values():
            if program.treedef != treedef or len(program.patterns) != len(got):
                continue
            wrong = [
                f"{path}: {format_aval(shape, have)} is not {np.dtype(want).name}"
                for path, want, (shape, have) in zip(program.paths, program.dtypes, got)
                if np.dtype(want) != np.dtype(have)
            ]
            if wrong:
                notes.append(f"Symbolic ({program.signature}) does not fit: {wrong[0]}")
                continue
            binding = bind(
                program.patterns, [shape for shape, _ in got], program.constraints,
                paths=program.paths,
            )
            if not binding.ok:
                notes.append(f"Symbolic ({program.signature}) does not fit: {binding.reason}")
                continue
            if self.strict:
                self.cache.stats.missed(
                    self._env, self.name, _describe(leaves), "a symbolic program fits; strict"
                )
                raise self._strict_symbolic_error(program, got, binding.values or {})
            self.cache.stats.missed(self._env, self.name, _describe(leaves), "compiled from a symbolic program")
            executable = self._compile_symbolic(program, treedef, got, binding.values or {})
            return executable.call_checked(args, kwargs)
        return _NO_MATCH

    def _strict_symbolic_error(
        self, program: _SymbolicProgram, got: tuple[LeafKey, ...], values: dict[str, int]
    ) -> SignatureNotFoundError:
        concrete = sorted(p.signature for p in self._programs.values())
        lines = [f"  {s}" for s in concrete] or ["  (none)"]
        bound = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
        return SignatureNotFoundError(
            f"{self.name}: no executable compiled for ({_describe_keys(got)}). The symbolic "
            f"program ({program.signature}) would serve it ({bound}), but strict=True "
            "forbids compiling. Concrete signatures stored:\n" + "\n".join(lines)
            + "\nCompile this shape in CI (aot compile / aot warmup with concrete specs), or "
            "load with strict=False to compile it from the stored portable HLO.",
            tuple(concrete),
        )

    def _compile_symbolic(
        self, program: _SymbolicProgram, treedef: PyTreeDef, got: tuple[LeafKey, ...],
        values: dict[str, int],
    ) -> MeshExecutable:
        with self._symbolic_lock:
            existing = self._programs.get((treedef, got))
            if existing is not None:  # another thread compiled it meanwhile
                return existing.executable or self._executable(existing)
            errors: list[str] = []
            for entry in program.entries:
                start = time.perf_counter()
                try:
                    artifact = self.cache.artifact(entry, roles=(PORTABLE_HLO,))
                    concrete = compile_symbolic(artifact, [shape for shape, _ in got])
                    executable = load_executable(concrete, current=self.cache.environment)
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
                    "%s: compiled (%s) from the symbolic portable HLO (%s; %s)", self.name,
                    concrete.manifest.signature, program.signature, bound,
                )
                self.cache.stats.recompiled(
                    self._env, self.name, concrete.manifest.signature,
                    f"symbolic ({program.signature}) with {bound}", time.perf_counter() - start,
                )
                stored: list[IndexEntry] = []
                if not self.cache.read_only:
                    stored.append(self.cache.put_artifact(concrete))
                self._programs[(treedef, got)] = _Program(
                    concrete.manifest.signature, treedef, got, program.paths, stored, [], [],
                    executable,
                )
                return executable
            raise CorruptArtifactError(
                f"{self.name}: cannot compile ({_describe_keys(got)}) from the symbolic "
                f"program ({program.signature}): " + "; ".join(errors)
            )

    # ------------------------------------------------------------ padding

    def _check_pad_paths(self) -> None:
        """Every padded path must name an input of the stored programs (at load time)."""
        assert self.pad is not None
        programs = list(self._programs.values()) + list(self._symbolic.values())
        if programs:
            self.pad.axes_for(sorted({p for program in programs for p in program.paths}))

    def _padded_call(self, leaves: list[Any], treedef: PyTreeDef, notes: list[str]) -> Any:
        """Pads the declared inputs up to the smallest stored bucket that fits.

        No bucket large enough: refused, naming the largest; unless a symbolic entry
        may serve the exact shape (``strict=False``), which is then tried.
        """
        assert self.pad is not None
        got = tuple(map(_leaf_key, leaves))
        choice = self._pad_choice.get((treedef, got))
        if choice is None:
            choice = self._choose_bucket(leaves, treedef, got, notes)
            if choice is None:
                return _NO_MATCH
            self._pad_choice[(treedef, got)] = choice
        program, size, n = choice
        axes = self._pad_axes[treedef]
        padded = [
            pad_leaf(leaf, axes[i], size, self.pad.value) if i in axes else leaf
            for i, leaf in enumerate(leaves)
        ]
        args, kwargs = jax.tree_util.tree_unflatten(treedef, padded)
        program.calls += 1
        executable = program.executable or self._executable(program)
        out = executable.call_checked(args, kwargs)
        return unpad_outputs(out, self.pad, size, n)

    def _choose_bucket(
        self, leaves: list[Any], treedef: PyTreeDef, got: tuple[LeafKey, ...], notes: list[str],
    ) -> tuple[_Program, int, int] | None:
        assert self.pad is not None
        candidates = [p for p in self._programs.values() if p.treedef == treedef]
        if not candidates:
            return None
        axes = self._pad_axes.get(treedef)
        if axes is None:
            axes = self._pad_axes[treedef] = self.pad.axes_for(candidates[0].paths)
        n = rows(leaves, got, axes)
        sizes = [(fits(p.leaves, got, axes, n), p) for p in candidates]
        usable = [(size, p) for size, p in sizes if size is not None]
        if not usable:
            return None  # other dimensions or dtypes differ: not a padding question
        large = [(size, p) for size, p in usable if size >= n]
        if not large:
            largest, program = max(usable, key=lambda pair: pair[0])
            message = (
                f"{n} rows do not fit any stored bucket: the largest is {largest} "
                f"({program.signature})"
            )
            if self._symbolic and not self.strict:
                notes.append(f"Padding: {message}.")
                return None
            raise SignatureNotFoundError(
                f"{self.name}: {message}. Compile a bucket of at least {n} rows "
                "(aot compile / aot warmup), or split the request.",
                tuple(sorted(p.signature for _, p in usable)),
            )
        size, program = min(large, key=lambda pair: pair[0])
        return program, size, n


def _describe_keys(keys: Sequence[LeafKey]) -> str:
    return ", ".join(format_aval(shape, dtype) for shape, dtype in keys)


_MAX_REREADS = 4  # rows rewritten again and again while one call loads: give up


def _same_row(a: IndexEntry, b: IndexEntry) -> bool:
    """The same version of a row: same blobs, same manifest."""
    return (a.exe_digest, a.hlo_digest, a.manifest) == (b.exe_digest, b.hlo_digest, b.manifest)


def _distance(want: LeafKey, have: LeafKey) -> int:
    (want_shape, want_dtype), (have_shape, have_dtype) = want, have
    if len(want_shape) != len(have_shape):
        return 1 << 40
    return sum(abs(a - b) for a, b in zip(want_shape, have_shape)) + (
        0 if want_dtype == have_dtype else 1 << 30
    )


def _describe(leaves: Sequence[Any]) -> str:
    parts = []
    for leaf in leaves:
        shape, dtype = _leaf_key(leaf)
        parts.append(format_aval(shape, dtype) if dtype.kind != "V" else type(leaf).__name__)
    return ", ".join(parts)


def load(
    name: str,
    cache: Cache | str | None = None,
    *,
    strict: bool = False,
    lazy: bool = False,
    fallback: Callable[..., Any] | None = None,
    read_only: bool | None = None,
    pad: Mapping[str, int] | None = None,
    pad_outputs: int | Mapping[str, int] | None = None,
    pad_value: Any = 0,
    allow_empty: bool = False,
) -> Dispatcher:
    """A callable over every signature stored for ``name`` in this environment.

    ``lazy=False`` (the default) loads every signature now, in parallel, so the first
    request runs at full speed; ``lazy=True`` loads each on its first call.

    A call whose shapes match no stored executable is served, in this order: by
    padding (with ``pad=``) up to the smallest stored bucket that fits; by compiling
    a stored symbolic signature (``f32[b,784]``) for its shapes, stored back under
    ``name`` (not with ``strict=True``); by ``fallback``; else
    :class:`SignatureNotFoundError`.

    ``pad={"x": 0}`` pads input ``x`` along axis 0 and slices the outputs back (see
    :mod:`aot.cache.padding` for the rules). It declares that rows along that axis
    are independent (no batch norm, no reduction across the batch): jax-aot cannot
    check that without the model.

    Fails fast, at start-up, never on the first request: a location that holds no
    cache is a :class:`CacheError` (nothing is created there), and a name with no
    servable signature (none for this environment under ``strict=True``) is a
    :class:`SignatureNotFoundError` naming close names and the entries stored for
    other environments. ``allow_empty=True`` (or a ``fallback``, which compiles
    missing signatures on demand) starts anyway. ``read_only=None`` opens a folder
    read-only when this process cannot write it.
    """
    plan = PadPlan.of(pad, pad_outputs, pad_value) if pad is not None else None
    owned = not isinstance(cache, Cache)
    if owned:
        cache = open_existing(cache, read_only=read_only)
    assert isinstance(cache, Cache)
    try:
        dispatcher = Dispatcher(cache, name, strict=strict, fallback=fallback, pad=plan)
        if not allow_empty and fallback is None and not dispatcher.servable():
            raise _nothing_servable(cache, name, dispatcher)
        if not lazy:
            dispatcher.warm()
    except BaseException:
        if owned:
            cache.close()
        raise
    return dispatcher


def open_existing(location: str | os.PathLike[str] | None, *, read_only: bool | None = None) -> Cache:
    """Opens the cache at ``location`` for serving; never creates one.

    ``read_only=None``: a folder this process cannot write (another user's) is opened
    read-only; a database URL is opened read-write.
    """
    location = str(location) if location is not None else default_location()
    advice = (
        "aot.load never creates a cache: check the path (or AOT_CACHE), or fill the "
        "cache first (aot warmup / aot compile / aot bundle import)"
    )
    if is_url(location):
        if not read_only:
            from aot.cache.index import Index

            try:  # a read-only open creates nothing; a writable one would create the schema
                Index(location, read_only=True).close()
            except CacheError as exc:
                raise CacheError(f"{exc}. {advice}") from None
        return Cache(location, read_only=bool(read_only))
    folder = Path(location).expanduser()
    index = folder / "index.sqlite"
    if not index.is_file():
        raise CacheError(f"no cache at {folder} (no index.sqlite there); {advice}")
    if read_only is None:
        writable = os.access(folder, os.W_OK) and os.access(index, os.W_OK)
        if not writable:
            log.info("aot.load: %s is not writable by this process; serving it read-only", folder)
        read_only = not writable
    return Cache(location, read_only=read_only)


def _nothing_servable(cache: Cache, name: str, dispatcher: Dispatcher) -> SignatureNotFoundError:
    where = f"the cache at {cache.display_location}"
    lines: list[str] = []
    environment = cache.environment
    programs = list(dispatcher._programs.values())
    for program in programs:
        for entry in program.foreign:
            try:
                manifest = Manifest.from_json(entry.manifest)
            except AotError:
                continue
            diffs = manifest.environment.diff(environment)
            lines.append(
                f"  ({program.signature}) {entry.key[:12]} compiled for another environment: "
                + (describe_differences(diffs) or "environment differs")
            )
        for entry in program.quarantined:
            lines.append(
                f"  ({program.signature}) {entry.key[:12]} quarantined: "
                f"{(entry.state_reason or 'no reason recorded')[:200]}"
            )
    for entry, reason in dispatcher.unusable:
        lines.append(f"  ({entry.signature}) {entry.key[:12]} unusable: {reason[:200]}")
    if programs or dispatcher.unusable:
        head = (
            f"aot.load({name!r}): no signature of {name!r} in {where} can be served here"
            + (" with strict=True (it never compiles)" if dispatcher.strict else "")
            + ". Stored:\n" + "\n".join(lines)
        )
        advice = (
            "Compile it for this environment in CI (aot warmup / aot compile)"
            + (", or load with strict=False to recompile from the portable HLO" if dispatcher.strict else "")
        )
    else:
        try:
            names = cache.names()
        except AotError:
            names = []
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
        head = f"aot.load({name!r}): nothing is stored under {name!r} in {where}"
        if close:
            head += f". Did you mean {', '.join(repr(n) for n in close)}?"
        elif names:
            head += f" ({len(names)} other names are: `aot ls` lists them)"
        else:
            head += " (the cache is empty)"
        advice = "Compile it in CI (aot warmup / aot compile)"
    message = (
        f"{head}\n{advice}, or pass allow_empty=True to start without it "
        "(fallback=fn compiles missing signatures on demand)."
    )
    return SignatureNotFoundError(message, tuple(dispatcher.signatures))

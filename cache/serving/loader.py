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
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
from jax.tree_util import PyTreeDef

from aot import treedef as treedefs
from aot.artifact import PORTABLE_HLO, Manifest, json_part, manifest_problems, parse_manifest_dtype
from aot.jaxcompat.dispatch import dispatch_function, first_call
from aot.recompile import compile_symbolic, recompile
from aot.rehydrate import load_executable, manifest_args
from aot.errors import (
    AotError,
    AvalMismatchError,
    CacheError,
    CorruptArtifactError,
    IncompatibleEnvironmentError,
    IntegrityError,
    SignatureNotFoundError,
    UsageError,
)
from aot.executable import (
    FAST_CACHE_LIMIT,
    JAX_ARRAY,
    Binding,
    MeshExecutable,
    call_key,
    placement_error,
)
from aot.fingerprint import describe_differences
from aot.records import Record
from aot.specs import dtype_to_str, format_aval, leaf_aval
from aot.cache.cache import Cache, default_location, is_url
from aot.cache.index.entry import INDEX_FILE, IndexEntry

# Imported where used: serving an exact signature needs none of them (padding, symbolic
# shapes, background loading, and the wording of a miss), and a serving process's
# start-up is part of what it is measured by.
if TYPE_CHECKING:
    from aot.cache.serving.background import BackgroundLoad
    from aot.cache.serving.padding import PadPlan

log = logging.getLogger(__name__)

# (shape, dtype, weak_type) of one input, as jax.jit sees it.
LeafKey = tuple[tuple[int, ...], Any, bool]


# The records below are internal to this module and not dataclasses: generating a
# dataclass's methods costs ~0.5 ms per class at import, paid by every serving process
# at start-up (issue 15).


class _Program:
    """One stored signature of a name: its rows for this and other environments, and
    quarantined rows (never executed; their portable HLO can still be recompiled)."""

    __slots__ = (
        "signature", "structure", "treedef", "leaves", "paths", "local", "foreign",
        "quarantined", "executable", "lock", "calls", "counted",
    )

    def __init__(
        self,
        signature: str,
        structure: str,  # treedef.structure_key of the inputs
        treedef: PyTreeDef,  # the input structure (stand-ins for nodes not rebuildable here)
        leaves: tuple[LeafKey, ...],
        paths: tuple[str, ...],
        local: list[IndexEntry] | None = None,
        foreign: list[IndexEntry] | None = None,
        quarantined: list[IndexEntry] | None = None,
        executable: MeshExecutable | None = None,
    ) -> None:
        self.signature = signature
        self.structure = structure
        self.treedef = treedef
        self.leaves = leaves
        self.paths = paths
        self.local: list[IndexEntry] = [] if local is None else local
        self.foreign: list[IndexEntry] = [] if foreign is None else foreign
        self.quarantined: list[IndexEntry] = [] if quarantined is None else quarantined
        self.executable = executable
        self.lock = threading.Lock()
        # Statistics (aot.cache.serving.stats): calls served, and how many were already flushed.
        self.calls = 0
        self.counted = 0

    def __repr__(self) -> str:
        return f"_Program({self.signature!r}, loaded={self.executable is not None})"


class _SymbolicProgram:
    """A stored shape-polymorphic signature of a name (``f32[b,784]``): its intact
    rows, newest first, any environment (portable HLO compiles anywhere)."""

    __slots__ = ("signature", "structure", "treedef", "patterns", "dtypes", "paths", "constraints", "entries")

    def __init__(
        self,
        signature: str,
        structure: str,  # treedef.structure_key of the inputs
        treedef: PyTreeDef,
        patterns: tuple[tuple[int | str, ...], ...],
        dtypes: tuple[tuple[Any, bool], ...],  # (dtype, weak_type) per input
        paths: tuple[str, ...],
        constraints: tuple[str, ...],
    ) -> None:
        self.signature = signature
        self.structure = structure
        self.treedef = treedef
        self.patterns = patterns
        self.dtypes = dtypes
        self.paths = paths
        self.constraints = constraints
        self.entries: list[IndexEntry] = []

    def __repr__(self) -> str:
        return f"_SymbolicProgram({self.signature!r}, {len(self.entries)} entries)"


class _Kind(Record):
    """A kind of call already served: ``fn(*leaves)`` runs it (a bound executable's
    C++ call, or a padded call), ``program`` counts it; ``plain`` when JAX's C++
    dispatch may serve it (not padded)."""

    __slots__ = ("fn", "program", "plain")
    fn: Callable[..., Any]
    program: _Program
    plain: bool

    def __init__(self, fn: Callable[..., Any], program: _Program, plain: bool) -> None:
        self._set(fn, program, plain)


_NO_MATCH = object()

_flatten = jax.tree_util.tree_flatten


class _Uncounted:
    """Where the C++ dispatch counts calls before it serves a program (each such
    call is a cache miss, counted again on the program that serves it)."""

    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls = 0


def _miss_of(dispatcher: Dispatcher) -> Callable[..., Any]:
    """The C++ dispatch's cache miss, without a reference cycle (a dispatcher's
    statistics are written when it is collected)."""
    ref = weakref.ref(dispatcher)

    def cache_miss(*args: Any, **kwargs: Any) -> tuple[Any, Any, bool]:
        live = ref()
        if live is None:  # pragma: no cover - the C++ function outlived its dispatcher
            raise ReferenceError("this aot.load dispatcher was garbage-collected")
        return live._cpp_miss(*args, **kwargs)

    return cache_miss


def _leaf_key(leaf: Any) -> LeafKey:
    """The key of one call input, canonicalized as jax.jit does; ``TypeError`` for
    what jax.jit refuses (a string, an object)."""
    return leaf_aval(leaf)


class Dispatcher:
    """Calls the executable whose input signature matches the arguments.

    Calls run through JAX's own C++ dispatch (the ``PjitFunction`` behind
    ``jax.jit``), which caches each signature it has seen with the executable that
    served it; the Python path runs once per signature: it matches the structure by
    digest, canonicalizes NumPy and Python inputs as jax.jit does, checks the avals,
    loads, and picks a padding bucket (padded calls stay in Python). Statistics count
    each program's calls exactly (:mod:`aot.cache.serving.stats`), and C++ cannot say which
    program served a call, so the C++ dispatch serves one program per dispatcher: once
    a second one is called, calls select their program in Python (a tuple of the
    inputs' avals and one dict lookup; a flatten when there are pytrees or keywords).

    ``strict=True`` never writes to the cache: a row it finds damaged is logged and
    refused, not quarantined (``aot verify`` does that).
    """

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
        self._programs: dict[tuple[str, tuple[LeafKey, ...]], _Program] = {}
        # Kinds of call already served: by (caller treedef, call_key of its leaves),
        # and by the avals of positional arrays; structure keys per caller treedef.
        self._fast: dict[tuple[PyTreeDef, tuple[Any, ...]], _Kind] = {}
        self._positional: dict[tuple[Any, ...], _Kind] = {}
        # JAX's C++ dispatch and the one program it serves (class docstring), which
        # counts its calls; a throw-away counter until a program is served, None once
        # calls are selected in Python.
        self._cpp = dispatch_function(name, _miss_of(self))
        self._cpp_sink: _Program | _Uncounted | None = _Uncounted()
        self._structures: dict[PyTreeDef, str] = {}
        self._symbolic: dict[tuple[Any, ...], _SymbolicProgram] = {}
        self._symbolic_lock = threading.Lock()
        self._pad_axes: dict[str, dict[int, int]] = {}
        # Background loading (load(background=True)): the running load, the programs
        # whose load was started (by it or by a call), and the errors it met, each
        # raised by the first call of its program (by id: programs are never dropped).
        self._background: BackgroundLoad[_Program] | None = None
        self._attempted: set[int] = set()
        self._failed: dict[int, Exception] = {}
        # Rows this dispatcher could not place, for the start-up error: (entry, why).
        self.unusable: list[tuple[IndexEntry, str]] = []
        # Entries that cannot serve in this process (other x64 mode, platform or
        # devices, a dtype this jax lacks): (key, signature, reason), never quarantined.
        self.skipped: list[tuple[str, str, str]] = []
        environment = cache.environment
        # Quarantined rows too: their executable is never run, but the signature stays
        # servable by recompiling their portable HLO (the fallback ladder).
        for entry in cache.entries_named(name, state=None):
            try:
                manifest = Manifest.from_json(entry.manifest)
                reason = _cannot_serve_here(manifest, environment.as_dict())
                if reason is None:
                    structure = treedefs.structure_key_of_json(manifest.in_tree)
                    treedef = treedefs.from_json(manifest.in_tree, standins=True)
                    # Dtypes this jax may lack (IncompatibleEnvironmentError).
                    args = () if manifest.is_symbolic else manifest_args(manifest)
                    dtypes = tuple(
                        (parse_manifest_dtype(a["dtype"]), bool(a.get("weak_type", False))) for a in manifest.args
                    )
            except IncompatibleEnvironmentError as exc:
                reason = str(exc)
            except AotError as exc:
                self._quarantine(entry, f"unreadable manifest: {exc}")
                self.unusable.append((entry, f"unreadable manifest: {exc}"))
                continue
            if reason is not None:
                log.warning("aot.load(%r): skipping %s (%s): %s", name, entry.key[:12], entry.signature, reason)
                self.skipped.append((entry.key, entry.signature, reason))
                continue
            if manifest.is_symbolic:
                self._add_symbolic(entry, manifest, structure, treedef, dtypes)
                continue
            problems = manifest_problems(manifest)
            if any(p.startswith("in_tree") for p in problems):
                # Its input structure cannot be trusted, so it cannot even be filed
                # under a signature; never served, never recompiled.
                reason = "manifest contradicts its fingerprints: " + "; ".join(problems)
                self._quarantine(entry, reason)
                self.unusable.append((entry, reason))
                continue
            if problems and entry.ok and self._quarantine(
                entry, "manifest contradicts its fingerprints: " + "; ".join(problems)
            ):
                entry = cache.reread(entry) or entry
            leaves = tuple((a.shape, a.dtype, a.weak_type) for a in args)
            program = self._programs.setdefault(
                (structure, leaves),
                _Program(manifest.signature, structure, treedef, leaves, tuple(a.path for a in args)),
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

    def _quarantine(self, entry: IndexEntry, reason: str) -> bool:
        """Quarantines ``entry`` while its row is still as read (compare-and-set);
        True when it did. Serving with ``strict=True`` never writes to the cache: the
        row is logged and not used, and False returned."""
        if self.strict:
            log.warning("aot.load(%r): not using %s: %s", self.name, entry.key[:12], reason)
            return False
        return self.cache.quarantine(entry, reason)

    @property
    def _writes(self) -> bool:
        """Whether this dispatcher may write to the cache (quarantine, store)."""
        return not self.strict and not self.cache.read_only

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
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=workers or min(8, len(programs))) as pool:
            list(pool.map(self._executable, programs))
        return self

    def load_in_background(self, *, workers: int | None = None) -> Dispatcher:
        """Starts loading every signature in background threads and returns at once
        (``aot.load(name, background=True)``).

        A call of a signature still loading waits for that signature only; a call of
        one not started yet loads it itself. A signature whose load fails raises the
        error the foreground load would have raised, with the same message, at its
        first call; the other signatures serve. ``workers``: threads, by default
        :func:`~aot.cache.serving.background.default_workers` (at most 4, at most the cores).
        Closing the cache cancels the loads not started and waits for the running ones.
        """
        if self._background is not None:
            return self
        programs = [p for p in self._programs.values() if p.executable is None]
        if programs:
            from aot.cache.serving.background import BackgroundLoad

            self._background = BackgroundLoad(programs, self._load_in_background, workers=workers)
            self.cache.hold_background(self._background)
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the background loading to finish (True), or ``timeout`` seconds
        (False). Load errors are not raised here: the first call of a signature raises
        its own. True at once without background loading."""
        return self._background is None or self._background.wait(timeout)

    @property
    def loading(self) -> bool:
        """Whether background loading is still running (a readiness probe can poll it)."""
        return self._background is not None and not self._background.done

    # ------------------------------------------------------------ calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sink = self._cpp_sink
        if sink is not None:  # JAX's C++ dispatch (class docstring); counted on its program
            sink.calls += 1
            return self._cpp(*args, **kwargs)
        return self._python_call(args, kwargs)

    def _python_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Selects the program in Python (after the C++ dispatch has served a second
        program, so each program's calls are counted exactly)."""
        if not kwargs:  # positional arrays only: no flatten
            try:
                hit = self._positional.get(tuple([arg.aval for arg in args]))
            except AttributeError:
                hit = None
            if hit is not None:
                return self._run(hit, args)
        leaves, treedef = _flatten((args, kwargs))
        if leaves and type(leaves[0]) is JAX_ARRAY:  # call_key, inlined for JAX arrays
            try:
                key = tuple([leaf.aval for leaf in leaves])
            except AttributeError:
                key = call_key(leaves)
        else:
            key = call_key(leaves)
        hit = self._fast.get((treedef, key))
        if hit is None:
            return self._first_call(args, kwargs, leaves, treedef)
        return self._run(hit, leaves)

    def _run(self, hit: _Kind, leaves: Sequence[Any]) -> Any:
        hit.program.calls += 1  # the only statistics on the call path (aot.cache.serving.stats)
        try:
            return hit.fn(*leaves)
        except AotError:
            raise  # a padded call's own errors (pad_outputs), already clear
        except (TypeError, ValueError) as exc:
            raise placement_error(self.name, exc) from exc

    def _cpp_miss(self, *args: Any, **kwargs: Any) -> tuple[Any, Any, bool]:
        """A call the C++ dispatch has not cached: the Python path serves it, and says
        whether C++ may serve the next calls of its signature (fastpath data)."""
        sink = self._cpp_sink
        if sink is not None:
            sink.calls -= 1  # counted below, on the program that serves it
        leaves, treedef = _flatten((args, kwargs))
        try:
            hit = self._fast.get((treedef, call_key(leaves)))
        except TypeError:  # not a JAX type: the Python path explains
            hit = None
        if hit is None:  # a kind of call not seen yet: matched, loaded, remembered
            hit = self._stored_kind(args, kwargs, leaves, treedef)
            if hit is None:  # padded, symbolic, fallback or refused: stays in Python
                return self._first_call(args, kwargs, leaves, treedef), None, False
        sink = self._cpp_sink
        if not hit.plain or sink is None:
            return self._run(hit, leaves), None, False
        if isinstance(sink, _Program) and sink is not hit.program:
            # C++ cannot say which of two programs served a call: from now on the
            # program is selected in Python, and each one's calls are counted exactly.
            log.debug("%s: a second signature is called; selecting in Python", self.name)
            self._cpp_sink = None
            return self._run(hit, leaves), None, False
        self._cpp_sink = hit.program
        hit.program.calls += 1
        try:
            return first_call(hit.fn, leaves)
        except (TypeError, ValueError) as exc:
            raise placement_error(self.name, exc) from exc

    def _structure_of(self, treedef: PyTreeDef) -> str:
        structure = self._structures.get(treedef)
        if structure is None:
            structure = treedefs.structure_key(treedef)
            if len(self._structures) < FAST_CACHE_LIMIT:
                self._structures[treedef] = structure
        return structure

    def _remember(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], leaves: Sequence[Any],
        treedef: PyTreeDef, binding: Any, program: _Program,
    ) -> None:
        if len(self._fast) >= FAST_CACHE_LIMIT:
            return
        kind = _Kind(binding.fn, program, not isinstance(binding, _PaddedCall))
        self._fast[(treedef, call_key(leaves))] = kind
        if (
            not kwargs and len(args) == len(leaves)
            and all(type(a) is JAX_ARRAY and a is leaf for a, leaf in zip(args, leaves))
        ):
            self._positional[tuple([a.aval for a in args])] = kind

    def _first_call(self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef) -> Any:
        """A kind of call not seen yet: match by structure digest and canonical avals."""
        try:
            keys = tuple(map(_leaf_key, leaves))
        except TypeError:
            raise self._not_a_jax_type(args, kwargs) from None
        program = self._programs.get((self._structure_of(treedef), keys))
        if program is None:
            return self._miss(args, kwargs, leaves, treedef, keys)
        return self._run(self._bind(program, args, kwargs, leaves, treedef), leaves)

    def _stored_kind(self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef) -> _Kind | None:
        """The kind of this call when a stored program serves it exactly (loaded and
        remembered now), else None."""
        try:
            keys = tuple(map(_leaf_key, leaves))
        except TypeError:
            return None
        program = self._programs.get((self._structure_of(treedef), keys))
        return None if program is None else self._bind(program, args, kwargs, leaves, treedef)

    def _bind(
        self, program: _Program, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef
    ) -> _Kind:
        executable = program.executable or self._executable(program)
        binding = executable.bind(treedef)
        self._remember(args, kwargs, leaves, treedef, binding, program)
        return _Kind(binding.fn, program, True)

    def _executable(self, program: _Program) -> MeshExecutable:
        with program.lock:  # held by a background load of this program: wait for it
            if program.executable is None:
                failed = self._failed.pop(id(program), None)
                if failed is not None:
                    # Its background load failed: this (first) call raises that error,
                    # as the foreground load would have; a later call tries again.
                    raise failed
                self._attempted.add(id(program))
                program.executable = self._load(program)
            return program.executable

    def _load_in_background(self, program: _Program) -> None:
        """One background task: loads ``program`` unless a call already did (or is);
        keeps the error for the first call of it."""
        with program.lock:
            if program.executable is not None or id(program) in self._attempted:
                return
            self._attempted.add(id(program))
            try:
                program.executable = self._load(program)
            except Exception as exc:  # noqa: BLE001 - raised by the first call instead
                log.warning(
                    "aot.load(%r): loading (%s) in the background failed; its first call "
                    "raises: %s", self.name, program.signature, exc,
                )
                self._failed[id(program)] = exc

    def _load(self, program: _Program) -> MeshExecutable:
        problems: list[str] = []
        unusable: list[IndexEntry] = []  # rows of this environment that failed to load
        rereads = 0
        while program.local:
            entry = program.local[0]
            try:
                return self.cache.load(entry)  # not a use: the calls are (aot.cache.serving.stats)
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
                # Under strict=True or read-only: logged, never written.
                if not self._quarantine(entry, str(exc)) and self._writes:
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

    def _miss(
        self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef, keys: tuple[LeafKey, ...]
    ) -> Any:
        notes: list[str] = []
        if self.pad is not None:
            result = self._padded_call(args, kwargs, leaves, treedef, keys, notes)
            if result is not _NO_MATCH:
                return result
        if self._symbolic:
            result = self._symbolic_call(args, kwargs, leaves, treedef, keys, notes)
            if result is not _NO_MATCH:
                return result
        if self.fallback is not None:
            from aot.cache.serving.signatures import describe_call

            log.warning(
                "aot.load(%r): no stored signature for (%s); compiling with the fallback",
                self.name, describe_call(args, kwargs, self._arg_names()),
            )
            self.cache.stats.missed(self._env, self.name, _describe_keys(keys), "compiled by the fallback")
            result = self.cache.compile_entry(self.fallback, *args, name=self.name, **kwargs)
            executable = result.executable
            structure = self._structure_of(treedef)
            self._programs[(structure, keys)] = _Program(
                executable.signature, structure, executable.info.in_tree, keys,
                tuple(a.path for a in executable.info.args), [result.entry], [], [], executable,
            )
            return executable(*args, **kwargs)
        self.cache.stats.missed(self._env, self.name, _describe_keys(keys), "no stored signature")
        raise self._not_found(args, kwargs, treedef, keys, notes)

    def _not_a_jax_type(self, args: Any, kwargs: Any) -> AvalMismatchError:
        bad = []
        for path, leaf in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]:
            try:
                _leaf_key(leaf)
            except TypeError:
                bad.append(f"{_render(path)} is {_short(leaf)}")
        return AvalMismatchError(
            f"{self.name}: {'; '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}: not an array "
            "or a Python scalar (jax.jit refuses it too); pass arrays",
            tuple(bad),
        )

    def _not_found(
        self, args: Any, kwargs: Any, treedef: PyTreeDef, got: tuple[LeafKey, ...],
        notes: Sequence[str] = (),
    ) -> SignatureNotFoundError:
        stored = self.signatures
        lines = [f"  {s}" for s in stored] or ["  (none: nothing is stored under this name here)"]
        from aot.cache.serving.signatures import describe_call

        # Per argument, by name: a list of 1000 floats is one phrase, not 1000 leaves.
        call = describe_call(args, kwargs, self._arg_names())
        message = (
            f"{self.name}: no executable compiled for ({call}).\n"
            f"Stored signatures:\n" + "\n".join(lines)
        )
        if self.skipped:
            message += "\nNot servable in this process:\n" + "\n".join(
                f"  {sig} ({key[:12]}): {reason}" for key, sig, reason in self.skipped[:5]
            )
        for note in notes:
            message += f"\n{note}"
        nearest = self._nearest(args, kwargs, treedef, got)
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
        from aot.cache.serving.signatures import path_head

        names: list[str] = []
        for program in self._programs.values():
            for path in program.paths:
                head = path_head(path)
                if head not in names:
                    names.append(head)
            break
        return names

    def _nearest(
        self, args: Any, kwargs: Any, treedef: PyTreeDef, got: tuple[LeafKey, ...]
    ) -> tuple[_Program, list[str]] | None:
        best: tuple[tuple[int, int], _Program, list[str]] | None = None
        structure = self._structure_of(treedef)
        for program in self._programs.values():
            if program.structure != structure or len(program.leaves) != len(got):
                diffs = _structure_differences(program, args, kwargs)
                score: tuple[int, int] = (1000, 0)
            else:
                differing = [
                    (path, want, have)
                    for path, want, have in zip(program.paths, program.leaves, got)
                    if want != have
                ]
                diffs = [
                    f"{path}: stored {format_aval(*want)}, got {format_aval(*have)}"
                    + (_WEAK_HINT if want[2] != have[2] else "")
                    for path, want, have in differing
                ]
                # Fewest differing leaves first, then the closest shapes (batch 8 is
                # nearer to the batch-4 bucket than to the batch-1 bucket).
                score = (len(diffs), sum(_distance(want, have) for _, want, have in differing))
            if best is None or score < best[0]:
                best = (score, program, diffs)
        return (best[1], best[2]) if best is not None else None


    # ------------------------------------------------------------ symbolic shapes

    def _add_symbolic(
        self, entry: IndexEntry, manifest: Manifest, structure: str, treedef: PyTreeDef,
        dtypes: tuple[tuple[Any, bool], ...],
    ) -> None:
        if not entry.ok:  # its portable HLO is what is damaged: nothing to compile from
            log.warning("%s (%s): symbolic entry %s is quarantined: %s", self.name,
                        manifest.signature, entry.key[:12], entry.state_reason)
            return
        from aot.symbolic import patterns_of

        patterns = patterns_of(manifest.args)
        key = (structure, patterns, dtypes, manifest.symbolic_constraints)
        program = self._symbolic.setdefault(key, _SymbolicProgram(
            manifest.signature, structure, treedef, patterns, dtypes,
            tuple(str(a["path"]) for a in manifest.args), manifest.symbolic_constraints,
        ))
        # Newest first; this environment's rows before others (same portable HLO kind).
        program.entries.insert(0, entry)
        program.entries.sort(key=lambda e: e.env_fp != self.cache.environment.digest)

    def _symbolic_call(
        self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef,
        got: tuple[LeafKey, ...], notes: list[str],
    ) -> Any:
        """Serves a call with no stored executable from a symbolic signature: compiles
        its portable HLO for these shapes (no tracing, no model code), stores the
        executable under the same name, and runs it. ``strict=True`` refuses."""
        from aot.symbolic import bind

        structure = self._structure_of(treedef)
        for program in self._symbolic.values():
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
            if self.strict:
                self.cache.stats.missed(
                    self._env, self.name, _describe_keys(got), "a symbolic program fits; strict"
                )
                raise self._strict_symbolic_error(program, got, binding.values or {})
            self.cache.stats.missed(self._env, self.name, _describe_keys(got), "compiled from a symbolic program")
            executable = self._compile_symbolic(program, structure, got, binding.values or {})
            bound = executable.bind(treedef)
            self._remember(args, kwargs, leaves, treedef, bound, self._programs[(structure, got)])
            return bound(leaves)
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
        self, program: _SymbolicProgram, structure: str, got: tuple[LeafKey, ...],
        values: dict[str, int],
    ) -> MeshExecutable:
        with self._symbolic_lock:
            existing = self._programs.get((structure, got))
            if existing is not None:  # another thread compiled it meanwhile
                return existing.executable or self._executable(existing)
            errors: list[str] = []
            for entry in program.entries:
                start = time.perf_counter()
                try:
                    artifact = self.cache.artifact(entry, roles=(PORTABLE_HLO,))
                    concrete = compile_symbolic(artifact, [shape for shape, _, _ in got])
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
                self._programs[(structure, got)] = _Program(
                    concrete.manifest.signature, structure, program.treedef, got, program.paths,
                    stored, [], [], executable,
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

    def _padded_call(
        self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef,
        got: tuple[LeafKey, ...], notes: list[str],
    ) -> Any:
        """Pads the declared inputs up to the smallest stored bucket that fits.

        No bucket large enough: refused, naming the largest; unless a symbolic entry
        may serve the exact shape (``strict=False``), which is then tried. The choice
        is remembered with the call's kind: later calls of it pad and run directly.
        """
        assert self.pad is not None
        choice = self._choose_bucket(leaves, treedef, got, notes)
        if choice is None:
            return _NO_MATCH
        program, size, n = choice
        axes = self._pad_axes[self._structure_of(treedef)]
        program.calls += 1
        executable = program.executable or self._executable(program)
        padded = _PaddedCall(executable.bind(treedef), axes, size, n, self.pad)
        self._remember(args, kwargs, leaves, treedef, padded, program)
        try:
            return padded.fn(*leaves)
        except AotError:
            raise
        except (TypeError, ValueError) as exc:
            raise placement_error(self.name, exc) from exc

    def _choose_bucket(
        self, leaves: list[Any], treedef: PyTreeDef, got: tuple[LeafKey, ...], notes: list[str],
    ) -> tuple[_Program, int, int] | None:
        assert self.pad is not None
        structure = self._structure_of(treedef)
        candidates = [p for p in self._programs.values() if p.structure == structure]
        if not candidates:
            return None
        axes = self._pad_axes.get(structure)
        if axes is None:
            axes = self._pad_axes[structure] = self.pad.axes_for(candidates[0].paths)
        from aot.cache.serving.padding import fits, rows

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


class _PaddedCall:
    """A kind of call served by padding to a bucket: ``fn(*leaves)`` pads the declared
    inputs, runs the bucket's executable and slices the outputs back (the dispatcher's
    per-call cache holds it like a :class:`Binding`)."""

    __slots__ = ("binding", "axes", "size", "n", "plan", "_pad", "_unpad")

    def __init__(self, binding: Binding, axes: dict[int, int], size: int, n: int, plan: PadPlan) -> None:
        from aot.cache.serving.padding import pad_leaf, unpad_outputs

        self._pad, self._unpad = pad_leaf, unpad_outputs
        self.binding = binding
        self.axes = axes
        self.size = size
        self.n = n
        self.plan = plan

    def fn(self, *leaves: Any) -> Any:
        axes, size, value, pad_leaf = self.axes, self.size, self.plan.value, self._pad
        padded = [
            pad_leaf(leaf, axes[i], size, value) if i in axes else leaf
            for i, leaf in enumerate(leaves)
        ]
        return self._unpad(self.binding.fn(*padded), self.plan, size, self.n)

def _describe_keys(keys: Sequence[LeafKey]) -> str:
    return ", ".join(format_aval(shape, dtype, weak) for shape, dtype, weak in keys)


_MAX_REREADS = 4  # rows rewritten again and again while one call loads: give up


def _same_row(a: IndexEntry, b: IndexEntry) -> bool:
    """The same version of a row: same blobs, same manifest."""
    return (a.exe_digest, a.hlo_digest, a.manifest) == (b.exe_digest, b.hlo_digest, b.manifest)


_WEAK_HINT = (
    " (a Python scalar is weakly typed under jax.jit, an array is not: pass the kind "
    "that was compiled, or compile the other)"
)


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


def _render(key_path: Sequence[Any]) -> str:
    head, rest = key_path[:2], key_path[2:]
    if getattr(head[0], "idx", 0) == 0:
        name = f"args[{getattr(head[1], 'idx', 0)}]"
    else:
        name = str(getattr(head[1], "key", head[1]))
    return name + jax.tree_util.keystr(tuple(rest))


def _describe_value(value: Any) -> str:
    """One short phrase for one argument: its aval, or what kind of pytree it is."""
    leaves, tree = _flatten(value)
    if tree.num_leaves == 1 and tree.num_nodes == 1:
        try:
            return format_aval(*_leaf_key(leaves[0]))
        except TypeError:
            return _short(value)
    kind = _describe_tree(tree)  # not a leaf: handled above
    if kind == "None":
        return kind
    if tree.num_leaves <= 4:
        try:
            return kind + " (" + ", ".join(format_aval(*_leaf_key(x)) for x in leaves) + ")"
        except TypeError:
            return kind
    return f"{kind} ({tree.num_leaves} leaves)"



def _structure_differences(program: _Program, args: Any, kwargs: Any) -> list[str]:
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
        if treedefs.structure_key(tree) != treedefs.structure_key(jax.tree_util.tree_structure(value)):
            diffs.append(f"pytree structure of {names[i]}: stored {_describe_tree(tree)}, got {_describe_value(value)}")
    stored_keys = list((stored_kwargs.node_data() or (None, []))[1] or [])
    if sorted(map(str, stored_keys)) != sorted(map(str, kwargs)):
        diffs.append(f"pytree structure of keyword arguments: stored {sorted(map(str, stored_keys))}, got {sorted(map(str, kwargs))}")
    return diffs or [f"pytree structure ({len(program.leaves)} leaves stored)"]


def _argument_names(program: _Program, arg_trees: Sequence[PyTreeDef]) -> list[str]:
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


def _describe_tree(tree: PyTreeDef) -> str:
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


def _cannot_serve_here(manifest: Manifest, here: dict[str, str]) -> str | None:
    """Why an entry can neither run nor be recompiled in this process, or None."""
    program_x64 = manifest.program.as_dict().get("x64")
    current_x64 = here.get("x64")
    if program_x64 is not None and current_x64 is not None and program_x64 != current_x64:
        return (
            f"compiled with jax_enable_x64={program_x64}, this process has "
            f"jax_enable_x64={current_x64}"
        )
    stored_platform = manifest.environment.as_dict().get("platform")
    if stored_platform is not None and stored_platform != here.get("platform"):
        return f"compiled for platform {stored_platform}, this process runs {here.get('platform')}"
    live = {int(d.id) for d in jax.devices()}
    # The devices the program fingerprint pins (the manifest's device_ids field is not
    # covered by the key: a wrong one is corruption, quarantined and healed, not a
    # reason to skip the entry).
    pinned = json_part(manifest.program.as_dict(), "devices")
    wanted = pinned if isinstance(pinned, list) and all(isinstance(d, int) for d in pinned) else manifest.device_ids
    missing = sorted(set(wanted) - live)
    if missing:
        return (
            f"needs device ids {missing[:8]} (compiled on "
            f"{manifest.environment.as_dict().get('device_count', '?')} devices), this process "
            f"has {len(live)}"
        )
    return None


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
    background: bool = False,
) -> Dispatcher:
    """A callable over every signature stored for ``name`` in this environment.

    ``lazy=False`` (the default) loads every signature now, in parallel, so the first
    request runs at full speed; ``lazy=True`` loads each on its first call;
    ``background=True`` returns once the index rows are read and loads every
    signature in background threads: a call waits for its own signature only, and a
    signature that fails to load raises that error (as ``background=False`` would at
    start-up) at its first call (:meth:`Dispatcher.load_in_background`).

    A call whose shapes match no stored executable is served, in this order: by
    padding (with ``pad=``) up to the smallest stored bucket that fits; by compiling
    a stored symbolic signature (``f32[b,784]``) for its shapes, stored back under
    ``name`` (not with ``strict=True``); by ``fallback``; else
    :class:`SignatureNotFoundError`.

    ``pad={"x": 0}`` pads input ``x`` along axis 0 and slices the outputs back (see
    :mod:`aot.cache.serving.padding` for the rules). It declares that rows along that axis
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
    if lazy and background:
        raise UsageError(
            "aot.load: lazy=True loads each signature at its first call, background=True "
            "loads them all now in threads; pass one of them"
        )
    plan = None
    if pad is not None:
        from aot.cache.serving.padding import PadPlan

        plan = PadPlan.of(pad, pad_outputs, pad_value)
    owned = not isinstance(cache, Cache)
    if owned:
        cache = open_existing(cache, read_only=read_only)
    assert isinstance(cache, Cache)
    try:
        dispatcher = Dispatcher(cache, name, strict=strict, fallback=fallback, pad=plan)
        if not allow_empty and fallback is None and not dispatcher.servable():
            raise _nothing_servable(cache, name, dispatcher)
        if background:
            dispatcher.load_in_background()
        elif not lazy:
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
            from aot.cache.index.sql import Index

            try:  # a read-only open creates nothing; a writable one would create the schema
                Index(location, read_only=True).close()
            except CacheError as exc:
                raise CacheError(f"{exc}. {advice}") from None
        return Cache(location, read_only=bool(read_only))
    folder = Path(location).expanduser()
    index = folder / INDEX_FILE
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
    for key, signature, reason in dispatcher.skipped:
        lines.append(f"  ({signature}) {key[:12]} cannot run in this process: {reason[:200]}")
    if programs or dispatcher.unusable or dispatcher.skipped:
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

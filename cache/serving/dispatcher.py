"""The per-call path of ``aot.load(name)``: match a call's input signature to a stored
program and run its executable.

Calls run through JAX's own C++ dispatch (the ``PjitFunction`` behind ``jax.jit``),
which caches each signature it has seen with the executable that served it; the
Python path runs once per kind of call: it matches the structure by digest,
canonicalizes NumPy and Python inputs as jax.jit does, checks the avals, loads, and
remembers the kind of call. Statistics count each program's calls exactly
(:mod:`aot.cache.stats_recorder`), and C++ cannot say which program served a call, so
the C++ dispatch serves one program per dispatcher: once a second one is called,
calls select their program in Python (a tuple of the inputs' avals and one dict
lookup; a flatten when there are pytrees or keywords).

What is not per call lives elsewhere: the stored programs and the fallback ladder in
:mod:`~aot.cache.serving.programs`; a call no stored program serves exactly is tried,
in order, by padding (:mod:`~aot.cache.serving.padding`), a symbolic program
(:mod:`~aot.cache.serving.symbolic`) and the fallback function, else refused with the
wording of :mod:`~aot.cache.serving.misses`.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
from jax.tree_util import PyTreeDef

from aot import treedef as treedefs
from aot.errors import AotError
from aot.executable import FAST_CACHE_LIMIT, JAX_ARRAY, call_key, placement_error
from aot.jaxcompat.dispatch import dispatch_function, first_call
from aot.specs import leaf_aval

from aot.cache.serving.programs import LeafKey, Program, ProgramTable
from aot.cache.stats_recorder import FALLBACK_REASON
from aot.cache.units import counted

# Imported where used: serving an exact signature needs none of them (padding,
# symbolic shapes, background loading, and the wording of a miss), and a serving
# process's start-up is part of what it is measured by.
if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.index.entry import IndexEntry
    from aot.cache.serving.padding import PadPlan

log = logging.getLogger(__name__)

_flatten = jax.tree_util.tree_flatten


@dataclass(frozen=True, slots=True)
class Kind:
    """A kind of call already served: ``fn(*leaves)`` runs it (a bound executable's
    C++ call, or a padded call), ``program`` counts it; ``plain`` when JAX's C++
    dispatch may serve it (not padded)."""

    fn: Callable[..., Any]
    program: Program
    plain: bool


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


class Dispatcher:
    """Calls the executable whose input signature matches the arguments (module
    docstring). ``programs`` is the :class:`ProgramTable` of ``name``.

    ``strict=True`` never compiles and never writes to the cache: a row it finds
    damaged is logged and refused, not quarantined (``aot verify`` does that).
    """

    def __init__(
        self,
        cache: ArtifactStore,
        name: str,
        *,
        strict: bool = False,
        fallback: Callable[..., Any] | None = None,
        pad: PadPlan | None = None,
        release: str | None = None,
        statics: str | None = None,
        entries: Sequence[IndexEntry] | None = None,
    ) -> None:
        self.cache = cache
        self.name = name
        self.strict = strict
        self.fallback = fallback
        self.pad = pad
        # Kinds of call already served: by (caller treedef, call_key of its leaves),
        # and by the avals of positional arrays; structure keys per caller treedef.
        self._fast: dict[tuple[PyTreeDef, tuple[Any, ...]], Kind] = {}
        self._positional: dict[tuple[Any, ...], Kind] = {}
        # JAX's C++ dispatch and the one program it serves (module docstring), which
        # counts its calls; a throw-away counter until a program is served, None once
        # calls are selected in Python.
        self._cpp = dispatch_function(name, _miss_of(self))
        self._cpp_sink: Program | _Uncounted | None = _Uncounted()
        self._structures: dict[PyTreeDef, str] = {}
        self._pad_axes: dict[str, dict[int, int]] = {}
        # Before the table: an eager load's events carry the release (metrics' label).
        cache.stats.serves(name, release)
        # statics: serve only the rows of these static values (one group of a
        # StaticsDispatcher, aot.cache.serving.statics); None: every row of the name.
        self.programs = ProgramTable(
            cache, name, strict=strict, release=release, statics=statics, entries=entries,
        )
        cache.stats.watch(self, self.programs.concrete, self.programs.env, name)
        if pad is not None:
            paths = self.programs.paths()  # files every row: padding chooses among them all
            if self.programs.concrete or self.programs.symbolic:
                pad.axes_for(paths)  # every padded path names a stored input

    # ------------------------------------------------------------ inspection

    @property
    def signatures(self) -> list[str]:
        """Every stored signature: concrete ones, and symbolic ones (``f32[b,784]``)."""
        return self.programs.signatures

    def servable(self) -> list[str]:
        """Signatures this dispatcher can serve (:meth:`ProgramTable.servable`)."""
        return self.programs.servable()

    def has_servable(self) -> bool:
        """Whether some signature can be served (:meth:`ProgramTable.has_servable`)."""
        return self.programs.has_servable()

    @property
    def unusable(self) -> list[tuple[IndexEntry, str]]:
        """Rows that could not be filed under a signature: (entry, why)."""
        self.programs.file_all()
        return self.programs.unusable

    @property
    def skipped(self) -> list[tuple[str, str, str]]:
        """Rows that cannot serve in this process: (key, signature, reason)."""
        self.programs.file_all()
        return self.programs.skipped

    def __repr__(self) -> str:
        return f"Dispatcher({self.name!r}, {counted(len(self.signatures), 'signature')})"

    # ------------------------------------------------------------ loading

    def warm(self, *, workers: int | None = None) -> Dispatcher:
        """Loads every signature now (in parallel threads: XLA releases the GIL; rows
        held for their first use are filed by the same threads)."""
        units = self.programs.units()
        if not units:
            return self
        if len(units) == 1 or workers == 1:
            for unit in units:
                self.programs.load_unit(unit)
            return self
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=workers or min(8, len(units))) as pool:
            list(pool.map(self.programs.load_unit, units))
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
        self.programs.start_background(workers)
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the background loading to finish (True), or ``timeout`` seconds
        (False). Load errors are not raised here: the first call of a signature raises
        its own. True at once without background loading."""
        background = self.programs.background
        return background is None or background.wait(timeout)

    @property
    def loading(self) -> bool:
        """Whether background loading is still running (a readiness probe can poll it)."""
        background = self.programs.background
        return background is not None and not background.done

    # ------------------------------------------------------------ calling

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sink = self._cpp_sink
        if sink is not None:  # JAX's C++ dispatch (module docstring); counted on its program
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

    def _run(self, hit: Kind, leaves: Sequence[Any]) -> Any:
        hit.program.calls += 1  # the only statistics on the call path (aot.cache.stats_recorder)
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
        if isinstance(sink, Program) and sink is not hit.program:
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
        treedef: PyTreeDef, fn: Callable[..., Any], program: Program, *, plain: bool = True,
    ) -> None:
        if len(self._fast) >= FAST_CACHE_LIMIT:
            return
        kind = Kind(fn, program, plain)
        self._fast[(treedef, call_key(leaves))] = kind
        if (
            not kwargs and len(args) == len(leaves)
            and all(type(a) is JAX_ARRAY and a is leaf for a, leaf in zip(args, leaves))
        ):
            self._positional[tuple([a.aval for a in args])] = kind

    def _first_call(self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef) -> Any:
        """A kind of call not seen yet: match by structure digest and canonical avals."""
        try:
            keys = tuple(map(leaf_aval, leaves))
        except TypeError:
            from aot.cache.serving.misses import arg_names, not_a_jax_type

            raise not_a_jax_type(self.name, args, kwargs, arg_names(self.programs)) from None
        structure = self._structure_of(treedef)
        program = self.programs.find(structure, keys)
        if program is None:  # rows whose signature column did not name these keys
            self.programs.file_all()
            program = self.programs.concrete.get((structure, keys))
        if program is None:
            kind = self._by_keyword(args, kwargs, leaves, treedef, keys)
            if kind is not None:
                return self._run(kind, leaves)
            return self._miss(args, kwargs, leaves, treedef, keys)
        return self._run(self._bind(program, args, kwargs, leaves, treedef), leaves)

    def _by_keyword(
        self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef, keys: tuple[LeafKey, ...],
    ) -> Kind | None:
        """A stored program that takes the same arguments, passed by position where the
        call names them or the reverse (:mod:`aot.keywords`): its kind,
        which reorders the call's leaves, remembered for the Python path only."""
        from operator import itemgetter

        from aot.keywords import layout_of, permutations

        layouts: dict[Any, None] = {}  # an ordered set
        for stored in self.programs.concrete.values():
            layout = layout_of(stored.treedef, stored.names)
            if layout is not None:
                layouts[layout] = None
        for perm, form in permutations(treedef, layouts):
            program = self.programs.concrete.get((self._structure_of(form), tuple(keys[i] for i in perm)))
            if program is None:
                continue
            executable = program.executable or self.programs.executable(program)
            bound = executable.bind(form).fn
            pick = itemgetter(*perm) if len(perm) > 1 else (lambda leaves: tuple(leaves[i] for i in perm))

            def fn(*call_leaves: Any, _bound: Any = bound, _pick: Any = pick) -> Any:
                return _bound(*_pick(call_leaves))

            self._remember(args, kwargs, leaves, treedef, fn, program, plain=False)
            return Kind(fn, program, False)
        return None

    def _stored_kind(self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef) -> Kind | None:
        """The kind of this call when a stored program serves it exactly (loaded and
        remembered now), else None."""
        try:
            keys = tuple(map(leaf_aval, leaves))
        except TypeError:
            return None
        program = self.programs.find(self._structure_of(treedef), keys)
        return None if program is None else self._bind(program, args, kwargs, leaves, treedef)

    def _bind(
        self, program: Program, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef
    ) -> Kind:
        executable = program.executable or self.programs.executable(program)
        binding = executable.bind(treedef)
        self._remember(args, kwargs, leaves, treedef, binding.fn, program)
        return Kind(binding.fn, program, True)

    # ------------------------------------------------------------ misses

    def _miss(
        self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef, keys: tuple[LeafKey, ...]
    ) -> Any:
        """No stored program serves the call exactly: padding, then a symbolic program,
        then the fallback function; else :class:`SignatureNotFoundError`."""
        from aot.cache.serving import misses

        notes: list[str] = []
        structure = self._structure_of(treedef)
        table = self.programs
        if self.pad is not None:
            served = self._padded(args, kwargs, leaves, treedef, structure, keys, notes)
            if served is not None:
                return served[0]
        if table.symbolic:
            from aot.cache.serving.symbolic import serve_symbolic

            executable = serve_symbolic(table, structure, keys, notes)
            if executable is not None:
                bound = executable.bind(treedef)
                self._remember(args, kwargs, leaves, treedef, bound.fn, table.concrete[(structure, keys)])
                return bound(leaves)
        if self.fallback is not None:
            return self._compile_with_fallback(args, kwargs, structure, keys)
        reason = misses.miss_reason(table, args, kwargs, structure, keys)
        self.cache.stats.missed(table.env, self.name, misses.describe_keys(keys), reason)
        hint = misses.pad_hint(table, structure, keys) if self.pad is None else None
        raise misses.not_found(table, args, kwargs, structure, keys, [*notes, *([hint] if hint else [])])

    def _padded(
        self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef, structure: str,
        got: tuple[LeafKey, ...], notes: list[str],
    ) -> tuple[Any] | None:
        """Pads the declared inputs up to the smallest stored bucket that fits: the
        result (in a 1-tuple), or None when no bucket fits. The choice is remembered
        with the call's kind: later calls of it pad and run directly."""
        from aot.cache.serving.padding import PaddedCall, choose_bucket

        assert self.pad is not None
        candidates = [p for p in self.programs.concrete.values() if p.structure == structure]
        if not candidates:
            return None
        axes = self._pad_axes.get(structure)
        if axes is None:
            axes = self._pad_axes[structure] = self.pad.axes_for(candidates[0].paths)
        try:
            choice = choose_bucket(
                self.name, candidates, leaves, got, axes, notes,
                symbolic_may_serve=bool(self.programs.symbolic) and not self.strict,
            )
        except AotError:  # no bucket large enough, or padded axes that disagree: a miss
            from aot.cache.serving.misses import describe_keys

            self.cache.stats.missed(self.programs.env, self.name, describe_keys(got), "no bucket to pad to")
            raise
        if choice is None:
            return None
        program, size, n = choice
        program.calls += 1
        executable = program.executable or self.programs.executable(program)
        padded = PaddedCall(executable.bind(treedef).fn, axes, size, n, self.pad)
        self._remember(args, kwargs, leaves, treedef, padded.fn, program, plain=False)
        try:
            return (padded.fn(*leaves),)
        except AotError:
            raise
        except (TypeError, ValueError) as exc:
            raise placement_error(self.name, exc) from exc

    def _compile_with_fallback(
        self, args: Any, kwargs: Any, structure: str, keys: tuple[LeafKey, ...],
    ) -> Any:
        """Compiles the call with the fallback function, stores it, and files it."""
        from aot.cache.serving.misses import describe_keys, describe_the_call

        log.warning(
            "aot.load(%r): no stored signature for (%s); compiling with the fallback",
            self.name, describe_the_call(self.programs, args, kwargs),
        )
        self.cache.stats.missed(self.programs.env, self.name, describe_keys(keys), FALLBACK_REASON)
        from aot.cache.compiling import compile_entry  # only a fallback compiles

        assert self.fallback is not None  # a miss compiles only with a fallback (the caller checked)
        result = compile_entry(self.cache, self.fallback, *args, name=self.name, **kwargs)
        executable = result.executable
        assert executable is not None  # compile_entry compiled it in this process
        self.programs.concrete[(structure, keys)] = Program(
            executable.signature, structure, executable.info.in_tree, keys,
            tuple(a.path for a in executable.info.args), [result.entry], [], [], executable,
            names=executable.info.arg_names,
        )
        return executable(*args, **kwargs)

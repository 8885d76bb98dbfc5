"""Serving: ``aot.load(name)`` -> a dispatcher over every stored signature of ``name``.

A call computes the input signature (pytree structure + shape/dtype per leaf), picks
the executable compiled for it and runs it. Nothing is traced or lowered and the
model's module is never imported. The fallback ladder for an executable that does not
fit this environment, or whose blob is corrupt: recompile from the stored portable HLO
and store the result; ``strict=True`` raises instead (fleets that must never compile).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from aot import treedef as treedefs
from aot.artifact import PORTABLE_HLO, Manifest
from aot.rehydrate import load_executable, manifest_args, recompile
from aot.errors import (
    AotError,
    AvalMismatchError,
    CorruptArtifactError,
    IncompatibleEnvironmentError,
    IntegrityError,
    SignatureNotFoundError,
)
from aot.executable import (
    FAST_CACHE_LIMIT,
    Binding,
    MeshExecutable,
    JAX_ARRAY,
    call_key,
    placement_error,
)
from aot.fingerprint import describe_differences
from aot.specs import format_aval, leaf_aval
from aot.cache.cache import Cache
from aot.cache.entry import IndexEntry

log = logging.getLogger(__name__)

# (shape, dtype, weak_type) of one input, as jax.jit sees it.
LeafKey = tuple[tuple[int, ...], Any, bool]


@dataclass
class _Program:
    """One stored signature of a name: its rows for this and other environments, and
    quarantined rows (never executed; their portable HLO can still be recompiled)."""

    signature: str
    structure: str  # treedef.structure_key of the inputs
    treedef: PyTreeDef  # the input structure (stand-ins for nodes not rebuildable here)
    leaves: tuple[LeafKey, ...]
    paths: tuple[str, ...]
    local: list[IndexEntry] = field(default_factory=list)
    foreign: list[IndexEntry] = field(default_factory=list)
    quarantined: list[IndexEntry] = field(default_factory=list)
    executable: MeshExecutable | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


_flatten = jax.tree_util.tree_flatten


def _leaf_key(leaf: Any) -> LeafKey:
    """The key of one call input, canonicalized as jax.jit does; ``TypeError`` for
    what jax.jit refuses (a string, an object)."""
    return leaf_aval(leaf)


class Dispatcher:
    """Calls the executable whose input signature matches the arguments.

    The per-call path is a flatten, one tuple of the inputs' avals and one dict lookup
    (caller structure + avals -> a bound executable); everything else (matching a
    structure by digest, canonicalizing NumPy and Python inputs as jax.jit does,
    loading) happens on the first call of each kind and is remembered.
    """

    def __init__(
        self,
        cache: Cache,
        name: str,
        *,
        strict: bool = False,
        fallback: Callable[..., Any] | None = None,
    ) -> None:
        self.cache = cache
        self.name = name
        self.strict = strict
        self.fallback = fallback
        self._programs: dict[tuple[str, tuple[LeafKey, ...]], _Program] = {}
        self._fast: dict[tuple[PyTreeDef, tuple[Any, ...]], Binding] = {}
        self._structures: dict[PyTreeDef, str] = {}
        # Entries that cannot serve in this process (other x64 mode, platform or
        # devices, a dtype this jax lacks): (key, signature, reason), never quarantined.
        self.skipped: list[tuple[str, str, str]] = []
        environment = cache.environment
        env = environment.digest
        # Quarantined rows too: their executable is never run, but the signature stays
        # servable by recompiling their portable HLO (the fallback ladder).
        for entry in cache.entries_named(name, state=None):
            try:
                manifest = Manifest.from_json(entry.manifest)
                reason = _cannot_serve_here(manifest, environment.as_dict())
                if reason is None:
                    args = manifest_args(manifest)  # dtypes this jax may lack
                    structure = treedefs.structure_key_of_json(manifest.in_tree)
                    treedef = treedefs.from_json(manifest.in_tree, standins=True)
            except IncompatibleEnvironmentError as exc:
                reason = str(exc)
            except AotError as exc:
                self._quarantine(entry, f"unreadable manifest: {exc}")
                continue
            if reason is not None:
                log.warning("aot.load(%r): skipping %s (%s): %s", name, entry.key[:12], entry.signature, reason)
                self.skipped.append((entry.key, entry.signature, reason))
                continue
            leaves = tuple((a.shape, a.dtype, a.weak_type) for a in args)
            program = self._programs.setdefault(
                (structure, leaves),
                _Program(manifest.signature, structure, treedef, leaves, tuple(a.path for a in args)),
            )
            if not entry.ok:
                program.quarantined.insert(0, entry)
            elif entry.env_fp == env:
                program.local.insert(0, entry)
            else:
                program.foreign.insert(0, entry)
            # Rows come oldest first and are inserted at the front: the newest row of
            # a signature is tried first (a name recompiled from changed code must not
            # keep serving the old program).
        log.info("aot.load(%r): %d signatures", name, len(self._programs))

    def _quarantine(self, entry: IndexEntry, reason: str) -> None:
        if self.strict:  # serving with strict=True never writes to the cache
            log.warning("aot.load(%r): not using %s: %s", self.name, entry.key[:12], reason)
        else:
            self.cache.quarantine(entry, reason)

    # ------------------------------------------------------------ inspection

    @property
    def signatures(self) -> list[str]:
        return sorted(p.signature for p in self._programs.values())

    def __repr__(self) -> str:
        return f"Dispatcher({self.name!r}, {len(self._programs)} signatures)"

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
        if leaves and type(leaves[0]) is JAX_ARRAY:  # call_key, inlined for JAX arrays
            try:
                key = tuple([leaf.aval for leaf in leaves])
            except AttributeError:
                key = call_key(leaves)
        else:
            key = call_key(leaves)
        binding = self._fast.get((treedef, key))
        if binding is None:
            return self._first_call(args, kwargs, leaves, treedef)
        try:
            return binding.fn(*leaves)
        except (TypeError, ValueError) as exc:
            raise placement_error(self.name, exc) from exc

    def _structure_of(self, treedef: PyTreeDef) -> str:
        structure = self._structures.get(treedef)
        if structure is None:
            structure = treedefs.structure_key(treedef)
            if len(self._structures) < FAST_CACHE_LIMIT:
                self._structures[treedef] = structure
        return structure

    def _first_call(self, args: Any, kwargs: Any, leaves: list[Any], treedef: PyTreeDef) -> Any:
        """A kind of call not seen yet: match by structure digest and canonical avals."""
        try:
            keys = tuple(map(_leaf_key, leaves))
        except TypeError:
            raise self._not_a_jax_type(args, kwargs) from None
        program = self._programs.get((self._structure_of(treedef), keys))
        if program is None:
            return self._miss(args, kwargs, leaves, treedef, keys)
        executable = program.executable or self._executable(program)
        binding = executable.bind(treedef)
        if len(self._fast) < FAST_CACHE_LIMIT:
            self._fast[(treedef, call_key(leaves))] = binding
        return binding(leaves)

    def _executable(self, program: _Program) -> MeshExecutable:
        with program.lock:
            if program.executable is None:
                program.executable = self._load(program)
            return program.executable

    def _load(self, program: _Program) -> MeshExecutable:
        problems: list[str] = []
        unusable: list[IndexEntry] = []  # rows of this environment that failed to load
        for entry in list(program.local):
            try:
                return self.cache.load(entry)
            except CorruptArtifactError as exc:
                self._quarantine(entry, str(exc))
                problems.append(str(exc))
                program.local.remove(entry)
                program.quarantined.append(entry)
                if self.strict:
                    raise
            except IncompatibleEnvironmentError as exc:
                # XLA refused the executable although the fingerprint matched: never
                # try it again (quarantined, so the recompiled artifact replaces it).
                self._quarantine(entry, str(exc))
                problems.append(str(exc))
                program.local.remove(entry)
                unusable.append(entry)
        candidates = program.foreign + program.quarantined + unusable
        if not candidates:
            raise CorruptArtifactError(
                f"{self.name} ({program.signature}): no intact artifact is left "
                f"({'; '.join(problems)}); recompile it (aot warmup / aot compile)"
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
        for entry in candidates:
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
                errors.append(f"{entry.key[:12]}: {exc}")
                continue
            log.warning(
                "%s (%s): recompiled from portable HLO (%s)", self.name, program.signature,
                describe_differences(diffs) or f"stored executable unusable: {entry.state_reason}",
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
        if self.fallback is not None:
            log.warning(
                "aot.load(%r): no stored signature for (%s); compiling with the fallback",
                self.name, _describe_call(args, kwargs),
            )
            result = self.cache.compile_entry(self.fallback, *args, name=self.name, **kwargs)
            executable = result.executable
            structure = self._structure_of(treedef)
            self._programs[(structure, keys)] = _Program(
                executable.signature, structure, executable.info.in_tree, keys,
                tuple(a.path for a in executable.info.args), [result.entry], [], [], executable,
            )
            return executable(*args, **kwargs)
        raise self._not_found(args, kwargs, treedef, keys)

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
        self, args: Any, kwargs: Any, treedef: PyTreeDef, got: tuple[LeafKey, ...]
    ) -> SignatureNotFoundError:
        stored = self.signatures
        lines = [f"  {s}" for s in stored] or ["  (none: nothing is stored under this name here)"]
        message = (
            f"{self.name}: no executable compiled for ({_describe_call(args, kwargs)}).\n"
            f"Stored signatures:\n" + "\n".join(lines)
        )
        if self.skipped:
            message += "\nNot servable in this process:\n" + "\n".join(
                f"  {sig} ({key[:12]}): {reason}" for key, sig, reason in self.skipped[:5]
            )
        nearest = self._nearest(args, kwargs, treedef, got)
        if nearest is not None:
            program, diffs = nearest
            message += f"\nNearest: ({program.signature}); differs in " + ", ".join(diffs)
        message += (
            "\nCompile this signature in CI (aot compile / aot warmup), or pass fallback=fn "
            "to aot.load to compile it on demand."
        )
        return SignatureNotFoundError(message, tuple(stored))

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
    node = tree.node_data()
    if node is None:
        return "None"
    cls, aux = node
    n = len(tree.children())
    if cls in (list, tuple):
        kind = f"a {cls.__name__} of {n} item{'s' if n != 1 else ''}"
    elif cls is dict:
        kind = f"a dict with keys {sorted(map(str, aux))[:6]}"
    elif cls is type(None):
        return "None"
    else:
        kind = f"a {getattr(cls, '__qualname__', cls)}"
    if tree.num_leaves <= 4:
        try:
            return kind + " (" + ", ".join(format_aval(*_leaf_key(x)) for x in leaves) + ")"
        except TypeError:
            return kind
    return f"{kind} ({tree.num_leaves} leaves)"


def _describe_call(args: Any, kwargs: Any) -> str:
    """The call in one line: one phrase per argument, not one per leaf."""
    parts = [_describe_value(a) for a in args]
    parts += [f"{k}={_describe_value(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


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
    missing = sorted(set(manifest.device_ids) - live)
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
) -> Dispatcher:
    """A callable over every signature stored for ``name`` in this environment.

    ``lazy=False`` (the default) loads every signature now, in parallel, so the first
    request runs at full speed; ``lazy=True`` loads each on its first call.
    """
    if not isinstance(cache, Cache):
        cache = Cache(cache, read_only=bool(read_only))
    dispatcher = Dispatcher(cache, name, strict=strict, fallback=fallback)
    if not lazy:
        dispatcher.warm()
    return dispatcher

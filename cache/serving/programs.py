"""The stored programs of one name, filed by input signature, and the fallback ladder.

:class:`ProgramTable` reads every index row stored under a name once, at start-up, and
files each under its input signature (pytree structure + avals): rows for this
environment, rows for other environments, and quarantined rows. A row this process
cannot use (another x64 mode, platform or device set, a dtype this jax lacks) is
skipped with a logged reason and never quarantined; a row whose manifest contradicts
its own fingerprints is quarantined (proven corruption).

Only the rows of the program each signature serves are filed
(:mod:`aot.cache.serving.selection`: its ref, a release's member, or the legacy newest
row), and a row whose signature column names its call is filed when that signature
is first needed, not at start-up (:mod:`aot.cache.serving.pending`). Loading a
program climbs the fallback ladder: the served executable stored for this
environment; else recompile the portable HLO of the same program (of another
environment, or of a quarantined row) and store the result; else a clear error.
``strict=True`` forbids the middle step and never writes to the cache.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from dataclasses import replace
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
from jax.tree_util import PyTreeDef

from aot import treedef as treedefs
from aot.artifact import PORTABLE_HLO, Manifest, json_part, manifest_problems, parse_manifest_dtype
from aot.errors import (
    AotError,
    CorruptArtifactError,
    ExportWindowError,
    IncompatibleEnvironmentError,
    IntegrityError,
    ReleaseNotFoundError,
    UnsupportedComputationError,
)
from aot.fingerprint import describe_differences
from aot.rehydrate import load_executable, manifest_args
from aot.slices import once_per_slice
from aot.cache.serving.pending import CheckedManifests, PendingRows, leaf_keys_of
from aot.cache.serving.selection import Declared, checked_rows, select_rows, trusted_refs
from aot.statics import describe_statics, statics_of_manifest_json
from aot.targets import environment_name
from aot.cache.units import counted

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.index.entry import IndexEntry
    from aot.cache.serving.background import BackgroundLoad
    from aot.executable import MeshExecutable

log = logging.getLogger(__name__)

#: Load failures that come from this process, not from the stored bytes: a module a
#: pytree node names is not importable here (PytreeNodeError), an import fails, memory
#: runs out. The row is skipped for this process with a logged reason and never
#: quarantined: quarantine is for corruption a digest or a cross-check proves.
PROCESS_LIMITS: tuple[type[BaseException], ...] = (UnsupportedComputationError, ImportError, MemoryError)

#: (shape, dtype, weak_type) of one input, as jax.jit sees it.
LeafKey = tuple[tuple[int, ...], Any, bool]

#: Rows rewritten again and again while one call loads: give up after this many.
MAX_REREADS = 4


class Program:
    """One stored signature of a name: its rows for this and other environments, and
    quarantined rows (never executed; their portable HLO can still be recompiled).

    Mutable and slotted: a call counts itself with ``program.calls += 1``, and the
    statistics recorder (:mod:`aot.cache.stats_recorder`) reads ``calls`` and
    ``counted``."""

    __slots__ = (
        "signature", "structure", "treedef", "leaves", "paths", "local", "foreign",
        "quarantined", "executable", "lock", "calls", "counted", "names",
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
        names: tuple[str, ...] = (),  # parameter names (Manifest.arg_names): keyword calls
    ) -> None:
        self.names = names
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
        self.calls = 0  # calls served
        self.counted = 0  # of which already flushed to the statistics

    def __repr__(self) -> str:
        return f"Program({self.signature!r}, loaded={self.executable is not None})"


class SymbolicProgram:
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
        return f"SymbolicProgram({self.signature!r}, {counted(len(self.entries), 'entry')})"


def same_row(a: IndexEntry, b: IndexEntry) -> bool:
    """The same version of a row: same blobs, same manifest."""
    return (a.exe_digest, a.hlo_digest, a.manifest) == (b.exe_digest, b.hlo_digest, b.manifest)


class ProgramTable:
    """Every program stored under ``name``, by signature, and how each is loaded.

    ``concrete`` maps (structure key, leaf keys) to a :class:`Program`; ``symbolic``
    holds the shape-polymorphic ones. ``unusable`` lists rows that could not even be
    filed (entry, why); ``skipped`` the rows that cannot serve in this process (key,
    signature, reason). ``strict=True`` never writes to the cache: a row found
    damaged is logged and refused, not quarantined (``aot verify`` does that).
    """

    def __init__(
        self, cache: ArtifactStore, name: str, *, strict: bool = False, release: str | None = None,
        statics: str | None = None, entries: Sequence[IndexEntry] | None = None,
    ) -> None:
        self.cache = cache
        self.name = name
        self.strict = strict
        self.release = release
        self.statics = statics
        self.concrete: dict[tuple[str, tuple[LeafKey, ...]], Program] = {}
        self.symbolic: dict[tuple[Any, ...], SymbolicProgram] = {}
        self.symbolic_lock = threading.Lock()
        self.unusable: list[tuple[IndexEntry, str]] = []
        self.skipped: list[tuple[str, str, str]] = []
        # Background loading (load(background=True)): the running load, the programs
        # whose load was started (by it or by a call), and the errors it met, each
        # raised by the first call of its program (by id: programs are never dropped).
        self.background: BackgroundLoad[Program | tuple[LeafKey, ...]] | None = None
        self._attempted: set[int] = set()
        self._failed: dict[int, Exception] = {}
        here = cache.environment.as_dict()
        # Quarantined rows too: their executable is never run, but the signature stays
        # servable by recompiling their portable HLO (the fallback ladder). Rows whose
        # identity or signature does not check are skipped before the choice; then only
        # the rows of the program each signature serves are filed (selection).
        # entries: the name's rows when the caller already read them (one read per load).
        if entries is None:
            entries = cache.entries_named(name, state=None)
        rows, refused = checked_rows(entries, cache.signing_key, cache.require_signatures)
        for entry, reason in refused:
            log.warning("aot.load(%r): skipping %s (%s): %s", name, entry.key[:12], entry.signature, reason)
            self.skipped.append((entry.key, entry.signature, reason))
        self.refused = [(e.key, e.signature, reason) for e, reason in refused]
        declared = self._declared()
        if release is None and refused:
            declared = trusted_refs(declared, {e.key for e, _ in refused})
        self.selection = select_rows(rows, declared, cache.environment.digest, release=release)
        # Rows whose signature column says which call they serve are filed when that
        # call (or a load of them) first needs them (aot.cache.serving.pending).
        self._here = here
        self.pending = PendingRows(self._file_row)
        self.checked = CheckedManifests()  # parsed by filing, for the loader
        for entry in self.selection.rows:
            keys = leaf_keys_of(entry.signature) if statics is None else None
            if keys is not None:
                self.pending.hold(keys, entry)
            # statics: only the rows of these static values (aot.cache.serving.statics).
            elif statics is None or describe_statics(statics_of_manifest_json(entry.manifest)) == statics:
                self._file(entry, here)
        log.info("aot.load(%r): %d signatures filed, %d at their first use, %d symbolic",
                 name, len(self.concrete), len(self.pending), len(self.symbolic))
        self.env = cache.environment.digest

    def _declared(self) -> Sequence[Declared]:
        """The name's refs (read once), or the members of ``self.release``."""
        if self.release is None:
            return self.cache.refs_named(self.name)
        members = self.cache.release_members(self.release, self.name)
        if members is None:
            import difflib

            labels = [r.label for r in self.cache.releases()]
            close = difflib.get_close_matches(self.release, labels, n=3)
            hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise ReleaseNotFoundError(
                f"aot.load({self.name!r}, release={self.release!r}): no release labelled "
                f"{self.release!r} in the cache at {self.cache.display_location}; {hint}`aot release ls` "
                "lists the labels (a replica that names none serves the cache's default, "
                "`aot release default`)"
            )
        if not members:
            raise ReleaseNotFoundError(
                f"aot.load({self.name!r}, release={self.release!r}): release {self.release!r} has no "
                f"member named {self.name!r}; load a label that has it (`aot release show LABEL`), or "
                f"add it to this release in the run that declared it (aot warmup MANIFEST --release "
                f"{self.release} with that run's --run ID or commit)"
            )
        return members

    # ------------------------------------------------------------ filing rows

    def _file_row(self, entry: IndexEntry) -> Program | None:
        return self._file(entry, self._here)

    def _file(self, entry: IndexEntry, here: dict[str, str]) -> Program | None:
        """Files one index row under its signature (or skips or quarantines it): the
        program it was filed under, if concrete."""
        try:
            manifest = Manifest.from_json(entry.manifest)
            reason = cannot_serve_here(manifest, here)
            if reason is None and self.statics is None and manifest.statics:
                # Read as statics-free from its signature column (aot.cache.serving.statics).
                reason = (
                    f"its manifest has static arguments ({describe_statics(manifest.statics)}) that "
                    f"its index row's signature column ({entry.signature}) does not name: the row "
                    "was altered; run `aot verify` and recompile it"
                )
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
        except PROCESS_LIMITS as exc:
            reason = f"not usable in this process: {str(exc) or repr(exc)}"
        except AotError as exc:
            self.quarantine(entry, f"unreadable manifest: {exc}")
            self.unusable.append((entry, f"unreadable manifest: {exc}"))
            return None
        if reason is not None:
            self.skipped.append(skipped(self, entry, reason, here))
            return None
        if manifest.is_symbolic:
            self._add_symbolic(entry, manifest, structure, treedef, dtypes)
            return None
        problems = manifest_problems(manifest)
        if any(p.startswith("in_tree") for p in problems):
            # Its input structure cannot be trusted, so it cannot even be filed
            # under a signature; never served, never recompiled.
            reason = "manifest contradicts its fingerprints: " + "; ".join(problems)
            self.quarantine(entry, reason)
            self.unusable.append((entry, reason))
            return None
        if problems and entry.ok and self.quarantine(
            entry, "manifest contradicts its fingerprints: " + "; ".join(problems)
        ):
            entry = self.cache.reread(entry) or entry
        elif not problems:
            self.checked.keep(entry, manifest)
        leaves = tuple((a.shape, a.dtype, a.weak_type) for a in args)
        program = self.concrete.setdefault(
            (structure, leaves),
            Program(manifest.signature, structure, treedef, leaves, tuple(a.path for a in args),
                    names=manifest.arg_names),
        )
        # Rows come oldest first and are inserted at the front: the newest row of a
        # signature is tried first (a name recompiled from changed code must not keep
        # serving the old program).
        self.place(program, entry, front=True)
        return program

    def _add_symbolic(
        self, entry: IndexEntry, manifest: Manifest, structure: str, treedef: PyTreeDef,
        dtypes: tuple[tuple[Any, bool], ...],
    ) -> None:
        if not entry.ok:  # its portable HLO is what is damaged: nothing to compile from
            log.warning("%s (%s): symbolic entry %s is quarantined: %s", self.name,
                        manifest.signature, entry.key[:12], entry.state_reason)
            return
        from aot.symbolic import patterns_of  # only names with symbolic entries need it

        patterns = patterns_of(manifest.args)
        key = (structure, patterns, dtypes, manifest.symbolic_constraints)
        program = self.symbolic.setdefault(key, SymbolicProgram(
            manifest.signature, structure, treedef, patterns, dtypes,
            tuple(str(a["path"]) for a in manifest.args), manifest.symbolic_constraints,
        ))
        # Newest first; this environment's rows before others (same portable HLO kind).
        program.entries.insert(0, entry)
        program.entries.sort(key=lambda e: e.env_fp != self.cache.environment.digest)

    def place(self, program: Program, entry: IndexEntry, *, front: bool = False) -> None:
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

    def quarantine(self, entry: IndexEntry, reason: str) -> bool:
        """Quarantines ``entry`` while its row is still as read (compare-and-set);
        True when it did. Serving with ``strict=True`` never writes to the cache: the
        row is logged and not used, and False returned. Either way the refusal is told
        to listeners (a read-only replica cannot mark the row, but refused the copy)."""
        self.cache.stats.quarantined(entry)
        if self.strict:
            log.warning("aot.load(%r): not using %s: %s", self.name, entry.key[:12], reason)
            return False
        return self.cache.quarantine(entry, reason)

    @property
    def writes(self) -> bool:
        """Whether serving this name may write to the cache (quarantine, store)."""
        return not self.strict and not self.cache.read_only

    # ------------------------------------------------------------ inspection

    def find(self, structure: str, keys: tuple[LeafKey, ...]) -> Program | None:
        """The program of a call's structure and leaf keys, filing the rows held for
        those keys first; None: no filed row serves them (:meth:`file_all` may)."""
        program = self.concrete.get((structure, keys))
        if program is None and self.pending.held:
            self.pending.file(keys)
            program = self.concrete.get((structure, keys))
        return program

    def file_all(self) -> None:
        """Files every row held for its first use (what needs every program calls it)."""
        if self.pending.held:
            self.pending.file_all()

    def _can_serve(self, program: Program) -> bool:
        return program.executable is not None or bool(program.local) or (
            not self.strict and bool(program.foreign or program.quarantined)
        )

    def servable(self) -> list[str]:
        """Signatures that can be served: with a row for this environment, or (unless
        strict) with any row whose portable HLO can be recompiled, and (unless strict)
        symbolic signatures, compiled per concrete shape."""
        self.file_all()
        concrete = [p.signature for p in self.concrete.values() if self._can_serve(p)]
        symbolic = [] if self.strict else [p.signature for p in self.symbolic.values() if p.entries]
        return sorted(concrete + symbolic)

    def has_servable(self) -> bool:
        """Whether :meth:`servable` is not empty, filing held rows one group at a time
        only until a servable one is found (start-up needs one, not every one)."""
        if any(map(self._can_serve, list(self.concrete.values()))):
            return True
        if not self.strict and any(p.entries for p in self.symbolic.values()):
            return True
        while (programs := self.pending.file_next()) is not None:
            if any(map(self._can_serve, programs)):
                return True
        return False

    @property
    def signatures(self) -> list[str]:
        """Every stored signature: concrete ones, and symbolic ones (``f32[b,784]``)."""
        self.file_all()
        return sorted(
            [p.signature for p in self.concrete.values()]
            + [p.signature for p in self.symbolic.values()]
        )

    def paths(self) -> list[str]:
        """Every input path of the stored programs (concrete and symbolic)."""
        self.file_all()
        programs = list(self.concrete.values()) + list(self.symbolic.values())
        return sorted({p for program in programs for p in program.paths})

    def unloaded(self) -> list[Program]:
        self.file_all()
        return [p for p in self.concrete.values() if p.executable is None]

    def units(self) -> list[Program | tuple[LeafKey, ...]]:
        """What loading every program takes, without filing anything: the filed
        programs not loaded yet, and the leaf keys of each group of held rows
        (:meth:`load_unit` files a group, then loads its programs)."""
        return [*(p for p in list(self.concrete.values()) if p.executable is None), *self.pending.keys()]

    def load_unit(self, unit: Program | tuple[LeafKey, ...]) -> None:
        """Loads one unit of :meth:`units` now (raises what loading raises)."""
        for program in [unit] if isinstance(unit, Program) else self.pending.file(unit):
            self.executable(program)

    # ------------------------------------------------------------ loading

    def executable(self, program: Program) -> MeshExecutable:
        """``program``'s executable, loaded now unless it is (waits for a background
        load of it)."""
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

    def start_background(self, workers: int | None = None) -> None:
        """Starts loading every program not loaded yet in background threads; closing
        the cache cancels the loads not started and waits for the running ones."""
        if self.background is not None:
            return
        units = self.units()  # held rows are filed by the background threads too
        if units:
            from aot.cache.serving.background import BackgroundLoad

            self.background = BackgroundLoad(units, self._load_in_background, workers=workers)
            self.cache.hold_background(self.background)

    def _load_in_background(self, unit: Program | tuple[LeafKey, ...]) -> None:
        """One background task: files a group of held rows, and loads each program
        unless a call already did (or is); keeps the error for the first call of it."""
        for program in [unit] if isinstance(unit, Program) else self.pending.file(unit):
            self._load_program_in_background(program)

    def _load_program_in_background(self, program: Program) -> None:
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

    # ------------------------------------------------------------ the fallback ladder

    def _load(self, program: Program) -> MeshExecutable:
        """Step one: the newest intact executable of this environment; else step two
        (:func:`recompile_program`), unless strict; else an error naming what was tried."""
        _pause("serve.loading")
        problems: list[str] = []
        unusable: list[IndexEntry] = []  # rows of this environment that failed to load
        limits: list[BaseException] = []  # failures of this process (PROCESS_LIMITS)
        rereads = 0
        while program.local:
            entry = program.local[0]
            try:
                # Not a use: the calls are (aot.cache.stats_recorder).
                checked = self.checked.take(entry)
                return self.cache.load(entry) if checked is None else self.cache.load(entry, manifest=checked)
            except PROCESS_LIMITS as exc:
                program.local.remove(entry)
                problems.append(str(exc) or repr(exc))
                log.warning(
                    "%s (%s): not using %s in this process (not quarantined): %r",
                    self.name, program.signature, entry.key[:12], exc,
                )
                unusable.append(entry)  # its portable HLO may still compile here
                limits.append(exc)
            except (CorruptArtifactError, IncompatibleEnvironmentError) as exc:
                program.local.remove(entry)
                # The row may have changed since it was read (gc and a new warm-up
                # rewrite a key with fresh blobs): a stale snapshot must neither condemn
                # the fresh row nor hide it. Quarantine only the row that failed.
                fresh = self.cache.reread(entry)
                if fresh is not None and not same_row(fresh, entry) and rereads < MAX_REREADS:
                    rereads += 1
                    log.info(
                        "%s (%s): row %s changed since it was read (%s); using the row as it is now",
                        self.name, program.signature, entry.key[:12], exc,
                    )
                    self.place(program, fresh, front=True)
                    continue
                problems.append(str(exc))
                if fresh is None:
                    continue  # deleted meanwhile: nothing to quarantine
                # Under strict=True or read-only: logged, never written.
                if not self.quarantine(entry, str(exc)) and self.writes:
                    changed = self.cache.reread(entry)
                    if changed is not None and rereads < MAX_REREADS:
                        rereads += 1
                        self.place(program, changed, front=True)
                        continue
                # Why it was refused, for the recompile to say (the row as read has none).
                entry = replace(entry, state_reason=str(exc))
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
            if limits:
                raise limits[0]
            raise strict_refusal(self, program, problems, unusable)
        try:
            return recompile_program(self, program, candidates)
        except CorruptArtifactError:
            if limits:  # the recompiled program meets the same limit: say which
                raise limits[0] from None
            raise


def strict_refusal(
    table: ProgramTable, program: Program, problems: Sequence[str], unusable: Sequence[IndexEntry],
) -> AotError:
    """Why ``strict=True`` cannot serve ``program`` without compiling."""
    if program.foreign or unusable:
        entry = program.foreign[0] if program.foreign else unusable[0]
        manifest = Manifest.from_json(entry.manifest)
        diffs = manifest.environment.diff(table.cache.environment)
        described = tuple(d.describe() for d in diffs) or tuple(problems)
        return IncompatibleEnvironmentError(
            f"{table.name} ({program.signature}): no executable for this environment "
            f"and strict=True forbids compiling: {'; '.join(described)}. Compile it for "
            "this environment in CI (aot warmup) or load with strict=False",
            described,
        )
    reasons = "; ".join(problems) or "; ".join(
        f"{e.key[:12]}: {e.state_reason or 'quarantined'}" for e in program.quarantined
    )
    return CorruptArtifactError(
        f"{table.name} ({program.signature}): the stored executable is quarantined "
        f"({reasons}) and strict=True forbids recompiling it. Run `aot verify`, "
        "recompile it (aot warmup / aot compile) or load with strict=False"
    )


def recompile_program(
    table: ProgramTable, program: Program, candidates: Sequence[IndexEntry],
) -> MeshExecutable:
    """Step two: compiles the first candidate's portable HLO that compiles here,
    and stores the result (unless the cache is read-only). In a multi-process job whose
    program spans processes, once for the slice (:mod:`aot.slices`): the leader
    recompiles and stores, the others load what it stored."""
    if table.cache.read_only:
        return _recompile(table, program, candidates)[0]
    first = candidates[0]
    by_id = {int(d.id): d for d in jax.devices()}
    try:
        devices = [by_id[i] for i in json.loads(first.manifest).get("device_ids", ()) if i in by_id]
    except ValueError:  # an unreadable manifest: the ladder says so in this process
        devices = []
    return once_per_slice(
        f"{first.key}/recompiled/{table.cache.environment.digest}", devices,
        what=f"{table.name} ({program.signature})",
        lead=lambda: _recompile(table, program, candidates),
        publish=lambda done: done[1] or "",
        follow=lambda key: _recompiled_by_leader(table, program, candidates, key),
    )[0]


def _recompiled_by_leader(
    table: ProgramTable, program: Program, candidates: Sequence[IndexEntry], key: str,
) -> tuple[MeshExecutable, str | None]:
    """What the slice's leader recompiled and stored under ``key``; recompiled here when
    this process cannot load it."""
    entry = table.cache.index.get(key) if key else None
    if entry is not None and entry.ok:
        try:
            executable = table.cache.load(entry)
            program.local.append(entry)
            return executable, key
        except AotError as exc:
            log.warning("%s (%s): could not load %s, recompiled by the slice's leader (%s); recompiling it "
                        "here", table.name, program.signature, key[:12], exc)
    return _recompile(table, program, candidates)


def _recompile(
    table: ProgramTable, program: Program, candidates: Sequence[IndexEntry],
) -> tuple[MeshExecutable, str | None]:
    """:func:`recompile_program` in this process: the executable and the key it was
    stored under (None: not stored)."""
    errors: list[str] = []
    window: list[ExportWindowError] = []
    environment = table.cache.environment
    pending = list(candidates)
    rereads = 0
    while pending:
        entry = pending.pop(0)
        start = time.perf_counter()
        try:
            # Only the portable HLO is needed: the executable blob may be corrupt.
            artifact = table.cache.artifact(entry, roles=(PORTABLE_HLO,))
            manifest = artifact.manifest
            diffs = manifest.environment.diff(environment)
            from aot.recompile import recompile  # the ladder's middle step: a plain load never compiles

            rebuilt = recompile(artifact)
            executable = load_executable(rebuilt, current=environment)
        except IntegrityError:
            raise  # unsigned or tampered: never compiled from, and said as such
        except AotError as exc:
            fresh = table.cache.reread(entry)
            if fresh is not None and not same_row(fresh, entry) and rereads < MAX_REREADS:
                rereads += 1  # a stale snapshot: try the row as it is now, first
                if fresh.ok and fresh.env_fp == environment.digest:
                    try:
                        return table.cache.load(fresh), fresh.key
                    except AotError as again:
                        errors.append(f"{fresh.key[:12]}: {again}")
                pending.insert(0, fresh)
                continue
            errors.append(f"{entry.key[:12]}: {exc}")
            if isinstance(exc, ExportWindowError):
                window.append(exc)
            continue
        reason = describe_differences(diffs) or f"stored executable unusable: {_why_unusable(entry)}"
        log.warning("%s (%s): recompiled from portable HLO (%s)", table.name, program.signature, reason)
        table.cache.stats.recompiled(
            table.env, table.name, program.signature, reason, time.perf_counter() - start
        )
        if not table.cache.read_only:
            # Replaces a quarantined row of the same key; rewrites corrupt blobs.
            stored = table.cache.put_artifact(rebuilt)
            program.local.append(stored)
            return executable, stored.key
        return executable, None
    if window and len(window) == len(errors):  # another release's entries, none callable here
        raise ExportWindowError(
            f"{table.name} ({program.signature}): no executable for this JAX release, and no stored "
            f"portable HLO it can call: {'; '.join(errors)}",
            tuple(d for exc in window for d in exc.differences),
        )
    raise CorruptArtifactError(
        f"{table.name} ({program.signature}): cannot recompile from portable HLO: "
        + "; ".join(errors)
    )


def _why_unusable(entry: IndexEntry) -> str:
    """What made ``entry`` unusable, without its name (the line names the program) nor
    the advice (what to run): the recompile that follows is the remedy."""
    reason = (entry.state_reason or "quarantined").removeprefix(f"{entry.name} ({entry.key[:12]}): ")
    return reason.split("; ")[0]


def skipped(table: ProgramTable, entry: IndexEntry, reason: str, here: dict[str, str]) -> tuple[str, str, str]:
    """Logs why ``entry`` is not served in this process; returns (key, signature, why).

    A row of another platform (a TPU entry, on a CPU replica) whose signature a row of
    this environment serves is nothing to this host: said at the info level only. Any
    other skipped row is a warning (it leaves its signature unserved, or without the
    row declared for it)."""
    try:
        platform = json.loads(entry.manifest).get("environment", {}).get("parts", {}).get("platform")
    except (ValueError, AttributeError):
        platform = None
    elsewhere = platform is not None and platform != here.get("platform")
    level = logging.INFO if elsewhere and table.selection.served.get(entry.signature) else logging.WARNING
    log.log(level, "aot.load(%r): skipping %s (%s): %s", table.name, entry.key[:12], entry.signature, reason)
    return (entry.key, entry.signature, reason)


def cannot_serve_here(manifest: Manifest, here: dict[str, str]) -> str | None:
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
        return (f"compiled for {environment_name(manifest.environment.as_dict())}, this process runs "
                f"{environment_name(here)}")
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


def _pause(point: str) -> None:
    """:func:`aot.cache.pauses.reached` without importing that writers' module on the
    serving path: a test that set a hook has imported it; ``AOT_TEST_PAUSE`` (a child
    process) imports it here."""
    pauses = sys.modules.get("aot.cache.pauses")
    if pauses is None and os.environ.get("AOT_TEST_PAUSE"):
        from aot.cache import pauses
    if pauses is not None:
        pauses.reached(point)

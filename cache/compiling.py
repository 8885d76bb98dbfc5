"""Compiling through a cache: lower a function, then load the stored executable (a
hit) or compile it and store the result (a miss); :class:`CompileResult` says which.

A symbolic (shape-polymorphic) computation has nothing to compile yet: its portable
HLO is stored, and ``aot.load`` compiles it per concrete shape.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from aot.artifact import Artifact
from aot.errors import CorruptArtifactError, IncompatibleEnvironmentError, ReadOnlyCacheError
from aot.build import build_artifact, build_symbolic_artifact
from aot.cache.store import unstored_entry
from aot.cache.index.refs import RefOrigin
from aot.cache.pauses import reached
from aot.slices import once_per_slice

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.index.entry import IndexEntry
    from aot.computation import MeshComputation
    from aot.executable import MeshExecutable

log = logging.getLogger(__name__)

#: What a slice's leader publishes when it will store nothing (a read-only cache).
_UNSTORED = "unstored"

__all__ = ["CompileResult", "artifact_of", "compile_entry", "put_entry"]


@dataclass(frozen=True, slots=True)
class CompileResult:
    """What :meth:`aot.Cache.compile_entry` (:func:`compile_entry`) did: the
    executable, its entry, hit or miss.

    ``executable`` is None for a symbolic (shape-polymorphic) program: it is stored
    as portable HLO and compiled per concrete shape by ``aot.load``; and on a hit for a
    device target (``target=``), whose executable cannot be loaded on this host.
    """

    executable: MeshExecutable | None
    entry: IndexEntry
    hit: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.entry.key,
            "name": self.entry.name,
            "signature": self.entry.signature,
            "hit": self.hit,
            "seconds": round(self.seconds, 4),
            "compile_seconds": self.entry.compile_seconds,
            "raw_size": self.entry.raw_size,
            "stored_size": self.entry.stored_size,
        }


def artifact_of(item: MeshComputation | MeshExecutable | Artifact) -> Artifact:
    """The artifact to store for a computation (compiled now), an executable or an
    artifact (:meth:`aot.Cache.put`)."""
    from aot.computation import MeshComputation
    from aot.executable import MeshExecutable

    if isinstance(item, MeshComputation) and item.symbolic:
        return build_symbolic_artifact(item)
    if isinstance(item, MeshComputation):
        executable = item.compile()
        return build_artifact(executable, item.portable_hlo(executable))
    if isinstance(item, MeshExecutable):
        computation = getattr(item, "computation", None)
        hlo = computation.portable_hlo(item) if computation is not None else None
        return build_artifact(item, hlo)
    if isinstance(item, Artifact):
        return item
    raise TypeError(
        f"Cache.put takes a MeshComputation, MeshExecutable or Artifact, got "
        f"{type(item).__name__}"
    )


def put_entry(cache: ArtifactStore, item: MeshComputation | MeshExecutable | Artifact) -> IndexEntry:
    """Stores ``item`` (:meth:`aot.Cache.put`; :func:`artifact_of`). A computation whose
    devices span the processes of a job is compiled once for the slice, as
    :func:`compile_entry` does: its leader compiles and stores it, the others wait
    (bounded) and return the entry it stored."""
    from aot.computation import MeshComputation

    if not isinstance(item, MeshComputation) or item.symbolic or item.target is not None:
        return cache.put_artifact(artifact_of(item))  # nothing to compile, or deviceless
    computation = item
    key = computation.fingerprint

    def stored() -> IndexEntry | None:
        entry = cache.index.get(key)
        return entry if entry is not None and entry.ok else None

    def put_here() -> IndexEntry:
        log.warning(
            "%s (%s): the slice's leader stored it, but the cache at %s does not have it: the hosts of a "
            "slice should share one cache (a PostgreSQL index, or one folder); compiling it here",
            computation.name, key, cache.display_location,
        )
        return cache.put_artifact(artifact_of(computation))

    return once_per_slice(
        key, computation.devices, what=computation.name,
        lead=lambda: cache.put_artifact(artifact_of(computation)), ready=stored,
        follow=lambda _: stored() or put_here(),
    )


def compile_entry(
    cache: ArtifactStore, fn: Callable[..., Any], *args: Any, name: str | None = None, pmap: bool = False,
    origin: RefOrigin | None = None, **lower_kwargs: Any,
) -> CompileResult:
    """Lowers ``fn``; on a hit loads the stored executable, on a miss compiles and
    stores it (compiles without storing into a read-only cache). Either way a writable
    cache's ref of the entry's (name, signature, environment) is set to its key
    (``origin``: who sets it; default ``Cache.compile`` and the CI commit): compiling
    the current code declares it the one served."""
    result = _compile_entry(cache, fn, *args, name=name, pmap=pmap, **lower_kwargs)
    if not cache.read_only:
        cache.set_refs([result.entry], origin if origin is not None else RefOrigin("Cache.compile"))
    return result


def _compile_entry(
    cache: ArtifactStore, fn: Callable[..., Any], *args: Any, name: str | None = None, pmap: bool = False,
    **lower_kwargs: Any,
) -> CompileResult:
    from aot.lowering import lower, lower_pmap  # serving never lowers

    start = time.perf_counter()
    computation = (lower_pmap if pmap else lower)(fn, *args, name=name, **lower_kwargs)
    if computation.symbolic:
        return _store_symbolic(cache, computation, start)
    if not cache.read_only:
        from aot.cache.names import check_name

        check_name(computation.name)  # before an XLA compile that could not be stored
    if computation.target is not None:
        # A target's compile is deviceless: every process may do it (warm-ups run it in one).
        return _hit_or_compile(cache, computation, start)
    key = computation.fingerprint
    # A leader whose cache is read-only stores nothing another process could load: it
    # says so before it compiles, and the others compile at the same time. A follower's
    # read-only cache (aot compile --distributed: process 0 alone writes) loads the
    # leader's entry.
    return once_per_slice(
        key, computation.devices, what=computation.name,
        lead=lambda: _lead(cache, computation, start),
        ready=lambda: _hit(cache, computation, start),
        announce=lambda: _UNSTORED if cache.read_only else None,
        follow=lambda said: _stored_by_leader(cache, computation, start, stored=said != _UNSTORED),
    )


def _lead(cache: ArtifactStore, computation: MeshComputation, start: float) -> CompileResult:
    """The leader's :func:`_hit_or_compile`; a program it compiled and stored for processes
    of a job is served from the stored bytes here too, as in every other process: on JAX
    0.12 an executable compiled in one process and its deserialized copies in the others
    never meet in their collectives (the job hangs)."""
    result = _hit_or_compile(cache, computation, start)
    if result.hit or cache.read_only or len({d.process_index for d in computation.devices}) < 2:
        return result
    return replace(result, executable=cache.load(result.entry), seconds=time.perf_counter() - start)


def _hit(cache: ArtifactStore, computation: MeshComputation, start: float) -> CompileResult | None:
    """The stored entry of ``computation``, loaded (None: none usable; a corrupt one is
    quarantined)."""
    entry = cache.index.get(computation.fingerprint)
    if entry is not None and entry.ok and computation.target is not None and _retune(computation, entry):
        return None  # compiled again, tuned: it replaces the stored row (aot.cache.store.commit)
    if entry is not None and entry.ok and computation.target is not None:
        # Stored for an accelerator this host does not have: nothing to load here.
        cache.touch(entry.key)
        return CompileResult(None, entry, True, time.perf_counter() - start)
    if entry is not None and entry.ok:
        try:
            executable = cache.load(entry)
            cache.touch(entry.key)
            return CompileResult(executable, entry, True, time.perf_counter() - start)
        except (CorruptArtifactError, IncompatibleEnvironmentError) as exc:
            cache.quarantine(entry, str(exc))
    return None


def _retune(computation: MeshComputation, entry: IndexEntry) -> bool:
    """A GPU entry stored with XLA's defaults whose target has autotune results now."""
    if computation.target is None or not computation.target.room.CAPTURED_CONFIGS:
        return False
    from aot.platforms.cuda import needs_retune
    from aot.platforms.tuning import Tuning

    stored = Tuning.parse(json.loads(entry.manifest).get("autotune")) if entry.manifest else None
    if not needs_retune(computation.devices, stored):
        return False
    log.info("%s: stored with XLA's default autotune configs; the GPU's results are captured now: compiling "
             "it again with them", computation.name)
    return True


def _hit_or_compile(cache: ArtifactStore, computation: MeshComputation, start: float) -> CompileResult:
    hit = _hit(cache, computation, start)
    if hit is not None:
        return hit
    reached("slice.compiling")
    executable = computation.compile()
    if cache.read_only:
        log.info("read-only cache: compiled %s without storing it", computation.name)
        artifact = build_artifact(executable, None)
        stored = unstored_entry(artifact)
    else:
        artifact = build_artifact(executable, computation.portable_hlo(executable))
        stored = cache.put_artifact(artifact)
    return CompileResult(executable, stored, False, time.perf_counter() - start)


def _stored_by_leader(
    cache: ArtifactStore, computation: MeshComputation, start: float, *, stored: bool = True,
) -> CompileResult:
    """What the slice's leader stored (it said so); compiled here when this process
    cannot see it (a cache per host instead of one shared by the slice), or when the
    leader stores nothing (``stored=False``: its cache is read-only)."""
    if not stored:
        return _hit_or_compile(cache, computation, start)
    hit = _hit(cache, computation, start)
    if hit is not None:
        return hit  # a hit here: this process compiled nothing
    log.warning(
        "%s (%s): the slice's leader stored it, but the cache at %s does not have it: the hosts of a "
        "slice should share one cache (a PostgreSQL index, or one folder); compiling it here",
        computation.name, computation.fingerprint, cache.display_location,
    )
    return _hit_or_compile(cache, computation, start)


def _store_symbolic(cache: ArtifactStore, computation: MeshComputation, start: float) -> CompileResult:
    """Stores a symbolic computation's portable HLO (nothing to compile yet)."""
    entry = cache.index.get(computation.fingerprint)
    if entry is not None and entry.ok:
        return CompileResult(None, entry, True, time.perf_counter() - start)
    if cache.read_only:
        raise ReadOnlyCacheError(
            f"cannot store the symbolic program {computation.name} "
            f"({computation.signature}): the cache at {cache.display_location} is "
            "read-only, and a symbolic program has no executable to return without "
            "storing it; open the cache writable or lower with concrete specs"
        )
    stored = cache.put_artifact(build_symbolic_artifact(computation))
    return CompileResult(None, stored, False, time.perf_counter() - start)

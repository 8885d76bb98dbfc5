"""One item of a warm-up, in steps, and what running it returns.

Every way of running a warm-up (one item after another, in parallel with worker
processes, on any executor) goes through the same three steps: :func:`lower_here`
(prepare, lower, look up: a hit or a failure ends there), the XLA compile
(:func:`compile_lowered`: in a compile thread, or inline in a worker process or an
executor's task), and :func:`store_here` (export the portable HLO, serialize, put,
give up the compile claim). With compile claims, the claim between the first two
steps, and the runs that put the steps together
(:func:`~aot.cache.warmup.claims.warmup_task`), live in :mod:`aot.cache.warmup.claims`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aot.cache.pauses import reached
from aot.errors import CorruptArtifactError, IncompatibleEnvironmentError, SliceError, SpecError
from aot.signatures import Signature
from aot.cache.warmup.failures import Failure
from aot.cache.warmup.manifest import WarmupItem
from aot.cache.warmup.functions import lower_item, x64_hint, x64_mode

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = [
    "SIGNATURE_WIDTH",
    "Deferred",
    "ItemResult",
    "Lowered",
    "compile_lowered",
    "follow_here",
    "load_stored",
    "lower_here",
    "store_here",
    "task_cache", "task_options",
]

#: Width of the signature in a report line (both ends kept; --json has it whole).
SIGNATURE_WIDTH = 72

# ---------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class ItemResult:
    """What happened to one item: ``compiled``, ``hit`` or ``failed`` (with the error)."""

    index: int
    name: str
    label: str
    status: str
    seconds: float
    key: str | None = None
    env_fp: str | None = None  # the entry's environment (its ref's slot)
    signature: str | None = None
    compile_seconds: float | None = None
    raw_size: int | None = None
    stored_size: int | None = None
    error: str | None = None
    source: str | None = None
    traceback: str | None = None  # of a failure (shown by `aot warmup --debug`)
    arguments: Signature | None = None  # the signature with pytree paths
    lowered: bool | None = None  # True, but None for a failure (every item is lowered)
    # True: a hit another runner compiled while this one waited for its claim.
    waited: bool = False

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def describe(self, width: int | None = SIGNATURE_WIDTH) -> str:
        """``label (x: f32[8], ...) 0.27s``, or ``label: error`` for a failure."""
        if self.status == "failed":
            return f"{self.label}: {self.error}"
        shown = self.arguments.compact(width) if self.arguments is not None else self.signature
        return f"{self.label} ({shown}) {self.seconds:.2f}s"

    def line(self, width: int | None = SIGNATURE_WIDTH) -> str:
        """One report line: ``compiled  label (...) 0.27s`` / ``FAILED    label: error``
        (a multi-line error's further lines are indented under it)."""
        status = {"compiled": "compiled", "hit": "hit", "failed": "FAILED"}[self.status]
        first, *rest = self.describe(width).splitlines() or [""]
        return "\n".join([f"{status:<9} {first}", *(f"{'':10}{r}" for r in rest)])

    @classmethod
    def failed(
        cls, index: int, item: WarmupItem, exc: BaseException, seconds: float = 0.0
    ) -> ItemResult:
        failure = Failure.of(exc)
        return cls(
            index, item.name, item.label, "failed", seconds, error=failure.describe(),
            source=item.source, traceback=failure.traceback,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "status": self.status,
            "key": self.key,
            "signature": self.signature,
            "seconds": round(self.seconds, 4),
            "compile_seconds": self.compile_seconds,
            "raw_size": self.raw_size,
            "stored_size": self.stored_size,
            "error": self.error,
            "source": self.source,
            "arguments": self.arguments.to_list() if self.arguments is not None else None,
            "lowered": self.lowered,
            "waited": self.waited,
            "traceback": self.traceback,
        }


def _done(index: int, item: WarmupItem, entry: Any, status: str, seconds: float) -> ItemResult:
    return ItemResult(
        index, item.name, item.label, status, seconds, key=entry.key, env_fp=entry.env_fp,
        signature=entry.signature, compile_seconds=entry.compile_seconds,
        raw_size=entry.raw_size, stored_size=entry.stored_size, source=item.source,
        arguments=Signature.from_manifest_json(entry.manifest, entry.signature), lowered=True,
    )


# ---------------------------------------------------------------- one item, in steps


@dataclass(slots=True)
class Lowered:
    """An item lowered here that is not in the cache: it waits for its XLA compile."""

    index: int
    item: WarmupItem
    computation: Any
    seconds: float  # spent on it so far (prepare, lower, look up)

    @property
    def key(self) -> str:
        return self.computation.fingerprint


def _failed(index: int, item: WarmupItem, exc: BaseException, seconds: float) -> ItemResult:
    log.debug("warmup: %s failed", item.label, exc_info=exc)
    if isinstance(exc, SpecError):
        exc = x64_hint(item, exc)
    return ItemResult.failed(index, item, exc, seconds)


def _load_hit(cache: ArtifactStore, index: int, item: WarmupItem, entry: Any, start: float) -> ItemResult | None:
    """Loads a stored entry, which checks that it is servable: the hit, or None when
    it did not load (then it is quarantined, and compiled again)."""
    try:
        # A symbolic entry has no executable to load, and one compiled for a device
        # target cannot be loaded on this host: its digests are checked by verify.
        if entry.exe_digest is not None and item.device_target is None:
            cache.load(entry)
    except (CorruptArtifactError, IncompatibleEnvironmentError) as exc:
        cache.quarantine(entry, str(exc))
        return None
    return _done(index, item, entry, "hit", time.perf_counter() - start)


@dataclass(frozen=True, slots=True)
class Deferred:
    """An item lowered here whose compile someone else holds a claim on (another
    runner, or another process of this warm-up): the warm-up waits for its entry at
    the end (:meth:`~aot.cache.warmup.claims.WarmupClaims.wait_for`). Plain data:
    a worker process sends it back in place of an :class:`ItemResult`."""

    index: int
    item: WarmupItem
    key: str
    seconds: float  # spent on it so far (prepare, lower, look up)


def load_stored(cache: ArtifactStore, pending: Lowered | Deferred, *, waited: bool = False) -> ItemResult | None:
    """The hit of an item lowered (here or in another process) whose key is stored now
    (another runner compiled it), or None."""
    start = time.perf_counter()
    entry = cache.lookup(pending.key)
    if entry is None or not entry.ok:
        return None
    result = _load_hit(cache, pending.index, pending.item, entry, start)
    if result is None:
        return None
    return dataclasses.replace(result, seconds=pending.seconds + result.seconds, waited=waited)


def lower_here(cache: ArtifactStore, index: int, item: WarmupItem) -> ItemResult | Lowered:
    """The hit (lowered, and its key found stored), a failure, or the lowered item to
    compile. Every item is lowered: what a trace reads (files, environment variables)
    cannot be proven unchanged without tracing; only the compile is skipped on a hit."""
    from aot.cache.names import check_name

    start = time.perf_counter()
    with x64_mode(item):
        try:
            computation = lower_item(item)
            check_name(computation.name)  # before an XLA compile that could not be stored
            key = computation.fingerprint
            entry = cache.lookup(key)
            if entry is not None and entry.ok:
                result = _load_hit(cache, index, item, entry, start)
                if result is not None:
                    return result
            if computation.symbolic:  # nothing to compile: its portable HLO is stored
                from aot.build import build_symbolic_artifact

                entry = cache.put_artifact(build_symbolic_artifact(computation))  # the run sets refs
                return _done(index, item, entry, "compiled", time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - every item is tried; failures are recorded
            return _failed(index, item, exc, time.perf_counter() - start)
    return Lowered(index, item, computation, time.perf_counter() - start)


def compile_lowered(lowered: Lowered) -> tuple[Any, float]:
    """The XLA compile of a lowered item (in any thread: XLA releases the GIL)."""
    reached("warmup.compiling")
    start = time.perf_counter()
    with x64_mode(lowered.item):
        executable = lowered.computation.compile()
    return executable, time.perf_counter() - start


def store_here(
    cache: ArtifactStore, lowered: Lowered, compiled: Future[tuple[Any, float]],
    release: Callable[[str], object] | None = None,
) -> ItemResult:
    """Exports, serializes and stores a compiled item; its result. ``release``: gives
    up the compile claim on its key then (stored, or failed): the run's
    :meth:`~aot.cache.warmup.claims.WarmupClaims.release_key`."""
    from aot.build import build_artifact

    index, item = lowered.index, lowered.item
    start = time.perf_counter()
    try:
        executable, compile_seconds = compiled.result()
        # The wait for the compile above is not counted: compile_seconds already has
        # the compile itself (counting both reported 16.6 s for an 8.7 s compile).
        start = time.perf_counter()
        with x64_mode(item):
            artifact = build_artifact(executable, lowered.computation.portable_hlo(executable))
        entry = cache.put_artifact(artifact)
    except Exception as exc:  # noqa: BLE001
        return _failed(index, item, exc, lowered.seconds + time.perf_counter() - start)
    finally:
        if release is not None:
            release(lowered.key)
    seconds = lowered.seconds + compile_seconds + time.perf_counter() - start
    return _done(index, item, entry, "compiled", seconds)


def follow_here(cache: ArtifactStore, index: int, item: WarmupItem, leader_key: Callable[[], str]) -> ItemResult:
    """An item of a warm-up that process 0 of the job runs (:mod:`aot.cache.warmup.following`):
    lowered here, loaded when stored; otherwise ``leader_key()`` waits for the key
    process 0 stored (raising its error) and that entry is loaded. Compiled here, and
    not stored, only when the cache cannot give it: a program of this process's
    devices only, or an entry process 0 stored elsewhere (hosts that share no cache)."""
    from aot.slices import slice_of

    start = time.perf_counter()
    with x64_mode(item):
        try:
            computation = lower_item(item)
            lowered = Lowered(index, item, computation, time.perf_counter() - start)
            stored = load_stored(cache, lowered)
            if stored is not None:
                return stored
            # A device target's entry is the same in every process (deviceless); one that
            # spans the job's processes is process 0's to compile.
            shared = computation.target is not None or slice_of(computation.devices) is not None
            if shared:
                key = leader_key()
                if key != computation.fingerprint:
                    raise SliceError(
                        f"this process lowered {item.label} to key {computation.fingerprint[:12]}, process 0 "
                        f"to {key[:12]}: every process of the job must run the same code, manifest and "
                        "environment", key=computation.fingerprint, process=0,
                    )
                lowered.seconds = time.perf_counter() - start
                stored = load_stored(cache, lowered, waited=True)
                if stored is not None:
                    return stored
                log.warning(
                    "%s: process 0 stored it, but the cache at %s does not have it: the hosts of a slice "
                    "should share one cache (a PostgreSQL index, or one folder); compiling it here",
                    item.label, cache.display_location,
                )
            if computation.symbolic:
                raise SliceError(
                    f"{item.label} is symbolic: process 0 stores it, and the cache at "
                    f"{cache.display_location} does not have it", key=computation.fingerprint, process=0,
                )
        except Exception as exc:  # noqa: BLE001 - every item is tried; failures are recorded
            return _failed(index, item, exc, time.perf_counter() - start)
    return _compiled_unstored(cache, lowered, start)


def _compiled_unstored(cache: ArtifactStore, lowered: Lowered, start: float) -> ItemResult:
    """Compiles an item without storing it (a follower of a job stores nothing)."""
    from aot.build import build_artifact
    from aot.cache.store import unstored_entry

    try:
        executable, _ = compile_lowered(lowered)
        with x64_mode(lowered.item):
            entry = unstored_entry(build_artifact(executable, None))
    except Exception as exc:  # noqa: BLE001
        return _failed(lowered.index, lowered.item, exc, time.perf_counter() - start)
    return _done(lowered.index, lowered.item, entry, "compiled", time.perf_counter() - start)


# ---------------------------------------------------------------- any process, any executor


_TASK_CACHES: dict[tuple[Any, ...], ArtifactStore] = {}
_TASK_LOCK = threading.Lock()


#: The task options' captured GPUs (:class:`aot.platforms.cuda.CapturedConfigs`): the
#: parent's, handed to each worker with its task, not through its environment.
_CAPTURED = "captured_gpus"


def task_options(cache: ArtifactStore) -> dict[str, Any]:
    """What a task opens its cache with (:func:`task_cache`), and the captured GPUs this
    process compiles for, which the task's process takes as its own."""
    from aot.platforms.cuda import captured_in_use

    return {"location": cache.location, **cache.options(), _CAPTURED: captured_in_use()}


def task_cache(cache_options: dict[str, Any], x64: bool) -> ArtifactStore:
    """The cache ``cache_options`` (``location`` and :meth:`ArtifactStore.options`) names, opened once per process and thread (and
    JAX's x64 mode set to the warm-up's)."""
    import jax

    from aot.cache.store import ArtifactStore

    if bool(getattr(jax.config, "jax_enable_x64")) != x64:
        jax.config.update("jax_enable_x64", x64)
    if cache_options.get(_CAPTURED) is not None:
        from aot.platforms.cuda import use_captured

        use_captured(cache_options[_CAPTURED])
    key = (os.getpid(), threading.get_ident(), repr(sorted(cache_options.items())))
    with _TASK_LOCK:
        cache = _TASK_CACHES.get(key)
    if cache is None:
        options = dict(cache_options)
        options.pop(_CAPTURED, None)
        cache = ArtifactStore(options.pop("location"), **options)
        with _TASK_LOCK:
            _TASK_CACHES[key] = cache
    return cache

"""``aot.load(name)``: open a cache for serving and return a dispatcher over every
signature stored for ``name``.

Serving is read-only and fails fast: a location that holds no cache is refused
(nothing is created there), and a name with nothing servable is refused at start-up,
never at the first request, naming close names and the entries stored for other
environments.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aot.device import device_error
from aot.errors import AotError, CacheError, ReleaseNotFoundError, UsageError

from aot.cache.serving import read_ahead, readiness
from aot.cache.serving.release_rule import RELEASE_ENV, served_release

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore
    from aot.cache.serving.dispatcher import Dispatcher
    from aot.cache.serving.statics import StaticsDispatcher
    from aot.cache.tiered import TieredStore
    from aot.cache.timeouts import Timeouts

log = logging.getLogger(__name__)

__all__ = ["RELEASE_ENV", "load", "open_existing", "served_release"]


def load(
    name: str,
    cache: ArtifactStore | str | None = None,
    *,
    strict: bool = False,
    lazy: bool = False,
    fallback: Callable[..., Any] | None = None,
    read_only: bool | None = None,
    pad: Mapping[str, int] | None = None,
    pad_outputs: int | Mapping[str, int] | None = None,
    pad_value: Any = 0,
    allow_empty: bool = False,
    background: bool | None = None,
    release: str | None = None,
    timeouts: Timeouts | None = None,
) -> Dispatcher | StaticsDispatcher:
    """A callable over every signature stored for ``name`` in this environment.

    ``background=False`` loads every signature now, in parallel, so the first request
    runs at full speed; ``lazy=True`` loads each on its first call;
    ``background=True`` returns once the index rows are read and loads every
    signature in background threads: a call waits for its own signature only, and a
    signature that fails to load raises that error (as ``background=False`` would at
    start-up) at its first call (:meth:`Dispatcher.load_in_background`). The default
    (``None``) is ``background=True`` on an accelerator and ``False`` on CPU: loading
    a TPU executable puts it on the chip, seconds per signature, so the first result of
    a two-bucket train step came 1.33x sooner in background than eager there, and no
    later than JAX's own ``deserialize_and_load`` of its one bucket; on CPU the eager
    load overlaps its imports with XLA instead (docs/serving.md, "Start-up").

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

    What is served per signature is the key its ref names (docs/serving.md, "What is
    served"); ``release=LABEL`` (default ``$AOT_RELEASE``) serves exactly the members of
    that release instead, and raises :class:`ReleaseNotFoundError` at start-up when the
    label does not exist, has no member of ``name``, or one of its members cannot be
    served here.

    ``timeouts`` (an :class:`aot.Timeouts`) bound the waits of the cache ``load`` opens
    from a location (None: the environment's); a :class:`Cache` given as ``cache``
    keeps its own, so passing both is a :class:`UsageError`.
    """
    if release is None:
        release = os.environ.get(RELEASE_ENV, "").strip() or None
    progress = readiness.started(name)  # /ready: not ready until this load has returned
    try:
        dispatcher = _load(
            name, cache, strict=strict, lazy=lazy, fallback=fallback, read_only=read_only, pad=pad,
            pad_outputs=pad_outputs, pad_value=pad_value, allow_empty=allow_empty,
            background=background, release=release, timeouts=timeouts,
        )
    except RuntimeError as exc:
        progress.failed()
        # JAX's backend failing to start (the chip held by another process: "Unable to
        # initialize backend 'tpu': ABORTED: The TPU is already in use by process with
        # pid N") is DeviceBusyError / DeviceUnavailableError, naming the holder, as for
        # a compile (aot.device); wherever the load first touched the backend.
        error = None if isinstance(exc, AotError) else device_error(exc)
        if error is None:
            raise
        raise error from None
    except BaseException:
        progress.failed()
        raise
    progress.finished(dispatcher, lazy=lazy)
    return dispatcher


def _load(
    name: str, cache: ArtifactStore | str | None, *, strict: bool, lazy: bool,
    fallback: Callable[..., Any] | None, read_only: bool | None, pad: Mapping[str, int] | None,
    pad_outputs: int | Mapping[str, int] | None, pad_value: Any, allow_empty: bool,
    background: bool | None, release: str | None, timeouts: Timeouts | None,
) -> Dispatcher | StaticsDispatcher:
    if background is None:
        background = not lazy and _on_accelerator()
    if lazy and background:
        raise UsageError(
            "aot.load: lazy=True loads each signature at its first call, background=True "
            "loads them all now in threads; pass one of them"
        )
    if os.environ.get("AOT_METRICS_PORT", "").strip():
        # A serving process exposes its metrics without code (once; before loading, so
        # the loads are counted). Imported only then: prometheus_client is an extra.
        from aot.cache.serving.metrics import serve_metrics_from_env

        serve_metrics_from_env()
    with read_ahead.reading_ahead(name, cache, lazy=lazy, background=background, release=release):
        # Imported here, not at the top: aot.load reads ahead while these load (read_ahead).
        from aot.cache.store import ArtifactStore
        from aot.cache.serving.statics import dispatcher_for

        plan = None
        if pad is not None:
            from aot.cache.serving.padding import PadPlan  # only padded serving needs it

            plan = PadPlan.of(pad, pad_outputs, pad_value)
        owned = not isinstance(cache, ArtifactStore)
        if not owned and timeouts is not None:
            raise UsageError(
                f"aot.load({name!r}, cache=<an open Cache>, timeouts=...): an open cache keeps "
                "the bounds it was opened with; pass timeouts= to aot.Cache(...) instead, or "
                "give load a location"
            )
        if not isinstance(cache, ArtifactStore):
            cache = open_existing(cache, read_only=read_only, timeouts=timeouts)
        try:
            if release is None:  # neither release= nor AOT_RELEASE: the cache's declared default
                release = served_release(cache, None)
            dispatcher = dispatcher_for(cache, name, strict=strict, fallback=fallback, pad=plan, release=release)
            if release is not None:
                check_release(dispatcher, release)
            if not allow_empty and fallback is None and not dispatcher.has_servable():
                raise nothing_servable(cache, name, dispatcher)
            if background:
                dispatcher.load_in_background()
            elif not lazy:
                try:
                    dispatcher.warm()
                except AotError as exc:
                    if release is None:
                        raise
                    raise ReleaseNotFoundError(
                        f"aot.load({name!r}, release={release!r}): a member of the release cannot be "
                        f"loaded here: {exc}", tuple(dispatcher.signatures),
                    ) from exc
        except BaseException:
            if owned:
                cache.close()
            raise
        return dispatcher


def _on_accelerator() -> bool:
    """Whether JAX's default backend is an accelerator (starts it: the load needs it,
    and the read-ahead reuses it)."""
    import jax

    return jax.default_backend() != "cpu"


def check_release(dispatcher: Dispatcher | StaticsDispatcher, release: str) -> None:
    """Raises :class:`ReleaseNotFoundError` unless every member signature of ``release``
    can be served here (stored, checked, and loadable or recompilable)."""
    # A name with statics has one table per static value; each selected every member.
    tables = [c.programs for c in getattr(dispatcher, "children", {}).values()] or [dispatcher.programs]
    for t in tables:
        t.file_all()  # every member is checked now, not at its first call
    table = tables[0]
    servable = {signature for t in tables for signature in t.servable()}
    missing = {signature for signature, _, _ in table.selection.missing}
    problems = [f"  ({signature}) {key[:12]}: {why}" for signature, key, why in table.selection.missing]
    skipped = {signature: reason for t in tables for _, signature, reason in t.skipped}
    foreign = _foreign_differences(tables)
    releases_only = True
    for signature in sorted(table.selection.declared - servable - missing):
        why = skipped.get(signature)
        if why is None:
            why = "cannot be served here" + (" with strict=True (it never compiles)" if table.strict else "")
            differences = foreign.get(signature, [])
            releases_only = releases_only and bool(differences) and all(only for _, _, only in differences)
            why += "".join(f"; {key[:12]} compiled for another environment: {text}" for key, text, _ in differences)
        else:
            releases_only = False
        problems.append(f"  ({signature}): {why[:400]}")
    if problems:
        releases_only = releases_only and not table.selection.missing
        raise ReleaseNotFoundError(
            f"aot.load({dispatcher.name!r}, release={release!r}): {len(problems)} member signature(s) "
            "of the release cannot be served here:\n" + "\n".join(problems)
            + f"\n{_release_advice(release, releases_only=releases_only)}", tuple(dispatcher.signatures),
        )


def _foreign_differences(tables: list[Any]) -> dict[str, list[tuple[str, str, bool]]]:
    """signature -> (key, the parts of its environment that differ from this one's,
    whether only the JAX release differs), for the rows of other environments filed."""
    from aot.artifact import Manifest
    from aot.fingerprint import describe_differences, release_only

    found: dict[str, list[tuple[str, str, bool]]] = {}
    for t in tables:
        environment = t.cache.environment
        for program in t.concrete.values():
            for entry in program.foreign:
                try:
                    diffs = Manifest.from_json(entry.manifest).environment.diff(environment)
                except AotError:
                    continue
                text = describe_differences(diffs) or "another environment"
                found.setdefault(program.signature, []).append((entry.key, text, release_only(diffs)))
    return found


def _release_advice(release: str, *, releases_only: bool = False) -> str:
    """What to do when a release's members cannot be served here. Members of another
    JAX release only: warm this release into the same label (docs/jax-releases.md's
    runbook: one label holds a member per release, each host serves its own). Members
    of another device or target: never `aot warmup --release LABEL` for this
    environment, which would mix this host's entries into what the fleet serves."""
    import jax

    if releases_only:
        return (
            f"Warm this JAX release ({jax.__version__}) into the same label before serving it "
            f"here: aot warmup MANIFEST --release {release} --commit COMMIT on a host of this "
            f"release, with the commit `aot release show {release}` prints (docs/jax-releases.md); "
            f"or load with strict=False to recompile from the portable HLO"
        )
    here = jax.default_backend()  # started already: the dispatcher's entries were filed
    return (
        f"Serve release {release!r} where its members were compiled (the target or host each "
        f"reason names), or warm this environment up under a label of its own (aot warmup "
        f"MANIFEST --release {release}-{here}) and load that label"
    )


def open_existing(
    location: str | os.PathLike[str] | None, *, read_only: bool | None = None,
    timeouts: Timeouts | None = None,
) -> ArtifactStore:
    """Opens the cache at ``location`` for serving; never creates one.

    ``read_only=None``: a folder this process cannot write (another user's) is opened
    read-only; a database URL is opened read-write. ``timeouts``: as ``aot.Cache``'s.
    """
    from aot.cache.store import ArtifactStore, default_location
    from aot.cache.storage.locations import classify_location
    from aot.cache.index.entry import INDEX_FILE

    location = str(location) if location is not None else default_location()
    advice = (
        "aot.load never creates a cache: check the path (or AOT_CACHE), or fill the "
        "cache first (aot warmup / aot compile / aot bundle import)"
    )
    if classify_location(location).scheme is not None:  # a database URL (or file://)
        if not read_only:
            from aot.cache.index.schema import OutdatedSchemaError
            from aot.cache.index.sql import Index  # a folder cache is read without SQLAlchemy

            try:  # a read-only open creates nothing; a writable one would create the schema
                Index(location, read_only=True, timeouts=timeouts).close()
            except OutdatedSchemaError:
                pass  # an index of an older schema: the writable open below migrates it
            except CacheError as exc:
                raise CacheError(f"{exc}. {advice}") from None
        return ArtifactStore(location, read_only=bool(read_only), timeouts=timeouts)
    folder = Path(location).expanduser()
    index = folder / INDEX_FILE
    if not index.is_file():
        raise CacheError(f"no cache at {folder} (no index.sqlite there); {advice}")
    if read_only is None:
        writable = os.access(folder, os.W_OK) and os.access(index, os.W_OK)
        if not writable:
            log.info("aot.load: %s is not writable by this process; serving it read-only", folder)
        read_only = not writable
    return ArtifactStore(location, read_only=read_only, timeouts=timeouts)


def nothing_servable(
    cache: ArtifactStore, name: str, dispatcher: Dispatcher | StaticsDispatcher
) -> AotError:
    """The start-up error of a name with no servable signature: what is stored and
    why none of it serves here, or the names that are close. An :class:`IntegrityError`
    when every row was refused by the signature checks (nothing signed is servable)."""
    import difflib

    from aot.artifact import Manifest
    from aot.errors import IntegrityError, SignatureNotFoundError
    from aot.fingerprint import describe_differences

    from aot.cache.tiered import TieredStore
    from aot.cache.units import counted

    where = f"the cache at {cache.display_location}"
    lines: list[str] = []
    unusable, skipped = dispatcher.unusable, dispatcher.skipped  # (every row filed)
    environment = cache.environment
    programs = list(dispatcher.programs.concrete.values())
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
    for entry, reason in unusable:
        lines.append(f"  ({entry.signature}) {entry.key[:12]} unusable: {reason[:200]}")
    for key, signature, reason in skipped:
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
            head += f" ({counted(len(names), 'other name')}: `aot ls` lists them)"
        else:
            head += " (the cache is empty)"
        advice = "Compile it in CI (aot warmup / aot compile)"
        if isinstance(cache, TieredStore) and cache.remote_error is not None:
            head, advice = offline_miss(cache, name, close)
    message = (
        f"{head}\n{advice}, or pass allow_empty=True to start without it "
        "(fallback=fn compiles missing signatures on demand)."
    )
    refused = dispatcher.programs.refused
    if refused and len(refused) == len(dispatcher.skipped) and not programs and not dispatcher.unusable:
        return IntegrityError(message)
    return SignatureNotFoundError(message, tuple(dispatcher.signatures))


def offline_miss(cache: TieredStore, name: str, close: list[str]) -> tuple[str, str]:
    """A replica that opened while its remote was down holds only its local tier: a
    name missing there may well be stored at the remote, so say that, not "nothing is
    stored"."""
    head = (
        f"aot.load({name!r}): {name!r} is not in the local tier at {cache.local.location}, "
        f"and the remote cache {cache.display_location} was unreachable when this cache "
        f"was opened, so it may be stored there ({cache.remote_error})"
    )
    if close:
        head += f". The local tier holds {', '.join(repr(n) for n in close)}"
    advice = (
        "Check that the remote index is reachable (the URL, the network, the server), then "
        "open the cache again (restart the replica): an open cache does not reconnect"
    )
    return head, advice

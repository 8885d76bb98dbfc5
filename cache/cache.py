"""``aot.Cache``: the public cache, at the top of the cache's layers.

The work is done below: :class:`~aot.cache.store.ArtifactStore` finds, loads, stores
and quarantines entries (the index and the blob store, wired), and
:class:`~aot.cache.tiered.TieredStore` reads one through a local folder. This class
adds what DESIGN.md's public interface puts on a cache and what composes the layers
above the store: symbolic compiles served by a dispatcher (serving), ``verify`` and
``gc`` (admin), bundles (admin), ``explain`` and ``release_diff`` (reports). Those modules take an
``ArtifactStore``, so none of them imports this one: the layers point one way.

``aot.Cache(location, ..., local=DIR)`` is a :class:`TieredCache`, as ``pathlib.Path()``
is a ``PosixPath``: the choice is made in ``__new__``, and every cache, tiered or not,
is an instance of ``aot.Cache``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aot import platforms
from aot.cache.index.refs import RefOrigin
from aot.cache.store import ArtifactStore
from aot.cache.tiered import TieredStore

if TYPE_CHECKING:
    from aot.artifact import Artifact
    from aot.cache.compiling import CompileResult
    from aot.cache.index.entry import IndexEntry
    from aot.cache.index.targets import CapturedTarget
    from aot.computation import MeshComputation
    from aot.executable import MeshExecutable
    from aot.cache.admin.bundle import BundleReport
    from aot.cache.admin.maintenance import GcPlan, VerifyReport
    from aot.cache.reports.explain import Explanation
    from aot.cache.reports.release_diff import ReleaseDiff
    from aot.cache.warmup.manifest import WarmupItem

__all__ = ["Cache", "TieredCache"]


class Cache(ArtifactStore):
    __doc__ = ArtifactStore.__doc__

    def __new__(cls, location: Any = None, *, local: Any = None, **options: Any) -> Cache:
        if cls is Cache and local is not None:
            cls = TieredCache
        return super().__new__(cls)

    def __init__(self, location: str | os.PathLike[str] | None = None, *, local: Any = None, **options: Any) -> None:
        if local is not None:  # a class derived from Cache that is not a TieredCache
            raise TypeError(f"{type(self).__name__}() takes no local=: aot.Cache(..., local=DIR) is a TieredCache")
        super().__init__(location, **options)

    def put(self, item: MeshComputation | MeshExecutable | Artifact, *, origin: RefOrigin | None = None) -> IndexEntry:
        """Stores a computation (compiling it: once per slice under ``jax.distributed``,
        as :meth:`compile` does), an executable or an artifact, and declares it the
        entry served for its name, signature and environment (its ref; ``origin`` says
        who set it, default ``Cache.put``)."""
        from aot.cache.compiling import put_entry  # lowering and compiling import JAX

        self.check_writable("store an artifact")
        entry = put_entry(self, item)
        self.set_refs([entry], origin if origin is not None else RefOrigin("Cache.put"))
        return entry

    def compile_entry(
        self, fn: Callable[..., Any], *args: Any, name: str | None = None, pmap: bool = False,
        origin: RefOrigin | None = None, **lower_kwargs: Any,
    ) -> CompileResult:
        """Lowers ``fn``; on a hit loads the stored executable, on a miss compiles and stores
        it, and sets its ref (:mod:`aot.cache.compiling`)."""
        from aot.cache.compiling import compile_entry

        self.use_targets_for(lower_kwargs.get("target"))
        return compile_entry(self, fn, *args, name=name, pmap=pmap, origin=origin, **lower_kwargs)

    def compile(
        self, fn: Callable[..., Any], *args: Any, name: str | None = None, pmap: bool = False,
        **lower_kwargs: Any,
    ) -> Any:
        """Lower ``fn``; on a hit load the stored executable, on a miss compile and store.

        With symbolic specs (``"f32[b,784]"``) the shape-polymorphic program is stored
        and the result is ``aot.load(name)``'s dispatcher (lazy), which compiles it for
        each concrete shape it is called with. With ``target="tpu:v5e:2x2"``
        (:mod:`aot.targets`) it compiles for that accelerator without it, and the
        result is the stored entry: nothing compiled for another accelerator runs here.
        """
        result = self.compile_entry(fn, *args, name=name, pmap=pmap, **lower_kwargs)
        if lower_kwargs.get("target") is not None:
            return result.entry
        if result.executable is None:
            from aot.cache.serving.dispatcher import Dispatcher

            return Dispatcher(self, result.entry.name)
        return result.executable

    def capture_target(
        self, name: str, *, config_file: str | os.PathLike[str] | None = None,
        versions_file: str | os.PathLike[str] | None = None, autotune_file: str | os.PathLike[str] | None = None,
    ) -> CapturedTarget:
        """Records this host's GPU (or ``config_file``'s) as ``cuda:NAME`` in the cache,
        with the autotune results of ``autotune_file`` (:mod:`aot.cache.admin.targets`)."""
        from aot.cache.admin.targets import capture_target

        return capture_target(self, name, config_file=config_file, versions_file=versions_file,
                              autotune_file=autotune_file)

    def captured_targets(self) -> list[CapturedTarget]:
        """The GPUs captured in this cache (``aot target ls``)."""
        return self.index.captured_targets()

    def use_targets(self) -> list[CapturedTarget]:
        """Makes this cache's captured GPUs what ``cuda:NAME`` compiles for, in this
        process and the workers it starts."""
        from aot.cache.index.targets import write_targets
        from aot.platforms.cuda import use_captured

        captured, configs = write_targets(self.index, self.location)
        use_captured(configs)
        return captured

    def use_targets_for(self, *targets: Any) -> None:
        """:meth:`use_targets` when one of ``targets`` (names, lists of names or
        :class:`aot.DeviceTarget`) is a GPU's."""
        names = [t for item in targets for t in (item if isinstance(item, (list, tuple)) else [item]) if t is not None]
        if any(platforms.captured_target(str(getattr(t, "name", t))) for t in names):
            self.use_targets()

    def verify(self, *, quarantine: bool = True) -> VerifyReport:
        from aot.cache.admin.maintenance import verify_cache

        return verify_cache(self, quarantine=quarantine)

    def gc(
        self, max_size: int | str | None = None, older_than: Any = None, *, dry_run: bool = False,
        superseded: bool = False, force: bool = False, manifest: str | os.PathLike[str] | None = None,
        kind: str = "all", jax_release: str | None = None,
    ) -> GcPlan:
        """Plan-then-execute garbage collection; ``force`` deletes blobs even when the
        index is empty (it refuses otherwise: a lost index is not an empty cache).
        Never deletes what a ref or a live release pins; ``manifest`` drops the refs of
        signatures of its names it no longer lists, and collects their entries.
        ``kind`` (``aot``, ``jit`` or ``all``) narrows the entries it may select.
        ``jax_release`` retires a JAX release: every entry compiled by it goes, and the
        refs and release members of its environments with them (the plan names them)."""
        from aot.cache.admin.maintenance import collect_garbage

        return collect_garbage(
            self, max_size=max_size, older_than=older_than, dry_run=dry_run,
            superseded=superseded, force=force, manifest=manifest, kind=kind, jax_release=jax_release,
        )

    def export_bundle(
        self, path: str | os.PathLike[str], names: str | Iterable[str] | None = None, *, release: str | None = None,
    ) -> BundleReport:
        """Every intact entry whose name matches one of the globs ``names`` (all if None),
        or the members of ``release``, with their compile times and refs."""
        from aot.cache.admin.bundle import export_bundle

        if isinstance(names, str):  # one glob, not its characters
            names = [names]
        return export_bundle(self, Path(path), list(names) if names else None, release=release)

    def import_bundle(self, path: str | os.PathLike[str], *, refs: bool = False) -> BundleReport:
        """Stores a bundle's entries; its refs fill the slots without one (``refs``: all)."""
        from aot.cache.admin.bundle import import_bundle

        return import_bundle(self, Path(path), refs=refs)

    def explain(self, name: str, *args: Any, fn: Callable[..., Any] | None = None, **lower_kwargs: Any) -> Explanation:
        from aot.cache.reports.explain import explain

        self.use_targets_for(lower_kwargs.get("target"))
        return explain(self, name, *args, fn=fn, **lower_kwargs)

    def release_diff(self, a: str, b: str) -> ReleaseDiff:
        """The members that differ from release ``a``'s current set to ``b``'s (added,
        removed, changed) and, for a changed one, the fingerprint parts that differ."""
        from aot.cache.reports.release_diff import release_diff

        return release_diff(self, a, b)

    def explain_item(self, item: WarmupItem, *, release: str | None = None) -> Explanation:
        """Explains a warm-up item (a manifest's entry) lowered as the warm-up lowers it:
        would the entry it stored be served?"""
        from aot.cache.reports.explain import explain_item

        return explain_item(self, item, release=release)


class TieredCache(TieredStore, Cache):
    """``aot.Cache(location, local=DIR)``: a remote cache read through a local folder
    (:mod:`aot.cache.tiered`), with everything else an ``aot.Cache`` offers."""


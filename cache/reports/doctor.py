"""``aot doctor``: versions, devices, the environment fingerprint, cache location and health."""

from __future__ import annotations

import importlib.metadata
import platform
from dataclasses import dataclass
from typing import Any

from aot.errors import AotError

# libtpu: the TPU compiler, from its package metadata (importing it would load it);
# "not installed" on a runner without the tpu extra.
_DISTRIBUTIONS = ("jax-aot", "jax", "jaxlib", "libtpu", "numpy", "sqlalchemy", "zstandard", "click", "psycopg")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in _DISTRIBUTIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            if dist != "psycopg":
                out[dist] = "not installed"
    out.update(gpu_compiler())
    return out


def is_gpu_compiler_key(key: str) -> bool:
    """Whether a key of :func:`versions` is one of :func:`gpu_compiler`'s (doctor shows
    them in a section of their own)."""
    return key == "gpu_compiler" or key.startswith(("jax-cuda", "nvidia-"))


def gpu_compiler() -> dict[str, str]:
    """The GPU compiler here, from package metadata (nothing imported): JAX's CUDA plugin
    distributions, ptxas's (``nvidia-cuda-nvcc``) and the CUDA runtime's versions, and
    ``gpu_compiler``: ``ok`` or why a GPU target cannot be compiled here (no plugin, one
    of another release than jaxlib's, a jaxlib below the floor)."""
    from aot.platforms import cuda

    plugins = cuda.cuda_plugins()
    out = dict(plugins) if plugins else {"jax-cuda-plugin": "not installed"}
    for dist in ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    problem = cuda.problem_here()
    out["gpu_compiler"] = "ok" if problem is None else problem[1]
    return out


@dataclass(frozen=True, slots=True)
class Diagnosis:
    versions: dict[str, str]
    devices: dict[str, Any]
    environment: dict[str, Any]
    location: str
    index: str | None = None
    schema_version: int | None = None
    supported_schema_version: int | None = None
    entries: int | None = None
    entries_here: int | None = None
    quarantined: int | None = None
    stored_bytes: int | None = None
    health: Any = None  # VerifyReport
    error: str | None = None
    settings: Any = None  # aot.cache.config.Settings: each setting and its source
    #: Problems of the cache as a whole, found even without --no-verify's re-hashing
    #: (an empty index beside stored blobs).
    cache_problems: tuple[str, ...] = ()
    #: Where the blobs are (a folder, the database, an object-store URL; no credentials).
    blobs: str | None = None
    #: The local read-through tier, when one is configured: location, entries, error.
    local: dict[str, Any] | None = None
    #: Entries whose portable HLO is past or near jax.export's compatibility window
    #: (aot.cache.admin.aging.AgingReport); a warning, not a failure: they still serve.
    aging: Any = None

    @property
    def ok(self) -> bool:
        local_ok = self.local is None or self.local.get("error") is None
        return (
            self.error is None and not self.cache_problems and local_ok
            and (self.health is None or self.health.ok)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "versions": self.versions,
            "devices": self.devices,
            "environment": self.environment,
            "cache": {
                "location": self.location,
                "index": self.index,
                "blobs": self.blobs,
                "schema_version": self.schema_version,
                "supported_schema_version": self.supported_schema_version,
                "entries": self.entries,
                "entries_this_environment": self.entries_here,
                "quarantined": self.quarantined,
                "stored_bytes": self.stored_bytes,
                "error": self.error,
                "problems": list(self.cache_problems),
            },
            "health": self.health.to_dict() if self.health is not None else None,
            "local": self.local,
            "aging": self.aging.to_dict() if self.aging is not None else None,
            "settings": self.settings.to_dict() if self.settings is not None else None,
        }


def diagnose(
    location: str | None = None, *, check: bool = True, settings: Any = None
) -> Diagnosis:
    """Gathers everything ``aot doctor`` shows. Opens the cache read-only (it never
    creates, migrates or quarantines anything); a cache that cannot be opened is
    reported in ``error``, not raised. ``settings`` (:class:`aot.cache.config.Settings`)
    name the cache, blob location, signing key and network bounds, and are reported
    with their sources."""
    from aot.cache.store import ArtifactStore, default_location
    from aot.cache.index.advice import mask_url
    from aot.cache.index.entry import SCHEMA_VERSION
    from aot.cache.admin.aging import aged_entries
    from aot.cache.admin.maintenance import empty_index_problem, verify_cache
    from aot.cache.storage.locations import FOLDER, classify_location
    from aot.fingerprint import UNKNOWN_ENVIRONMENT_NOTE, xla_flags_outside_key

    device_info, env = devices_and_environment()
    environment: dict[str, Any] = {
        "digest": env.digest if env is not None else None,
        "parts": env.as_dict() if env is not None else {},
        # Set here but not in the key: they cannot change an executable.
        "outside_key": {"xla_flags": xla_flags_outside_key()},
    }
    if env is None:
        environment["unknown"] = UNKNOWN_ENVIRONMENT_NOTE
    options: dict[str, Any] = {}
    if settings is not None:
        location = location if location is not None else settings.cache.value
        if settings.blobs.value is not None:
            options["blob_location"] = settings.blobs.value
    location = str(location) if location is not None else default_location()
    try:
        shown = location if classify_location(location).kind == FOLDER else mask_url(location)
    except AotError:
        shown = mask_url(location)
    local_tier = settings.local.value if settings is not None else None
    base = dict(
        versions=versions(), devices=device_info, environment=environment, location=shown,
        supported_schema_version=SCHEMA_VERSION, settings=settings,
        local=_local_tier(local_tier, env.digest if env is not None else None) if local_tier is not None else None,
    )
    try:
        if settings is not None:
            options["signing_key"] = settings.signing_key()
            options["timeouts"] = settings.timeouts()
        cache = ArtifactStore(location, read_only=True, **options)
    except AotError as exc:
        return Diagnosis(**base, error=str(exc))  # type: ignore[arg-type]
    try:
        entries = cache.index.entries()
        health = verify_cache(cache, quarantine=False) if check else None
        stats = list(cache.blobs.list())
        empty = empty_index_problem(cache, [s.digest for s in stats]) if not entries else None
        return Diagnosis(
            aging=aged_entries(cache, entries=entries),  # by compile date: no blob read
            **base,  # type: ignore[arg-type]
            blobs=cache.blobs.location,
            index=cache.index.url,
            schema_version=cache.index.schema_version(),
            entries=len(entries),
            entries_here=sum(1 for e in entries if e.env_fp == env.digest and e.ok) if env is not None else None,
            quarantined=sum(1 for e in entries if not e.ok),
            stored_bytes=sum(s.stored_size for s in stats),
            health=health,
            cache_problems=(empty,) if empty else (),
        )
    except AotError as exc:
        return Diagnosis(**base, index=cache.index.url, blobs=cache.blobs.location, error=str(exc))  # type: ignore[arg-type]
    finally:
        cache.close()


def devices_and_environment() -> tuple[dict[str, Any], Any]:
    """The device section and this host's environment fingerprint (None: unknown).
    A device that another process holds is reported (``error``, ``holder_pid``), never
    raised, and not even asked of JAX when ``/proc`` names the holder (asking costs
    seconds); the environment then comes from the per-host record."""
    from aot.device import accelerator_runtime, default_devices, device_holder
    from aot.errors import DeviceBusyError, DeviceUnavailableError
    from aot.fingerprint import environment_fingerprint, recorded_environment
    from aot.jaxcompat.runtime import backend_started

    holder = device_holder() if accelerator_runtime() is not None and not backend_started() else None
    if holder is not None:
        error: DeviceUnavailableError = DeviceBusyError(
            f"the device is held by {holder.describe()}: commands that need it fail until it exits", holder.pid,
        )
    else:
        try:
            import jax

            devices = default_devices()
            info = {
                "platform": devices[0].platform,
                "device_kind": devices[0].device_kind,
                "count": len(devices),
                "local_count": jax.local_device_count(),
                "process_index": jax.process_index(),
                "process_count": jax.process_count(),
            }
            return info, environment_fingerprint()  # writes the per-host record
        except DeviceUnavailableError as exc:
            error = exc
    return {"error": str(error), "holder_pid": getattr(error, "pid", None)}, recorded_environment()


def _local_tier(location: str, env: str | None) -> dict[str, Any]:
    """What the local tier holds (opened read-only: doctor creates nothing)."""
    from aot.cache.store import ArtifactStore

    out: dict[str, Any] = {"location": location, "entries": None, "entries_this_environment": None,
                           "stored_bytes": None, "error": None}
    from pathlib import Path

    from aot.cache.index.entry import INDEX_FILE

    if not (Path(location).expanduser() / INDEX_FILE).is_file():
        out.update(entries=0, entries_this_environment=0, stored_bytes=0)
        return out  # created by the first process that serves through it
    try:
        with ArtifactStore(location, read_only=True) as tier:
            entries = tier.index.entries()
            out["entries"] = len(entries)
            out["entries_this_environment"] = (
                sum(1 for e in entries if e.env_fp == env and e.ok) if env is not None else None
            )
            out["stored_bytes"] = sum(s.stored_size for s in tier.blobs.list())
    except AotError as exc:
        out["error"] = str(exc)
    return out


__all__ = ["Diagnosis", "diagnose", "versions"]

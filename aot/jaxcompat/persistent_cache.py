"""JAX's persistent compilation cache: plugging another backend in, and taking it out.

JAX calls one :class:`~jax._src.compilation_cache_interface.CacheInterface` object
(``get(key) -> bytes | None``, ``put(key, bytes)``; the bytes are JAX's zstd frame of
the serialized executable and its compile time) held in
``jax._src.compilation_cache._cache``, created lazily from
``jax_compilation_cache_dir`` under ``_cache_initialized_mutex`` unless
``_cache_initialized`` is set. Setting both under the mutex routes every compile of the
process through our object; :func:`restore` puts back what was there. JAX itself applies
``jax_enable_compilation_cache`` (``is_cache_used``, checked once per process: we
reset the check), ``jax_persistent_cache_min_compile_time_secs`` and
``jax_persistent_cache_min_entry_size_bytes`` (before calling ``put``), and it catches
and warns about what ``get``/``put`` raise unless
``jax_raise_persistent_cache_errors`` is set.

Private: ``jax._src.compilation_cache`` (``_cache``, ``_cache_initialized``,
``_cache_checked``, ``_cache_used``, ``_cache_initialized_mutex``,
``decompress_executable``) and ``jax._src.compilation_cache_interface.CacheInterface``;
the name of the event JAX records when a compile returns
(``jax._src.dispatch.BACKEND_COMPILE_EVENT``, :data:`COMPILE_DONE_EVENT`, heard through
the public ``jax.monitoring``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COMPILE_DONE_EVENT", "Installed", "install_backend", "make_backend", "restore", "current_backend",
    "compile_time_of", "on_compile_done",
]

#: The duration event JAX records on the compiling thread when a ``jit`` compile
#: returns (after its persistent-cache ``get`` and, if JAX stored it, ``put``; also when
#: the compile raised).
COMPILE_DONE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclass(frozen=True, slots=True)
class Installed:
    """JAX's cache state before :func:`install_backend` (what :func:`restore` puts back)."""

    cache: Any
    initialized: bool
    checked: bool
    used: bool


def make_backend(get: Callable[[str], bytes | None], put: Callable[[str, bytes], None], path: str) -> Any:
    """An object JAX's persistent cache accepts, calling ``get`` and ``put``."""
    from jax._src.compilation_cache_interface import CacheInterface

    class AotBackend(CacheInterface):
        def __init__(self) -> None:
            self._path = path  # type: ignore[assignment]  # JAX types it Path; it only logs it

        def get(self, key: str) -> bytes | None:
            return get(key)

        def put(self, key: str, value: bytes) -> None:
            put(key, value)

    return AotBackend()


def install_backend(backend: Any) -> Installed:
    """Makes ``backend`` JAX's persistent cache for this process; returns the state to restore."""
    from jax._src import compilation_cache as cc

    with cc._cache_initialized_mutex:
        before = Installed(cc._cache, cc._cache_initialized, cc._cache_checked, cc._cache_used)
        cc._cache = backend
        cc._cache_initialized = True
        cc._cache_checked = False  # re-read jax_enable_compilation_cache on the next compile
        cc._cache_used = False
    return before


def restore(before: Installed) -> None:
    """Puts JAX's own cache object and state back."""
    from jax._src import compilation_cache as cc

    with cc._cache_initialized_mutex:
        cc._cache = before.cache
        cc._cache_initialized = before.initialized
        cc._cache_checked = False
        cc._cache_used = False


def current_backend() -> Any:
    """The object JAX's persistent cache calls now (None: none yet)."""
    from jax._src import compilation_cache as cc

    return cc._cache


def compile_time_of(data: bytes) -> int:
    """The compile time (whole seconds) JAX appends to the serialized executable
    (``combine_executable_and_time``: 4 bytes, big-endian, after the executable)."""
    from jax._src import compilation_cache as cc

    _, seconds = cc.extract_executable_and_time(data)
    return int(seconds)


def on_compile_done(callback: Callable[[], None]) -> None:
    """Calls ``callback()`` on the compiling thread each time a ``jit`` compile returns
    (for the rest of the process: ``jax.monitoring`` cannot forget a listener)."""
    import jax.monitoring

    def listener(event: str, duration_secs: float, **_: str | int) -> None:
        if event == COMPILE_DONE_EVENT:
            callback()

    jax.monitoring.register_event_duration_secs_listener(listener)


def slice_invariant_keys(enable: bool = True) -> bool:
    """Makes JAX's persistent-cache key of a CPU program whose devices span processes the
    same in every process of the job (``enable=False``: JAX's own again); returns
    whether it was on before.

    JAX hashes ``xla_client.get_topology_for_devices(devices).fingerprint()`` into the
    key (``jax._src.cache_key._hash_accelerator_config``); on CPU that fingerprint is
    each process's own (measured with jax 0.10.2: two processes of one job, one device
    list, two fingerprints), so a process other than 0, which JAX never lets write, can
    never hit, and ``jax_share_binary_between_hosts`` waits on a key that its compiling
    process never sets. For those device lists the devices themselves are hashed
    instead (platform, kind, id, process index: what the job's processes agree on). Other
    platforms and single-process device lists keep JAX's hash.

    Private: ``jax._src.cache_key._hash_accelerator_config`` (looked up by name when a
    key is computed, so replacing the module attribute is enough).
    """
    from jax._src import cache_key

    current = cache_key._hash_accelerator_config
    original = getattr(current, "_aot_original", None)
    was_on = original is not None
    if enable and not was_on:
        jax_hash = current

        def hash_accelerator_config(hash_obj: Any, accelerators: Any) -> None:
            devices = list(accelerators.flat)
            if devices and devices[0].platform == "cpu" and len({d.process_index for d in devices}) > 1:
                for d in devices:
                    hash_obj.update(f"{d.platform}|{d.device_kind}|{d.id}|{d.process_index};".encode())
                return
            jax_hash(hash_obj, accelerators)

        hash_accelerator_config._aot_original = jax_hash  # type: ignore[attr-defined]
        setattr(cache_key, "_hash_accelerator_config", hash_accelerator_config)  # replaces JAX's
    elif not enable and was_on:
        setattr(cache_key, "_hash_accelerator_config", original)
    return was_on

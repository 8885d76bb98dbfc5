"""Plugging a :class:`~aot.cache.jax_cache.backend.JaxCacheBackend` into JAX in this
process: :func:`install` (one line, or ``AOT_JAX_CACHE`` and :func:`install_from_env`),
:func:`uninstall`, compile once per slice (:func:`share_between_hosts`), and the claims
given back at exit."""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import TYPE_CHECKING

from aot.cache.index.jit_records import MIN_COMPILE_TIME_HINT
from aot.cache.jax_cache.backend import CLAIM_SECONDS, WAIT_SECONDS, JaxCacheBackend
from aot.cache.timeouts import Timeouts
from aot.errors import UsageError
from aot.jaxcompat import persistent_cache as jaxpc
from aot.slices import wait_seconds as slice_wait_seconds

if TYPE_CHECKING:
    from aot.cache.store import ArtifactStore

log = logging.getLogger(__name__)

__all__ = [
    "ENV", "ENV_BLOBS", "ENV_CLAIM_SECONDS", "ENV_COMPILE_ONCE", "ENV_LOCAL", "ENV_WAIT_SECONDS", "install",
    "install_from_env", "installed", "share_between_hosts", "uninstall",
]

#: The cache location (folder or database URL) :func:`install_from_env` installs.
ENV = "AOT_JAX_CACHE"
#: Its blob location (``s3://...``), when the index is a database.
ENV_BLOBS = "AOT_JAX_CACHE_BLOBS"
#: A folder for the local tier of blobs.
ENV_LOCAL = "AOT_JAX_CACHE_LOCAL"
#: Compile once per fleet: ``1``/``0`` (default: on for a PostgreSQL index), and its
#: bounds in seconds (:data:`CLAIM_SECONDS`, :data:`WAIT_SECONDS`).
ENV_COMPILE_ONCE = "AOT_JAX_CACHE_COMPILE_ONCE"
ENV_CLAIM_SECONDS = "AOT_JAX_CACHE_CLAIM_SECONDS"
ENV_WAIT_SECONDS = "AOT_JAX_CACHE_WAIT_SECONDS"


def _signing_key(value: str | bytes | None) -> bytes | None:
    """The cache's signing key as :class:`Cache` will take it (``AOT_SIGNING_KEY`` when
    None), importing :mod:`aot.signing` (and the artifact model) only when there is one."""
    if value is None and not os.environ.get("AOT_SIGNING_KEY"):
        return None
    from aot.signing import key_from

    return key_from(value)


_installed: tuple[JaxCacheBackend, jaxpc.Installed] | None = None
_install_lock = threading.Lock()
_listening = False  # JAX's compile event reaches the installed backend (registered once)


def _compile_done() -> None:
    found = _installed
    if found is not None:
        found[0].compile_done()


def install(
    target: ArtifactStore | str | os.PathLike[str],
    *,
    blob_location: str | os.PathLike[str] | None = None,
    local: str | os.PathLike[str] | None = None,
    signing_key: str | bytes | None = None,
    read_only: bool = False,
    compile_once: bool | None = None,
    claim_seconds: float = CLAIM_SECONDS,
    wait_seconds: float = WAIT_SECONDS,
    timeouts: Timeouts | None = None,
    slice_share: bool = True,
) -> JaxCacheBackend:
    """Makes the jax-aot cache ``target`` (a :class:`~aot.cache.store.ArtifactStore`, a folder
    or a database URL) JAX's persistent compilation cache in this process; replaces a
    previous :func:`install`. Returns the backend (``.counts``: this process's hits).
    ``timeouts`` (an :class:`aot.Timeouts`) bound the waits of the cache opened at a
    location (None: the environment's); a :class:`Cache` target keeps its own.
    ``slice_share`` (default on): in a multi-process job (``jax.distributed``), one
    process compiles each program for the job and every process hits in the next run
    (:func:`share_between_hosts`)."""
    if not isinstance(target, (str, os.PathLike)):  # a Cache
        if timeouts is not None:
            raise UsageError(
                "aot.jax_cache.install(<an open Cache>, timeouts=...): an open cache keeps the "
                "bounds it was opened with; pass timeouts= to aot.Cache(...) instead, or give "
                "install a location"
            )
        backend = JaxCacheBackend(
            target, local=local, compile_once=compile_once, claim_seconds=claim_seconds, wait_seconds=wait_seconds,
        )
    else:
        where = os.fspath(target)

        def opener() -> ArtifactStore:
            from aot.cache.store import ArtifactStore

            return ArtifactStore(
                where, blob_location=blob_location, signing_key=signing_key, read_only=read_only,
                timeouts=timeouts,
            )

        # Opened on the first local miss (no local tier: the first lookup).
        backend = JaxCacheBackend(
            None, opener=opener, location=where, signing_key=_signing_key(signing_key), read_only=read_only,
            timeouts=timeouts, local=local, owns=True, compile_once=compile_once,
            claim_seconds=claim_seconds, wait_seconds=wait_seconds,
        )
    global _installed, _listening
    with _install_lock:
        if not _listening:
            jaxpc.on_compile_done(_compile_done)
            _listening = True
        previous = _installed
        state = previous[1] if previous is not None else None
        new_state = jaxpc.install_backend(jaxpc.make_backend(backend.get, backend.put, backend.display_location))
        _installed = (backend, state if state is not None else new_state)
    if previous is not None:
        previous[0].close()
    if slice_share:
        share_between_hosts()
    log.info("JAX's persistent compilation cache is the jax-aot cache at %s", backend.display_location)
    min_seconds = _min_compile_seconds()
    if min_seconds > 0:
        log.info("jax-aot cache: %s", MIN_COMPILE_TIME_HINT.format(seconds=min_seconds))
    return backend


def _min_compile_seconds() -> float:
    """JAX's ``jax_persistent_cache_min_compile_time_secs`` (0 if it cannot be read)."""
    import jax

    try:
        return float(getattr(jax.config, "jax_persistent_cache_min_compile_time_secs"))
    except (AttributeError, TypeError, ValueError):
        return 0.0


#: JAX's settings before :func:`install` shared binaries (what :func:`uninstall` puts back).
_shared_before: tuple[bool, bool, int] | None = None


def share_between_hosts(enable: bool = True) -> None:
    """Compile once per slice for ``jax.jit`` in a multi-process job: JAX's own
    ``jax_share_binary_between_hosts`` (the process of a program's lowest device
    compiles, writes the cache and hands the binary to the others through the job's
    key-value store), bounded by ``AOT_SLICE_WAIT_SECONDS``; and a persistent-cache key
    that every process of the job computes alike (on CPU JAX's is each process's own:
    :func:`aot.jaxcompat.persistent_cache.slice_invariant_keys`), so that in the next
    run every process hits. Single-process programs are untouched."""
    import jax

    global _shared_before
    if enable and _shared_before is None:
        _shared_before = (
            jaxpc.slice_invariant_keys(True), getattr(jax.config, "jax_share_binary_between_hosts"),
            getattr(jax.config, "jax_share_binary_between_hosts_timeout_ms"),
        )
    elif not enable and _shared_before is not None:
        keys, flag, timeout_ms = _shared_before
        _shared_before = None
        jaxpc.slice_invariant_keys(keys)
        jax.config.update("jax_share_binary_between_hosts", flag)
        jax.config.update("jax_share_binary_between_hosts_timeout_ms", timeout_ms)
        return
    jaxpc.slice_invariant_keys(enable)
    jax.config.update("jax_share_binary_between_hosts", enable)
    if enable:
        jax.config.update("jax_share_binary_between_hosts_timeout_ms", int(slice_wait_seconds() * 1000))


def uninstall() -> bool:
    """Restores JAX's own persistent cache object and state; False if nothing was installed."""
    global _installed
    with _install_lock:
        found = _installed
        _installed = None
        if found is not None:
            jaxpc.restore(found[1])
    if found is None:
        return False
    if _shared_before is not None:
        share_between_hosts(False)
    found[0].close()
    return True


def installed() -> JaxCacheBackend | None:
    """The backend :func:`install` set (None: JAX uses its own cache)."""
    return _installed[0] if _installed is not None else None


def install_from_env(environ: dict[str, str] | None = None) -> JaxCacheBackend | None:
    """:func:`install` from ``AOT_JAX_CACHE`` (and ``AOT_JAX_CACHE_BLOBS``,
    ``AOT_JAX_CACHE_LOCAL``, ``AOT_JAX_CACHE_COMPILE_ONCE``, ``AOT_JAX_CACHE_CLAIM_SECONDS``,
    ``AOT_JAX_CACHE_WAIT_SECONDS``, ``AOT_SIGNING_KEY``); None when ``AOT_JAX_CACHE`` is unset."""
    env = os.environ if environ is None else environ
    location = env.get(ENV)
    if not location:
        return None
    return install(
        location, blob_location=env.get(ENV_BLOBS) or None, local=env.get(ENV_LOCAL) or None,
        signing_key=env.get("AOT_SIGNING_KEY") or None,
        compile_once={"1": True, "0": False}.get(env.get(ENV_COMPILE_ONCE, "").strip()),
        claim_seconds=float(env.get(ENV_CLAIM_SECONDS) or CLAIM_SECONDS),
        wait_seconds=float(env.get(ENV_WAIT_SECONDS) or WAIT_SECONDS),
    )


@atexit.register
def _release_at_exit() -> None:
    found = _installed
    if found is not None:
        found[0].at_exit()

"""jax-aot as the backend of JAX's persistent compilation cache (``aot.jax_cache``).

One line plugs a jax-aot cache into JAX's persistent cache; from then on every
``jax.jit``/``pmap`` compile of the process goes through it, under JAX's own key::

    import aot
    aot.jax_cache.install("postgresql+psycopg://ci@db/aot", blob_location="s3://bucket/aot",
                          local="/var/cache/aot-jit")

or, for an unchanged script, ``AOT_JAX_CACHE=<location>`` with
``python -m aot.cache.jax_cache script.py ARGS`` (or ``aot.jax_cache.install_from_env()``
at the top of the script). See docs/jax-cache.md.

* Entries are KIND ``jit`` rows of the index (:mod:`aot.cache.index.jit`): JAX's key,
  the jitted function's name, the digest of JAX's zstd payload, stored as it came (no
  second compression) and verified on every read; signed (HMAC) when the cache has a
  signing key. ``local=`` keeps a verified copy of each blob in a folder in front of
  the remote store.
* JAX applies its own settings: ``jax_enable_compilation_cache``,
  ``jax_persistent_cache_min_compile_time_secs`` and
  ``jax_persistent_cache_min_entry_size_bytes`` decide whether ``put`` is called.
* Never raises into a ``jit`` call: a corrupt, unreadable, unsigned or unreachable
  entry is a miss with one warning per key, and the fresh compile's ``put`` repairs it.
* Compile once per fleet (``compile_once``, on by default for a PostgreSQL index):
  a miss claims the key in the index for a short lease (``claim_seconds``, 30 s) that a
  heartbeat thread of the holder renews while it compiles
  (:class:`~aot.cache.index.claim_heartbeat.ClaimHeartbeat`: one per backend, a daemon
  started at the first claim, stopped at uninstall and exit); another process that
  misses it meanwhile waits (polling with backoff, at most ``wait_seconds``) for the
  holder's entry and loads it, and compiles itself when the holder's claim expires (a
  holder killed mid-compile: within the lease) or the bound is reached. A claim is
  given up when its compile returns (JAX's compile event, on the compiling thread), and
  renewed for at most ``wait_seconds``.
* A multi-process job (a pod slice under ``jax.distributed``; ``slice_share``, on by
  default): one process compiles each program for the job and hands the binary to the
  others (JAX's ``jax_share_binary_between_hosts``, bounded by
  ``AOT_SLICE_WAIT_SECONDS``); JAX writes from process 0 only, so only process 0 claims
  keys, and the key is made the same in every process (on CPU JAX's is not), so that
  every process hits in the next run.
* A warm start from the local tier pays nothing for the remote: :func:`install` opens
  neither the index nor the blob store; a key is first looked up in the local tier's
  own rows (:mod:`aot.cache.jax_cache.local_rows`) and served after its blob's digest
  (and its HMAC, under a signing key) was checked. The remote is opened on the first
  local miss; the hits served before are recorded in the index then, or when the
  backend closes (at exit).
"""

from __future__ import annotations

from aot.cache.jax_cache.backend import CLAIM_SECONDS, WAIT_SECONDS, JaxCacheBackend, JaxCacheCounts
from aot.cache.jax_cache.installation import (
    ENV, ENV_BLOBS, ENV_CLAIM_SECONDS, ENV_COMPILE_ONCE, ENV_LOCAL, ENV_WAIT_SECONDS, install, install_from_env,
    installed, share_between_hosts, uninstall,
)

__all__ = [
    "CLAIM_SECONDS",
    "ENV",
    "ENV_BLOBS",
    "ENV_LOCAL",
    "ENV_COMPILE_ONCE",
    "ENV_CLAIM_SECONDS",
    "ENV_WAIT_SECONDS",
    "JaxCacheBackend",
    "JaxCacheCounts",
    "WAIT_SECONDS",
    "install",
    "install_from_env",
    "installed",
    "share_between_hosts",
    "uninstall",
]

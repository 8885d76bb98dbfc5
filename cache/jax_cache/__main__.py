"""``python -m aot.cache.jax_cache SCRIPT [ARGS]``: runs SCRIPT (as ``python SCRIPT ARGS``
would) with JAX's persistent cache on the jax-aot cache named by ``AOT_JAX_CACHE``
(and ``AOT_JAX_CACHE_BLOBS``, ``AOT_JAX_CACHE_LOCAL``): an unchanged script opts in."""

from __future__ import annotations

import logging
import runpy
import sys

from aot.cache.jax_cache import ENV, install_from_env

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write("usage: AOT_JAX_CACHE=LOCATION python -m aot.cache.jax_cache SCRIPT [ARGS...]\n")
        return 2
    if install_from_env() is None:
        log.warning("%s is not set: running %s with JAX's own cache", ENV, args[0])
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

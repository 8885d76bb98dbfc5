"""``import aot.jax_cache``: the backend of JAX's persistent compilation cache.

The backend lives in the cache (:mod:`aot.cache.jax_cache`, installed from
``cache/jax_cache/``); ``aot.jax_cache.install`` reached it through the lazy names of
``aot/__init__.py``, but ``import aot.jax_cache`` and ``from aot.jax_cache import
install`` need a module of that name. This is it: an entry point (like ``aot.__main__``,
neither core nor cache), which puts the real module in its place in ``sys.modules``, so
both names are one module object and share its state (the installed backend).
"""

from __future__ import annotations

import sys

import aot.cache.jax_cache as backend

sys.modules[__name__] = backend

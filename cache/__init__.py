"""The artifact cache (installed as ``aot.cache``): SQL index, blob stores, the Cache facade.

This package initialiser stays free of imports so that ``aot.cache.storage.folder`` and
``aot.cache.index.sql`` can be used (and tested) without importing JAX.
"""

from __future__ import annotations

"""``aot.Cache``: opens a cache, with a local read-through tier when ``local=`` is given.

``aot.Cache(location, ..., local=DIR)`` is a :class:`~aot.cache.tiered.TieredCache`;
without ``local`` it is a :class:`~aot.cache.cache.Cache`. The choice is made here,
above both classes, so that the facade never imports its own subclass (the tier
builds on the facade, not the other way round). Every cache, tiered or not, is an
instance of ``aot.Cache``, and a class derived from ``aot.Cache`` is constructed as
any class is.
"""

from __future__ import annotations

import os
from typing import Any

from aot.cache import cache as facade
from aot.cache.tiered import TieredCache

__all__ = ["Cache", "open_cache"]


def open_cache(
    location: str | os.PathLike[str] | None = None,
    *,
    local: str | os.PathLike[str] | None = None,
    **options: Any,
) -> facade.Cache:
    """A :class:`~aot.cache.cache.Cache` at ``location`` (``options`` are its keyword
    arguments), read through a local tier in the folder ``local`` when given (then
    ``refresh=`` is accepted too: :class:`~aot.cache.tiered.TieredCache`)."""
    if local is None:
        return facade.Cache(location, **options)
    return TieredCache(location, local=local, **options)


class _Opens(type):
    """The type of :class:`Cache`: calling ``aot.Cache`` itself opens the class that
    fits (:func:`open_cache`); every :class:`aot.cache.cache.Cache` is an instance."""

    def __call__(
        cls,
        location: str | os.PathLike[str] | None = None,
        *,
        local: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> Any:
        if cls is not Cache:  # a class derived from aot.Cache: constructed as usual
            if local is not None:
                options["local"] = local
            return super().__call__(location, **options)
        return open_cache(location, local=local, **options)

    def __instancecheck__(cls, instance: Any) -> bool:
        if cls is Cache:
            return isinstance(instance, facade.Cache)
        return super().__instancecheck__(instance)

    def __subclasscheck__(cls, subclass: type) -> bool:
        if cls is Cache:
            return issubclass(subclass, facade.Cache)
        return super().__subclasscheck__(subclass)


class Cache(facade.Cache, metaclass=_Opens):
    __doc__ = facade.Cache.__doc__

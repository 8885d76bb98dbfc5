"""Describing a failure for people: the whole message, and the user's own line.

When tracing fails, JAX's message has two halves: what went wrong, and where ("The
error occurred while tracing the function broken at mymodel.py:34 for jit. ... depends
on the value of the argument x"). Both are kept, and the innermost frame of the
user's code (not JAX's, not jax-aot's, not another installed package's) is added:
``at mymodel.py:35 in broken: if x > 0:``. The traceback is kept as text, so that
``aot warmup --debug`` can show it for an entry that failed in a worker process.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from functools import lru_cache

from aot.errors import AotError

__all__ = ["Failure"]


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    import aot

    roots = {os.path.dirname(os.path.abspath(aot.__file__))}
    for name in ("aot.cache", "aot.cli", "jax", "jaxlib"):
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if file:
            roots.add(os.path.dirname(os.path.abspath(file)))
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.abspath(path))
    roots.add(os.path.dirname(os.path.abspath(__file__)))  # aot/cache itself
    return tuple(sorted(roots))


def _is_library(filename: str) -> bool:
    if filename.startswith("<frozen ") or filename.startswith("<__array_function__"):
        return True
    path = os.path.abspath(filename)
    return any(path == root or path.startswith(root + os.sep) for root in _library_roots()) or (
        "site-packages" in path.split(os.sep) or "dist-packages" in path.split(os.sep)
    )


def _shown_path(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return relative if not relative.startswith("..") else filename


def user_frame(exc: BaseException) -> str | None:
    """``mymodel.py:35 in broken: if x > 0:``: the innermost frame of the user's code."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if _is_library(frame.filename):
            continue
        where = f"{_shown_path(frame.filename)}:{frame.lineno} in {frame.name}"
        line = (frame.line or "").strip()
        return f"{where}: {line}" if line else where
    return None


@dataclass(frozen=True, slots=True)
class Failure:
    """An exception as text: its type, whole message, the user's frame, the traceback."""

    type: str
    message: str
    frame: str | None
    traceback: str
    expected: bool  # an AotError: jax-aot's own, clear message

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        expected = isinstance(exc, AotError)
        return cls(
            type(exc).__name__, str(exc).strip(), None if expected else user_frame(exc),
            text, expected,
        )

    def describe(self) -> str:
        """jax-aot's own errors as they are; others as ``Type: whole message`` and
        ``at file:line in function: source`` on a second line."""
        if self.expected:
            return self.message
        text = f"{self.type}: {self.message}" if self.message else self.type
        if self.frame is not None:
            text += f"\n  at {self.frame}"
        return text

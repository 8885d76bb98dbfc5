"""The refusal of a JAX release outside the supported range, at ``import aot``.

The range and the reading of the installed versions are
:mod:`aot.jaxcompat.versions` (a leaf package: it raises nothing of ours); this
module turns its answer into :class:`aot.UnsupportedJaxError`, reported in one line.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from types import TracebackType

from aot.errors import UnsupportedJaxError
from aot.jaxcompat.versions import unsupported_jax


def check_installed_jax() -> None:
    """Raises :class:`aot.UnsupportedJaxError` unless the jax and jaxlib Python would
    import are supported releases; the error is then reported in one line if nothing
    catches it (:func:`report_in_one_line`)."""
    problem = unsupported_jax()
    if problem is None or _asks_for_version():
        return
    sys.excepthook = functools.partial(report_in_one_line, previous=sys.excepthook)
    raise UnsupportedJaxError(*problem)


def _asks_for_version() -> bool:
    """Whether this process is ``aot --version`` (or ``python -m aot --version``): it
    answers under any JAX, which it never imports."""
    command = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return command in _COMMANDS and "--version" in sys.argv[1:]


#: What ``sys.argv[0]`` reads in the ``aot`` command: the console script, or ``python
#: -m aot`` (``-m`` while the package imports, ``__main__.py`` after).
_COMMANDS = frozenset({"aot", "__main__.py", "-m"})


def report_in_one_line(
    kind: type[BaseException], error: BaseException, tb: TracebackType | None,
    previous: object = None,
) -> None:
    """``sys.excepthook`` once :class:`UnsupportedJaxError` was raised: its message in
    one line (``Error: ...`` for the ``aot`` command, as its other errors), not a
    traceback through the import machinery; any other error goes to the hook that was
    there before."""
    if not isinstance(error, UnsupportedJaxError):
        hook = previous if callable(previous) else sys.__excepthook__
        hook(kind, error, tb)
        return
    command = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    prefix = "Error" if command in _COMMANDS else "aot.UnsupportedJaxError"
    sys.stderr.write(f"{prefix}: {error}\n")

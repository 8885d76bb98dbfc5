"""Shared pieces of the command line: the cache handle, --json, rendering helpers.

Nothing here imports JAX at module level, so ``aot --help`` stays fast; commands import
the library when they run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from aot.cache.cache import Cache

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class State:
    """What the ``aot`` group's options set up for its commands."""

    location: str | None = None
    read_only: bool = False
    debug: bool = False
    _cache: Cache | None = field(default=None, repr=False)

    def cache(self, *, create: bool = False) -> Cache:
        """The cache named by ``--cache`` / ``AOT_CACHE`` (opened once, closed at exit).

        Only commands that store (``create=True``: compile, warmup, bundle import)
        create a cache folder; the others report a folder without a cache, so a typo
        in ``--cache`` is not an empty cache.
        """
        if self._cache is None:
            from aot.cache.cache import Cache, check_folder_cache, default_location, is_url

            location = self.location if self.location is not None else default_location()
            if not create and not is_url(location):
                check_folder_cache(location)  # missing, or lost/truncated beside blobs
            self._cache = Cache(location, read_only=self.read_only)
            click.get_current_context().call_on_close(self._close)
        return self._cache

    def _close(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None


pass_state = click.make_pass_decorator(State, ensure=True)


def json_option(fn: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document (see docs/cli.md)."
    )(fn)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


# ---------------------------------------------------------------- rendering


def human_size(n: int | None) -> str:
    if n is None:
        return "-"
    from aot.cache.maintenance import human_size as _human_size

    return _human_size(int(n))


def when(value: datetime | str | None) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM`` UTC."""
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    return value.strftime("%Y-%m-%d %H:%M")


def shorten(text: str | None, width: int) -> str:
    if text is None:
        return "-"
    return text if len(text) <= width else text[: width - 3] + "..."


def shorten_middle(text: str, width: int) -> str:
    """Keeps both ends (a signature's last arguments are usually the batch)."""
    if len(text) <= width:
        return text
    head = (width - 5) // 2
    return f"{text[:head]} ... {text[-(width - 5 - head):]}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """A plain, aligned text table (columns in ``right`` are right-aligned)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def key_value(pairs: Sequence[tuple[str, Any]], indent: int = 2) -> str:
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{' ' * indent}{k.ljust(width)}  {v}" for k, v in pairs)


# ---------------------------------------------------------------- logging


class _ClickHandler(logging.Handler):
    """Writes log records to the current stderr (CliRunner swaps streams per call)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
        except Exception:  # noqa: BLE001 - logging must never fail a command
            self.handleError(record)


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logger = logging.getLogger("aot")
    for handler in list(logger.handlers):
        if isinstance(handler, _ClickHandler):
            logger.removeHandler(handler)
    handler = _ClickHandler()
    handler.setFormatter(logging.Formatter("aot: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)


# ---------------------------------------------------------------- option parsing


def split_assignment(value: str, what: str, param: str) -> tuple[str, str]:
    name, sep, rest = value.partition("=")
    if not sep or not name.strip():
        raise click.BadParameter(f"{value!r} is not {what}", param_hint=param)
    return name.strip(), rest


def parse_static(values: Sequence[str]) -> tuple[tuple[str, Any], ...]:
    out = []
    for value in values:
        name, text = split_assignment(value, "NAME=JSON", "'--static'")
        try:
            out.append((name, json.loads(text)))
        except ValueError:
            raise click.BadParameter(
                f"{value!r}: {text!r} is not JSON; e.g. training=false, n=3, "
                "mode='\"train\"'",
                param_hint="'--static'",
            ) from None
    return tuple(out)


def parse_kwargs(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    return tuple(split_assignment(v, "NAME=SPEC", "'--kwarg'") for v in values)


def parse_mesh_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[tuple[str, int], ...] | None:
    if value is None:
        return None
    from aot.cache.warmup import parse_mesh
    from aot.errors import SpecError

    try:
        return parse_mesh(value)
    except SpecError as exc:
        raise click.BadParameter(str(exc)) from None

"""Shared pieces of the command line: the state the global options set, the cache
handle, --json, confirmation, terminal checks, rendering helpers.

Nothing here imports JAX at module level, so ``aot --help`` stays fast; commands import
the library when they run.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from aot.platforms import mentions_captured_target

if TYPE_CHECKING:
    from aot.cache.cache import Cache
    from aot.cache.config import Settings
    from aot.distributed_job import JobProcess

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class State:
    """What the global options (before or after the subcommand) set up for commands."""

    location: str | None = None  # --cache
    blobs: str | None = None  # --blobs
    local: str | None = None  # --local
    blobs_mirror: bool = False  # --blobs-mirror (or AOT_BLOBS_MIRROR=1)
    read_only: bool = False
    json: bool = False
    debug: bool = False
    verbose: int = 0  # -v (INFO), -vv (DEBUG): before and after the command add up
    #: The command runs in the ``aot`` process (:func:`aot.cli.main.main`), not inside
    #: a caller's (``CliRunner``, a program calling ``cli.main``): see :meth:`start_up`.
    owns_process: bool = False
    #: This process's place in a multi-process job (``--distributed``): process 0 opens
    #: the cache and writes it; the others open it read-only once process 0 has it open,
    #: and load what process 0 stores (:mod:`aot.cli.distributed`).
    job: JobProcess | None = None
    #: Process 0 told the others whether the cache opened (:meth:`tell_job_cache`).
    job_cache_told: bool = False
    _settings: Settings | None = field(default=None, repr=False)
    _cache: Cache | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        """Flags > environment > ``[tool.aot]`` in pyproject.toml > defaults."""
        if self._settings is None:
            from aot.cache.config import resolve_settings

            self._settings = resolve_settings(
                {"cache": self.location, "blobs": self.blobs, "local": self.local}
            )
        return self._settings

    def cache(self, *, create: bool = False) -> Cache:
        """The cache of the settings (opened once, closed when the command ends).

        Only commands that store (``create=True``: compile, warmup, bundle import)
        create a cache folder; the others report a folder without a cache, so a typo
        in ``--cache`` is not an empty cache.
        """
        if self._cache is None:
            self._cache = self._open(create)
            click.get_current_context().call_on_close(self._close)
        return self._cache

    def use_gpu_targets(self, *texts: str | None, manifest: str | None = None, create: bool = False) -> None:
        """Opens the cache and makes its captured GPUs what ``cuda:NAME`` compiles for
        (aot.Cache.use_targets), before any target is parsed or worker started, when
        one of ``texts`` or the ``manifest`` file names a GPU target; nothing else."""
        named = any(t and mentions_captured_target(t) for t in texts)
        if not named and manifest is not None:
            try:
                with open(manifest, encoding="utf-8") as f:
                    named = mentions_captured_target(f.read())
            except OSError:
                named = False  # the manifest's own loading says what is wrong with it
        if not named:
            return
        from aot.errors import CacheError

        try:
            self.cache(create=create).use_targets()
        except CacheError:
            if create:
                raise
            # No cache here (yet): no captured GPU; the command says what is wrong with
            # the cache, or with the target, itself.

    def _open(self, create: bool) -> Cache:
        read_only = self.read_only
        if self.job is not None and not self.job.primary:
            self._wait_for_job_cache()
            read_only, create = True, False  # process 0 created it, and alone writes it
        try:
            cache = self._open_settings(create, read_only)
        except BaseException as exc:
            self.tell_job_cache(False, f"{type(exc).__name__}: {exc}")
            raise
        self.tell_job_cache(True)
        return cache

    def _wait_for_job_cache(self) -> None:
        assert self.job is not None
        outcome = self.job.outcome_of("cache", 0)
        if not outcome.ok:
            raise click.ClickException(f"{self.job.describe()}: process 0 did not open the cache: {outcome.message}")

    def tell_job_cache(self, ok: bool, message: str = "") -> None:
        """Process 0 of a job tells the others whether the cache opened (once): they
        wait for it before they open it read-only."""
        if self.job is None or not self.job.primary or self.job_cache_told:
            return
        self.job_cache_told = True
        try:
            self.job.publish("cache", ok, message)
        except Exception as exc:  # noqa: BLE001 - the others find out at the job's end, bounded
            logging.getLogger(__name__).warning("could not tell the job that the cache opened: %s", exc)

    def _open_settings(self, create: bool, read_only: bool) -> Cache:
        from aot.cache.store import require_cache  # imports JAX
        from aot.cache.cache import Cache  # with --local, a TieredCache

        settings = self.settings
        location = settings.cache.value
        assert location is not None
        if not create:
            require_cache(
                location,
                "nothing was compiled into it yet: aot compile, aot warmup and aot "
                "bundle import create one",
                f"check --cache, AOT_CACHE or [tool.aot] (the location came from "
                f"{settings.cache.source})",
            )
        return Cache(
            location, read_only=read_only or (not create and _read_only_volume(location)),
            blob_location=settings.blobs.value,
            signing_key=settings.signing_key(), local=settings.local.value,
            blob_mirror=self.mirror, timeouts=settings.timeouts(), create=create,
        )

    @property
    def mirror(self) -> bool:
        """``--blobs-mirror``, else ``AOT_BLOBS_MIRROR`` (1, true, yes)."""
        return self.blobs_mirror or os.environ.get("AOT_BLOBS_MIRROR", "").strip().lower() in ("1", "true", "yes")

    def _close(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None

    @contextmanager
    def start_up(self) -> Iterator[None]:
        """The imports of a command that compiles (JAX and its backend, SQLAlchemy, the
        cache), with the garbage collector paused, then frozen.

        Imports make long-lived objects, hardly any garbage; yet every 25% of growth
        of the heap starts a full collection that walks all of it: three while JAX
        and SQLAlchemy are imported, 0.1 s of CPU per warm-up (benchmarks/README.md).
        Paused, none runs; at the end :func:`gc.freeze` moves what the imports made
        out of every later collection, which then walk only what the command makes
        (tracing, lowering), as often as before.

        Only when the command owns the process (:attr:`owns_process`) and the collector
        is on: a caller's process keeps its collector as it is."""
        if not self.owns_process or not gc.isenabled():
            yield
            return
        gc.disable()
        try:
            yield
        finally:
            gc.freeze()
            gc.enable()


def _read_only_volume(location: str) -> bool:
    """Whether ``location`` is a folder cache on a file system mounted read-only: the
    commands that only read open it read-only (SQLite could not open it otherwise), and
    one that writes says the cache is read-only."""
    from pathlib import Path

    from aot.cache.index.read_only import read_only_file_system
    from aot.cache.storage.locations import classify_location

    if classify_location(location).scheme is not None:
        return False
    folder = Path(location).expanduser()
    return folder.is_dir() and read_only_file_system(folder)


pass_state = click.make_pass_decorator(State, ensure=True)


def state_of(ctx: click.Context) -> State:
    return ctx.ensure_object(State)


# ---------------------------------------------------------------- global options
#
# Accepted before or after the subcommand (`aot --cache D ls` and `aot ls --cache D`):
# the group declares them, and AotGroup.add_command gives every command it registers
# (fleet's future ones too) the same options, which set the same State.


def _setter(attribute: str, flag: bool) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if (flag and value) or (not flag and value is not None):
            state = state_of(ctx)
            setattr(state, attribute, value)
            state._settings = None  # resolved again with the new flag
        return value

    return callback


def _more_verbose(ctx: click.Context, param: click.Parameter, value: int) -> int:
    if value:
        state = state_of(ctx)
        state.verbose += value
        configure_logging(state.verbose)
    return value


def global_options() -> list[click.Option]:
    """Fresh instances of the global options (one set per command)."""
    return [
        click.Option(
            ["-v", "--verbose"], count=True, expose_value=False, callback=_more_verbose,
            help="Log what the library does (-vv: debug).",
        ),
        click.Option(
            ["--cache"], metavar="LOCATION", expose_value=False, callback=_setter("location", False),
            help="Cache folder or SQLAlchemy URL (env AOT_CACHE, [tool.aot] cache).",
        ),
        click.Option(
            ["--blobs"], metavar="LOCATION", expose_value=False, callback=_setter("blobs", False),
            help="Blob location, if not inside the cache (env AOT_BLOBS, [tool.aot] blobs).",
        ),
        click.Option(
            ["--blobs-mirror"], is_flag=True, expose_value=False, callback=_setter("blobs_mirror", True),
            help="--blobs is a mirror of the blob location the cache records (env AOT_BLOBS_MIRROR=1).",
        ),
        click.Option(
            ["--local"], metavar="FOLDER", expose_value=False, callback=_setter("local", False),
            help="A local read-through tier in front of the cache (env AOT_LOCAL, [tool.aot] local).",
        ),
        click.Option(
            ["--read-only"], is_flag=True, expose_value=False, callback=_setter("read_only", True),
            help="Open the cache read-only (never write to it).",
        ),
        click.Option(
            ["--json"], is_flag=True, expose_value=False, callback=_setter("json", True),
            help="Print one JSON document (see docs/cli.md).",
        ),
        click.Option(
            ["--debug"], is_flag=True, expose_value=False, callback=_setter("debug", True),
            help="Show tracebacks instead of one-line errors.",
        ),
    ]


def add_global_options(command: click.Command) -> None:
    """Appends the global options a command does not declare itself."""
    taken = {opt for param in command.params for opt in getattr(param, "opts", ())}
    for option in global_options():
        if not set(option.opts) & taken:
            command.params.append(option)


def json_option(fn: F) -> F:
    """``--json`` passed to the command as ``as_json`` (also true after ``aot --json``)."""

    def callback(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        state = state_of(ctx)
        state.json = bool(value or state.json)
        return state.json

    return click.option(
        "--json", "as_json", is_flag=True, callback=callback,
        help="Print one JSON document (see docs/cli.md).",
    )(fn)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


# ---------------------------------------------------------------- terminals


def stdin_is_tty() -> bool:
    return sys.stdin.isatty()


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def terminal_width() -> int | None:
    """``$COLUMNS``, else the terminal's width; ``None`` when stdout is no terminal
    (piped output is not abbreviated)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if stdout_is_tty():
        return shutil.get_terminal_size((100, 24)).columns
    return None


def confirm(question: str, *, yes: bool) -> None:
    """Asks ``question`` on a terminal (stdin), unless ``--yes``; without a terminal
    the answer is yes (scripts). A no ends the command: nothing changed, exit 1."""
    if yes or not stdin_is_tty():
        return
    if not click.confirm(question, default=False, err=True):
        click.echo("Aborted: nothing was removed.", err=True)
        click.get_current_context().exit(1)


# ---------------------------------------------------------------- rendering


def human_size(n: int | None) -> str:
    if n is None:
        return "-"
    from aot.cache.units import human_size as _human_size

    return _human_size(int(n))


def when(value: datetime | str | None) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM`` UTC."""
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
        return when.strftime("%Y-%m-%d %H:%M")
    return value.strftime("%Y-%m-%d %H:%M")


def shorten(text: str | None, width: int) -> str:
    if text is None:
        return "-"
    return text if len(text) <= width else text[: width - 3] + "..."


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


def unknown_environment_note(known: bool) -> None:
    """One line on stderr when this host's environment is unknown (ENV says 'unknown')."""
    if not known:
        from aot.fingerprint import UNKNOWN_ENVIRONMENT_NOTE

        click.echo(f"note: {UNKNOWN_ENVIRONMENT_NOTE}", err=True)


SERVED_RELEASE_HELP = (
    "Answer for a replica serving this release label. Default: as aot.load chooses, "
    "AOT_RELEASE, else the cache's default release (aot release default), else the refs."
)


def served_release_option(fn: F) -> F:
    """``--release LABEL`` of ``ls``, ``show`` and ``why``: the release they answer for."""
    return click.option("--release", metavar="LABEL", default=None, help=SERVED_RELEASE_HELP)(fn)


def resolve_served_release(cache: Any, release: str | None) -> str | None:
    """The release a replica of ``cache`` serves (``release`` first): the rule of
    ``aot.load`` (:func:`aot.cache.serving.release_rule.served_release`); None: the refs."""
    from aot.cache.serving.release_rule import served_release

    return served_release(cache, release)

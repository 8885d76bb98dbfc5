"""The ``aot`` command: a click group over the library (see docs/cli.md).

Every command parses its options, makes one library call and renders the result; a
library error (:class:`aot.AotError`) becomes one line ``Error: <message>`` and exit
status 1, a usage error exit status 2. ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

from typing import Any

import click

from aot.cli.common import State, configure_logging


class AotGroup(click.Group):
    """Maps exceptions raised by commands to one clear line (unless ``--debug``) and
    lists commands in the order of the workflow, not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            state = ctx.find_object(State)
            if state is not None and state.debug:
                raise
            raise click.ClickException(error_message(exc)) from exc


def error_message(exc: BaseException) -> str:
    """The message of a library error; the type and a hint for anything unexpected."""
    from aot.errors import AotError

    if isinstance(exc, AotError):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first} (run `aot --debug ...` for the traceback)"


CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group("aot", cls=AotGroup, context_settings=CONTEXT_SETTINGS)
@click.option(
    "--cache", "location", envvar="AOT_CACHE", metavar="LOCATION", show_envvar=True,
    help="Cache folder or SQLAlchemy URL (postgresql+psycopg://...). "
    "Default: the user cache folder.",
)
@click.option("--read-only", is_flag=True, help="Open the cache read-only (never write to it).")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.option("-v", "--verbose", count=True, help="Log what the library does (-vv: debug).")
@click.version_option(package_name="jax-aot", prog_name="aot")
@click.pass_context
def cli(ctx: click.Context, location: str | None, read_only: bool, debug: bool, verbose: int) -> None:
    """Ahead-of-time compilation of JAX programs into a fingerprint-keyed cache.

    Compile in CI (`aot warmup manifest.toml`), ship the cache or a bundle, and serve
    with `aot.load(name)` without tracing or compiling.
    """
    ctx.obj = State(location=location, read_only=read_only, debug=debug)
    configure_logging(verbose)


def _register() -> None:
    from aot.cli import bundle, compile, doctor, listing, maintenance, warmup

    cli.add_command(compile.compile_command)
    cli.add_command(warmup.warmup_command)
    cli.add_command(listing.ls_command)
    cli.add_command(listing.show_command)
    cli.add_command(maintenance.verify_command)
    cli.add_command(maintenance.gc_command)
    cli.add_command(bundle.bundle_group)
    cli.add_command(compile.why_command)
    cli.add_command(doctor.doctor_command)


_register()


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point (``aot``) and ``python -m aot``."""
    return cli.main(args=argv, prog_name="aot")


if __name__ == "__main__":  # pragma: no cover
    main()

"""The group class of ``aot`` and its subgroups: global options and error messages."""

from __future__ import annotations

from typing import Any

import click

from aot.cli.common import State, add_global_options


class AotGroup(click.Group):
    """Lists commands in the order of the workflow, not alphabetically; gives every
    command the global options; maps exceptions to one clear message (unless
    ``--debug``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        add_global_options(cmd)
        if isinstance(cmd, click.Group) and not isinstance(cmd, AotGroup):
            for sub in cmd.commands.values():
                add_global_options(sub)
        super().add_command(cmd, name)

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
    """A library error's message; anything else with its whole message, the user's
    own frame, and a hint for the traceback."""
    from aot.cache.warmup.failures import Failure
    from aot.errors import AotError

    if isinstance(exc, AotError):
        return str(exc)
    if isinstance(exc, RuntimeError):  # JAX could not start the device's backend (held?)
        from aot.device import device_error

        translated = device_error(exc)
        if translated is not None:
            return str(translated)
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return f"{Failure.of(exc).describe()}\n(run `aot --debug ...` for the traceback)"

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
        except BrokenPipeError:
            if not stdout_closed():  # a socket's (the index's, a blob store's): an error
                raise click.ClickException("Broken pipe (a connection closed)") from None
            # The reader of our output left (`aot ls | head`): end quietly, as git and ls do.
            raise click.exceptions.Exit(0) from None
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


def stdout_closed() -> bool:
    """Whether standard output is a pipe its reader closed (``aot ls | head``); if so,
    it now writes to the null device, so that what is still buffered, and the exit's
    flush, write nowhere instead of failing again (Python's own advice for SIGPIPE)."""
    import os
    import select
    import stat
    import sys

    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        # A pipe without a reader polls as an error (Linux and the BSDs alike).
        if not any(events & select.POLLERR for _, events in poller.poll(0)):
            return False
    except (OSError, ValueError, AttributeError):  # no real stdout (a test's), no poll()
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    return True

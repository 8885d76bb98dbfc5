"""Every command and subcommand has --help that exits 0 and mentions its options."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from aot.cli.main import cli


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    yield path, group
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = list(_commands(cli))
EXPECTED = {
    "compile", "warmup", "ls", "show", "verify", "gc", "bundle", "bundle export",
    "bundle import", "why", "doctor",
}


def test_every_documented_command_exists() -> None:
    assert {" ".join(p) for p, _ in COMMANDS if p} == EXPECTED


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "aot" for p, _ in COMMANDS])
def test_help(path: tuple[str, ...], command: click.Command) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: aot" + "".join(f" {p}" for p in path))
    assert command.help, f"{path} has no help text"
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            longest = max(param.opts, key=len)
            assert longest in result.output, f"{path}: --help does not mention {longest}"
        elif isinstance(param, click.Argument):
            assert param.make_metavar(click.Context(command)) in result.output


def test_short_help_flag_and_version() -> None:
    assert CliRunner().invoke(cli, ["-h"]).exit_code == 0
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("aot, version ")


def test_no_command_shows_usage() -> None:
    result = CliRunner().invoke(cli, [])
    assert result.exit_code in (0, 2)  # click >= 8.2 exits 2 when a group gets no command
    assert "Usage: aot" in result.output


def test_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["nosuch"])
    assert result.exit_code == 2
    assert "No such command 'nosuch'" in result.output

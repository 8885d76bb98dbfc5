"""Every command and subcommand has --help that exits 0 and mentions its options."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from aot.cache.index.entry import SCHEMA_VERSION
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
    "compile", "warmup", "ls", "show", "verify", "gc", "rm", "bundle", "bundle export",
    "bundle import", "why", "doctor", "push", "pull", "stats",
    "release", "release ls", "release show", "release promote", "release rollback", "release default", "release history", "release rm",
    "release diff",
    "history", "repair",
}
GLOBAL = ("--cache", "--blobs", "--local", "--read-only", "--json", "--debug", "-v")


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


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "aot" for p, _ in COMMANDS])
def test_every_command_takes_the_global_options(path: tuple[str, ...], command: click.Command) -> None:
    options = {opt for param in command.params for opt in getattr(param, "opts", ())}
    assert set(GLOBAL) <= options, sorted(set(GLOBAL) - options)


def test_a_command_added_later_gets_the_global_options() -> None:
    """fleet's push/pull/stats will join the group: the mechanism must cover them."""
    from aot.cli.common import State, pass_state
    from aot.cli.group import AotGroup

    group = AotGroup("g")

    @group.command("later")
    @pass_state
    def later(state: State) -> None:
        click.echo(f"{state.location} {state.read_only} {state.json}")

    result = CliRunner().invoke(group, ["later", "--cache", "/x", "--read-only", "--json"])
    assert result.exit_code == 0, result.output
    assert result.output == "/x True True\n"


def test_bundle_help_lists_its_commands_without_cutting_them_off() -> None:
    result = CliRunner().invoke(cli, ["bundle", "--help"])
    assert result.exit_code == 0
    assert "  export  Write entries (all, or matching NAME_GLOBs) to FILE.\n" in result.output
    assert "  import  Import the entries of FILE (blobs re-hashed first).\n" in result.output
    commands = result.output.split("Commands:\n", 1)[1]
    assert "..." not in commands


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


@pytest.mark.parametrize("where", ["before", "after", "both"])
def test_verbose_before_or_after_the_command(where: str, tmp_path) -> None:  # noqa: ANN001
    """`aot -v compile ...` and `aot compile ... -v` log the same INFO lines on stderr;
    one -v on each side is -vv (DEBUG)."""
    command = ["compile", "fixtures.models:tiny", "--name", "tiny", "--arg", "f32[8]", "--arg", "f32[8]"]
    args = {"before": ["-v", *command], "after": [*command, "-v"], "both": ["-v", *command, "-v"]}[where]
    result = CliRunner().invoke(cli, ["--cache", str(tmp_path / "cache"), *args])
    assert result.exit_code == 0, result.output
    logged = [line.split(":", 2)[1].strip() for line in result.stderr.splitlines() if line.startswith("aot: ")]
    info = [line for line in result.stderr.splitlines() if line.startswith("aot: INFO: ")]
    assert info[0] == f"aot: INFO: creating the cache index schema v{SCHEMA_VERSION} at sqlite:///{tmp_path}/cache/index.sqlite"
    assert info[1].startswith("aot: INFO: compiled tiny (f32[8], f32[8]) in ")
    assert ("DEBUG" in logged) == (where == "both"), result.stderr
    # Not verbose: nothing logged.
    quiet = CliRunner().invoke(cli, ["--cache", str(tmp_path / "cache"), *command])
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr

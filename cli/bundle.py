"""``aot bundle export`` / ``aot bundle import``: ship entries as one file."""

from __future__ import annotations

import click

from aot.cli.common import State, echo_json, human_size, json_option, pass_state


@click.group("bundle", short_help="Export or import entries as one file.")
def bundle_group() -> None:
    """Export entries to one file, or import such a file into the cache."""


@bundle_group.command("export")
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("globs", nargs=-1, metavar="[NAME_GLOB]...")
@json_option
@pass_state
def export_command(state: State, file: str, globs: tuple[str, ...], as_json: bool) -> None:
    """Write every intact entry (or those whose names match NAME_GLOBs) to FILE."""
    report = state.cache().export_bundle(file, list(globs) or None)
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(f"exported {len(report.entries)} entries to {report.path} ({human_size(report.bytes)})")


@bundle_group.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@json_option
@pass_state
def import_command(state: State, file: str, as_json: bool) -> None:
    """Import the entries of bundle FILE (every blob is re-hashed first)."""
    report = state.cache(create=True).import_bundle(file)
    if as_json:
        echo_json(report.to_dict())
    else:
        repaired = f", {len(report.repaired)} repaired" if report.repaired else ""
        click.echo(
            f"imported {len(report.imported)} entries from {report.path} "
            f"({len(report.skipped)} already present{repaired})"
        )
        for refusal in report.refused:
            click.echo(f"refused {refusal.name[:80]!r} ({refusal.key[:12]}): {refusal.reason}")

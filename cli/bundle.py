"""``aot bundle export`` / ``aot bundle import``: ship entries as one file."""

from __future__ import annotations

import json

import click

from aot.cache.units import counted
from aot.cli.common import State, echo_json, human_size, pass_state
from aot.cli.group import AotGroup
from aot.cli.params import complete_entry_names


@click.group("bundle", cls=AotGroup, short_help="Export or import entries as one file.")
def bundle_group() -> None:
    """Export entries to one file, or import such a file into the cache."""


@bundle_group.command("export", short_help="Write entries (all, or matching NAME_GLOBs) to FILE.")
@click.argument("file", metavar="FILE|URL|-")
@click.argument("globs", nargs=-1, metavar="[NAME_GLOB]...", shell_complete=complete_entry_names)
@click.option("--release", metavar="LABEL",
              help="Export the entries of release LABEL and the label itself (instead of NAME_GLOBs).")
@pass_state
def export_command(state: State, file: str, globs: tuple[str, ...], release: str | None) -> None:
    """Write every intact entry (or those whose names match NAME_GLOBs) to FILE:
    a file (mode 0644), an object-store URL (s3://, gs://, az://, file://), or - for
    standard output (the report then goes to standard error). Each entry carries its
    compile time and the cache's ref of it, if any."""
    report = state.cache().export_bundle(file, list(globs) or None, release=release)
    to_stderr = file == "-"
    if state.json:
        if to_stderr:  # standard output carries the bundle
            click.echo(json.dumps(report.to_dict(), indent=2, default=str), err=True)
        else:
            echo_json(report.to_dict())
    else:
        click.echo(
            f"exported {counted(len(report.entries), 'entry')} to {report.path} ({human_size(report.bytes)})",
            err=to_stderr,
        )


@bundle_group.command("import", short_help="Import the entries of FILE (blobs re-hashed first).")
@click.argument("file", metavar="FILE|URL|-")
@click.option("--refs", "overwrite_refs", is_flag=True,
              help="Overwrite this cache's refs with the bundle's (by default a ref is set only where none exists).")
@pass_state
def import_command(state: State, file: str, overwrite_refs: bool) -> None:
    """Import the entries of bundle FILE (every blob is re-hashed first): a file, an
    object-store URL (s3://, gs://, az://, file://), or - for standard input. Entries
    keep their compile time; the bundle's refs are set where this cache has none
    (--refs: everywhere), and a release it carries is recorded under its label."""
    report = state.cache(create=True).import_bundle(file, refs=overwrite_refs)
    if state.json:
        echo_json(report.to_dict())
    else:
        repaired = f", {len(report.repaired)} repaired" if report.repaired else ""
        click.echo(
            f"imported {counted(len(report.imported), 'entry')} from {report.path} "
            f"({len(report.skipped)} already present{repaired})"
        )
        for refusal in report.refused:
            click.echo(f"refused {refusal.name[:80]!r} ({refusal.key[:12]}): {refusal.reason}")
        refs = report.refs
        if refs.set or refs.kept or refs.release:
            label = f"; release {refs.release} recorded" if refs.release else ""
            kept = f", {len(refs.kept)} kept (this cache's own; --refs overwrites)" if refs.kept else ""
            click.echo(f"refs: {len(refs.set)} set{kept}{label}")
        if refs.problem:
            click.echo(f"failed: {refs.problem}")
    if report.refs.problem:
        click.get_current_context().exit(1)

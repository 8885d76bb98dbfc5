"""``aot push`` and ``aot pull``: copy entries between this cache and another."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from aot.cache.units import counted
from aot.cli.common import State, echo_json, human_size, pass_state
from aot.cli.params import complete_entry_names

if TYPE_CHECKING:
    from aot.cache.admin.transfer import TransferReport

JOBS_HELP = "Blobs checked or copied at once (threads; object stores reward a few)."
REFS_HELP = (
    "Overwrite the other side's refs of the copied entries with this side's (by default a ref "
    "is copied only where the destination has none)."
)
RELEASE_HELP = (
    "Copy the entries of release LABEL, write their refs and record LABEL at the destination "
    "(instead of NAME_GLOBs)."
)


def _render(state: State, report: TransferReport, verb: str) -> None:
    if state.json:
        echo_json(report.to_dict())
    else:
        extra = f", {len(report.repaired)} repaired" if report.repaired else ""
        click.echo(
            f"{verb} {counted(len(report.copied), 'entry')} ({human_size(report.bytes_copied)}) "
            f"{'to' if verb == 'pushed' else 'from'} "
            f"{report.destination if verb == 'pushed' else report.source}: "
            f"{len(report.skipped)} already there{extra}, {len(report.failed)} failed "
            f"in {report.seconds:.1f}s"
        )
        refs = report.refs
        if refs.set or refs.kept or refs.release:
            label = f"; release {refs.release} recorded" if refs.release else ""
            kept = f", {len(refs.kept)} kept (the destination's own; --refs overwrites)" if refs.kept else ""
            click.echo(f"refs: {len(refs.set)} set{kept}{label}")
        for key, reason in report.failed:
            click.echo(f"failed {key[:12]}: {reason}")
        if refs.problem:
            click.echo(f"failed: {refs.problem}")
    if not report.ok:
        click.get_current_context().exit(1)


def _copy_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options push and pull share, and the state."""
    for option in reversed((
        click.option("-j", "--jobs", type=click.IntRange(1, 64), default=4, show_default=True, help=JOBS_HELP),
        click.option("--refs", "overwrite_refs", is_flag=True, help=REFS_HELP),
        click.option("--release", metavar="LABEL", help=RELEASE_HELP),
        pass_state,
    )):
        command = option(command)
    return command


@click.command("push", short_help="Copy entries (all, or matching NAME_GLOBs) to another cache.")
@click.argument("destination", metavar="DEST")
@click.argument("globs", nargs=-1, metavar="[NAME_GLOB]...", shell_complete=complete_entry_names)
@click.option(
    "--to-blobs", metavar="LOCATION",
    help="DEST's blob location, if not inside DEST: a folder or s3://, gs://, az://, file://.",
)
@_copy_options
def push_command(
    state: State, destination: str, globs: tuple[str, ...], to_blobs: str | None, jobs: int,
    overwrite_refs: bool, release: str | None,
) -> None:
    """Copy the intact entries of this cache (or those whose names match NAME_GLOBs)
    to the cache at DEST (a folder or a database URL, created if needed), with their
    blobs as stored, each verified against its digest.

    Idempotent and resumable: entries already there intact are skipped, entries there
    with missing or corrupt blobs are repaired, and a run that was interrupted
    completes on the next one. Each entry keeps its compile time. This cache's refs
    of the copied entries are written at DEST where DEST has none (--refs: overwrite
    DEST's), once every entry is stored. Exit status 1 if an entry could not be copied.
    """
    from aot.cache.admin.transfer import push

    report = push(state.cache(), destination, list(globs) or None, blob_location=to_blobs, jobs=jobs,
                  refs=overwrite_refs, release=release)
    _render(state, report, "pushed")


@click.command("pull", short_help="Copy entries (all, or matching NAME_GLOBs) from another cache.")
@click.argument("source", metavar="SOURCE")
@click.argument("globs", nargs=-1, metavar="[NAME_GLOB]...")
@click.option(
    "--from-blobs", metavar="LOCATION",
    help="SOURCE's blob location, if not inside SOURCE: a folder or s3://, gs://, az://, file://.",
)
@_copy_options
def pull_command(
    state: State, source: str, globs: tuple[str, ...], from_blobs: str | None, jobs: int,
    overwrite_refs: bool, release: str | None,
) -> None:
    """Copy the intact entries of the cache at SOURCE (a folder or a database URL,
    opened read-only), or those whose names match NAME_GLOBs, into this cache (created
    if needed), with their blobs as stored, each verified against its digest.

    Idempotent and resumable, as push; refs travel as with push. Exit status 1 if an
    entry could not be copied.
    """
    from aot.cache.admin.transfer import pull

    report = pull(state.cache(create=True), source, list(globs) or None, blob_location=from_blobs, jobs=jobs,
                  refs=overwrite_refs, release=release)
    _render(state, report, "pulled")

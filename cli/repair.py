"""``aot repair``: a new index for a folder cache whose index is damaged."""

from __future__ import annotations

import click

from aot.cli.common import State, echo_json, pass_state


@click.command("repair", short_help="Rebuild a damaged folder cache index; the damaged file is kept aside.")
@click.option("--dry-run", is_flag=True, help="Only print the plan.")
@click.option(
    "--force", is_flag=True,
    help="Repair even though an index.sqlite-shm says a process may have the index open (a crashed writer's).",
)
@pass_state
def repair_command(state: State, dry_run: bool, force: bool) -> None:
    """Rebuild the SQLite index of a folder cache that SQLite calls corrupt or that was
    truncated: every row it can still read (entries whose blobs are stored, refs,
    releases, history, statistics) goes into a new index, and the damaged file is
    moved aside as index.sqlite.damaged-<UTC time>, never deleted.

    Entries whose rows cannot be read are rebuilt from the blob store, where each
    entry's manifest is a blob too: a manifest whose blobs are all stored and intact
    (and whose signature verifies, with a signing key configured) becomes a row again.

    Prints the plan first: what is recovered, what is rebuilt from the blob store, and
    what is not (unreadable rows, by key and name where an index of the file names
    them; blobs no recovered entry references). --dry-run stops after the plan. Stop
    the processes that use the cache first.
    """
    from aot.cache.admin.repair import describe, plan_repair, repair_index
    from aot.cache.storage.locations import classify_location

    location = state.settings.cache.value
    assert location is not None
    if classify_location(location).scheme is not None:
        raise click.ClickException(
            f"aot repair rebuilds a folder cache's SQLite index; {location} is a database: "
            "restore it with the database's own tools"
        )
    # With a signing key configured, a manifest in the blob store becomes a row again
    # only if its signature verifies with it (as a load would require).
    plan = plan_repair(location, signing_key=state.settings.signing_key())
    if not dry_run:
        plan = repair_index(plan, force=force)
    if state.json:
        echo_json(plan.to_dict())
    else:
        click.echo(describe(plan))

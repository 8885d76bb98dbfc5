"""``aot verify`` and ``aot gc``."""

from __future__ import annotations

from typing import Any

import click

from aot.cli.common import State, echo_json, human_size, json_option, pass_state, shorten_middle


@click.command("verify", short_help="Check integrity (and manifest coverage).")
@click.option(
    "--manifest", metavar="MANIFEST.toml",
    help="Also check that every entry the manifest lists is stored for this environment.",
)
@click.option("--strict", is_flag=True, help="With --manifest: exit 1 when any entry is missing.")
@json_option
@pass_state
def verify_command(state: State, manifest: str | None, strict: bool, as_json: bool) -> None:
    """Check the cache: re-hash every blob, parse every manifest.

    Bad entries are quarantined (unless --read-only); exit status 1 on any problem
    with an entry (blobs that no entry references are reported; `aot gc` removes them).
    With --manifest --strict this is the CI coverage check: it also fails when an
    entry of the manifest is missing for this environment.
    """
    from aot.cache.warmup import coverage, expand, load_manifest

    if strict and manifest is None:
        raise click.UsageError("--strict needs --manifest")
    items = expand(load_manifest(manifest)) if manifest is not None else None  # fail early
    cache = state.cache()
    report = cache.verify()
    missing = coverage(cache, items) if items is not None else None
    # Unreferenced blobs are garbage, not damage (a writer may be between its blob and
    # its index row): reported, but only problems with entries fail the check.
    failed = bool(report.problems) or bool(report.cache_problems) or (strict and bool(missing))
    if as_json:
        echo_json({
            "ok": not failed,
            "integrity": report.to_dict(),
            "coverage": None if items is None else {
                "manifest": manifest,
                "strict": strict,
                "items": len(items),
                "missing": [item.to_dict() for item in missing or ()],
            },
        })
    else:
        status = "PROBLEMS" if report.problems or report.cache_problems else "ok"
        click.echo(
            f"verified {report.checked_entries} entries and {report.checked_blobs} blobs "
            f"in {cache.display_location}: {status}"
        )
        for what in report.cache_problems:
            click.echo(f"problem: {what}")
        for problem in report.problems:
            click.echo(f"problem: {problem.name} ({problem.key[:12]}): {problem.what}")
        if report.quarantined:
            click.echo(f"quarantined {len(report.quarantined)} entries (`aot gc` removes them)")
        if report.orphan_blobs:
            click.echo(
                f"{len(report.orphan_blobs)} blobs no entry references (`aot gc` removes "
                "them once they are old enough)"
            )
        if items is not None:
            if not missing:
                click.echo(f"{manifest}: all {len(items)} entries are stored for this environment")
            else:
                note = "" if strict else " (not a failure without --strict)"
                click.echo(
                    f"{manifest}: {len(missing)} of {len(items)} entries missing for this "
                    f"environment{note}:"
                )
                for item in missing:
                    where = f" ({item.source})" if item.source else ""
                    click.echo(f"  {item.label}{where}: {item.describe_args()}")
    if failed:
        click.get_current_context().exit(1)


def _size_option(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    from aot.cache.maintenance import parse_size
    from aot.errors import AotError

    try:
        return parse_size(value)
    except AotError as exc:
        raise click.BadParameter(str(exc)) from None


def _age_option(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    from aot.cache.maintenance import parse_age
    from aot.errors import AotError

    try:
        parse_age(value)
    except AotError as exc:
        raise click.BadParameter(str(exc)) from None
    return value  # the plan quotes it as given


@click.command("gc", short_help="Remove stale entries and unreferenced blobs.")
@click.option("--max-size", callback=_size_option, metavar="SIZE", help="Evict least recently used entries until the cache fits, e.g. 10G.")
@click.option("--older-than", callback=_age_option, metavar="AGE", help="Remove entries unused for longer than this, e.g. 30d, 12h, 2w.")
@click.option("--dry-run", is_flag=True, help="Only print the plan.")
@click.option("--force", is_flag=True, help="Delete blobs even when the index is empty (it refuses otherwise).")
@json_option
@pass_state
def gc_command(
    state: State, max_size: int | None, older_than: str | None, dry_run: bool, force: bool, as_json: bool
) -> None:
    """Remove quarantined, stale and least recently used entries, and unreferenced blobs.

    Prints the plan (what goes and the bytes it frees), then carries it out unless
    --dry-run. An empty index beside stored blobs (a lost or truncated index) makes gc
    refuse to delete blobs unless --force.
    """
    plan = state.cache().gc(max_size=max_size, older_than=older_than, dry_run=dry_run, force=force)
    if as_json:
        echo_json(plan.to_dict())
        return
    for warning in plan.warnings:
        click.echo(f"warning: {warning}")
    if not plan.entries and not plan.blobs:
        click.echo(f"nothing to collect (cache {human_size(plan.size_before)})")
        return
    verb = "would remove" if plan.dry_run else "removed"
    click.echo(
        f"{verb} {len(plan.entries)} entries and {len(plan.blobs)} blobs, freeing "
        f"{human_size(plan.bytes_freed)} (cache {human_size(plan.size_before)} -> "
        f"{human_size(plan.size_after)})" + (" [dry run]" if plan.dry_run else "")
    )
    for victim in plan.entries:
        click.echo(
            f"  {victim.key[:12]}  {victim.name} ({shorten_middle(victim.signature, 50)})  "
            f"{human_size(victim.stored_size)}  {victim.reason}"
        )

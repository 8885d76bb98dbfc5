"""``aot warmup``: compile everything a manifest lists (the CI step)."""

from __future__ import annotations

import sys

import click

from aot.cli.common import State, echo_json, json_option, pass_state


def _stdout_is_tty() -> bool:
    return sys.stdout.isatty()


def _line(result) -> str:  # type: ignore[no-untyped-def]
    status = {"compiled": "compiled", "hit": "hit", "failed": "FAILED"}[result.status]
    if result.status == "failed":
        return f"{status:<9} {result.label}: {result.error}"
    return f"{status:<9} {result.label} ({result.signature}) {result.seconds:.2f}s"


def _parse_shard(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    from aot.cache.warmup_shard import parse_shard

    try:
        return parse_shard(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("warmup", short_help="Compile everything a manifest lists (CI).")
@click.argument("manifest", metavar="MANIFEST.toml")
@click.option(
    "-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
    help="Compile in this many worker processes.",
)
@click.option(
    "--shard", metavar="I/N", callback=_parse_shard, default=None,
    help="Compile only share I of N (1 <= I <= N), balanced by estimated compile time: "
    "one CI runner's part of the manifest.",
)
@json_option
@pass_state
def warmup_command(
    state: State, manifest: str, jobs: int, shard: tuple[int, int] | None, as_json: bool
) -> None:
    """Compile every (function x bucket) listed in MANIFEST.toml into the cache.

    Entries already in the cache cost no compile. Every entry is tried; the exit
    status is 1 if any failed. The manifest format is in docs/cli.md.
    """
    from aot.cache.warmup import expand, load_manifest, run_warmup

    items = expand(load_manifest(manifest))
    cache = state.cache(create=True)
    if as_json:
        report = run_warmup(cache, items, jobs=jobs, shard=shard)
    elif _stdout_is_tty():
        if shard is not None:
            from aot.cache.warmup_shard import select_shard

            length = len(select_shard(items, shard, cache))
        else:
            length = len(items)
        with click.progressbar(
            length=length, label=f"warmup ({jobs} job{'s' if jobs > 1 else ''})",
            item_show_func=lambda r: r.label if r is not None else None,
        ) as bar:
            report = run_warmup(cache, items, jobs=jobs, shard=shard,
                                on_result=lambda r: bar.update(1, r))
    else:
        report = run_warmup(cache, items, jobs=jobs, shard=shard,
                            on_result=lambda r: click.echo(_line(r)))
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(report.summary())
        for failure in report.failures:
            where = f" ({failure.source})" if failure.source else ""
            click.echo(f"failed: {failure.label}{where}: {failure.error}", err=True)
    if not report.ok:
        click.get_current_context().exit(1)

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


@click.command("warmup", short_help="Compile everything a manifest lists (CI).")
@click.argument("manifest", metavar="MANIFEST.toml")
@click.option(
    "-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
    help="Compile in this many worker processes.",
)
@json_option
@pass_state
def warmup_command(state: State, manifest: str, jobs: int, as_json: bool) -> None:
    """Compile every (function x bucket) listed in MANIFEST.toml into the cache.

    Entries already in the cache cost no compile. Every entry is tried; the exit
    status is 1 if any failed. The manifest format is in docs/cli.md.
    """
    from aot.cache.warmup import expand, load_manifest, run_warmup

    items = expand(load_manifest(manifest))
    cache = state.cache(create=True)
    if as_json:
        report = run_warmup(cache, items, jobs=jobs)
    elif _stdout_is_tty():
        with click.progressbar(
            length=len(items), label=f"warmup ({jobs} job{'s' if jobs > 1 else ''})",
            item_show_func=lambda r: r.label if r is not None else None,
        ) as bar:
            report = run_warmup(cache, items, jobs=jobs, on_result=lambda r: bar.update(1, r))
    else:
        report = run_warmup(cache, items, jobs=jobs, on_result=lambda r: click.echo(_line(r)))
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(report.summary())
        for failure in report.failures:
            where = f" ({failure.source})" if failure.source else ""
            click.echo(f"failed: {failure.label}{where}: {failure.error}", err=True)
    if not report.ok:
        click.get_current_context().exit(1)

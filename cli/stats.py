"""``aot stats``: calls, loads, misses, recompiles and compile time saved."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from aot.cache.units import counted
from aot.cli.common import State, echo_json, pass_state, table, unknown_environment_note
from aot.cli.listing import env_option
from aot.cli.params import complete_entry_names

if TYPE_CHECKING:
    from aot.cache.stats_report import SignatureStats, StatsReport

SIGNATURE_WIDTH = 60


def _seconds(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}s"
    return f"{value:.2f}s" if value >= 0.01 or value == 0 else f"{value * 1000:.1f}ms"


def _env(row: SignatureStats, known: bool = True) -> str:
    return "this" if row.this_environment else row.env_fp[:12] if known else "unknown"


@click.command("stats", short_help="Calls, loads, misses, recompiles and compile time saved.")
@click.argument("glob", required=False, metavar="[NAME_GLOB]", shell_complete=complete_entry_names)
@env_option
@click.option(
    "--zero", is_flag=True,
    help="Reset the statistics (matching NAME_GLOB and --env); entries' HITS and last-used times stay.",
)
@click.option(
    "--prometheus", is_flag=True,
    help="Print the totals in Prometheus's text exposition format (for node_exporter's textfile "
    "collector or a Pushgateway; needs the metrics extra).",
)
@pass_state
def stats_command(state: State, glob: str | None, env: str, zero: bool, prometheus: bool) -> None:
    """Serving statistics per name and signature, like `sccache --show-stats`: calls
    served, executables loaded and the time that took, the compile time that loading
    instead of compiling saved (the stored compile time of each load), misses (calls
    whose signature has no stored executable, with that signature) and recompiles
    from portable HLO with their reason.

    Entries of JAX's persistent compilation cache (aot.jax_cache) are counted per
    jitted function: hits, misses, and the compile time the hits saved (each entry's
    compile time as measured when it was stored).

    Kept in the cache's index per environment (ENV: 'this', or the environment's
    digest), written in batches by the serving processes; a read-only cache keeps them
    in the serving process's memory unless it has a local tier (--local).
    """
    from aot.cache.reports.stats import read_stats, zero_stats

    cache = state.cache()
    if zero:
        count = zero_stats(cache, glob, env=env)
        if state.json:
            echo_json({"zeroed": count})
        else:
            click.echo(f"zeroed the statistics of {counted(count, 'signature')}")
        return
    report = read_stats(cache, glob, env=env, arguments=not (state.json or prometheus))
    if prometheus:
        from aot.cache.reports.stats import release_memberships
        from aot.cache.serving.metrics import index_exposition
        from aot.errors import MetricsError

        try:
            click.echo(index_exposition(report, release_memberships(cache, report.rows)), nl=False)
        except MetricsError as exc:
            raise click.ClickException(str(exc)) from exc
        return
    if state.json:  # JSON: flat signatures only
        echo_json(report.to_dict())
        return
    _render(report, glob, cache.read_only and cache.local is None)


def _render(report: StatsReport, glob: str | None, read_only: bool) -> None:
    served = [r for r in report.rows if r.calls or r.loads or r.recompiles]
    if report.jit:
        click.echo("JAX persistent cache (aot.jax_cache), per jitted function:")
        click.echo(table(
            ("FUNCTION", "HITS", "MISSES", "SAVED"),
            [[j.name, j.hits, j.misses, _seconds(j.saved_seconds)] for j in report.jit], right=(1, 2, 3),
        ))
        if report.jit_hint:
            click.echo(report.jit_hint)
        if not report.rows:
            return
    if not report.rows:
        what = f" for {glob!r}" if glob else ""
        click.echo(f"no statistics{what} in {report.location}")
        if read_only:
            click.echo(
                "(a process serving a read-only cache keeps its statistics in memory; "
                "give it a local tier (--local, AOT_LOCAL) to keep them there)"
            )
        return
    if served:
        headers = ("NAME", "SIGNATURE", "TARGET", "ENV", "CALLS", "LOADS", "LOAD TIME", "SAVED", "RECOMPILES")
        rows = [
            [r.name, report.describe(r, SIGNATURE_WIDTH), report.target(r) or "-", _env(r, report.environment_known),
             r.calls, r.loads, _seconds(r.load_seconds), _seconds(r.saved_seconds), r.recompiles]
            for r in served
        ]
        click.echo(table(headers, rows, right=(4, 5, 6, 7, 8)))
    if report.misses:
        click.echo("misses (calls with no stored executable for their signature):")
        for r in report.misses:
            click.echo(
                f"  {r.name} ({report.describe(r, SIGNATURE_WIDTH)})  {r.misses}  "
                f"last: {r.miss_reason or '-'}"
                + ("" if r.this_environment else f"  env {_env(r, report.environment_known)}")
            )
    if report.recompiled:
        click.echo("recompiles from portable HLO:")
        for r in report.recompiled:
            click.echo(
                f"  {r.name} ({report.describe(r, SIGNATURE_WIDTH)})  {r.recompiles} in "
                f"{_seconds(r.recompile_seconds)}  last: {r.recompile_reason or '-'}"
            )
    t = report.totals
    click.echo(
        f"{counted(t['calls'], 'call')} on {counted(t['signatures'], 'signature')}; {counted(t['loads'], 'load')} in "
        f"{_seconds(t['load_seconds'])}, saving {_seconds(t['saved_seconds'])} of compiling; "
        f"{counted(t['misses'], 'miss')}; {counted(t['recompiles'], 'recompile')} ({report.location})"
    )
    unknown_environment_note(report.environment_known)

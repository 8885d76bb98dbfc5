"""``aot ls`` and ``aot show``."""

from __future__ import annotations

import click

from aot.cli.common import (
    State,
    echo_json,
    human_size,
    json_option,
    key_value,
    pass_state,
    shorten,
    shorten_middle,
    table,
    when,
)

SIGNATURE_WIDTH = 60
PART_WIDTH = 100


@click.command("ls", short_help="List entries.")
@click.argument("glob", required=False, metavar="[NAME_GLOB]")
@json_option
@pass_state
def ls_command(state: State, glob: str | None, as_json: bool) -> None:
    """List the cache's entries (all, or those whose name matches NAME_GLOB)."""
    cache = state.cache()
    entries = cache.entries(glob)
    if as_json:
        rows = []
        for entry in entries:
            data = entry.to_dict()
            data.pop("manifest", None)
            rows.append(data)
        echo_json({"cache": cache.display_location, "count": len(rows), "entries": rows})
        return
    if not entries:
        what = f" matching {glob!r}" if glob else ""
        click.echo(f"no entries{what} in the cache at {cache.display_location}")
        return
    rows = [
        (
            e.key[:12], e.name, shorten_middle(e.signature, SIGNATURE_WIDTH), e.platform,
            human_size(e.stored_size), when(e.created_at), when(e.last_used_at), e.hits, e.state,
        )
        for e in entries
    ]
    click.echo(table(
        ("KEY", "NAME", "SIGNATURE", "PLATFORM", "SIZE", "COMPILED", "LAST USED", "HITS", "STATE"),
        rows, right=(4, 7),
    ))
    total = sum(e.stored_size for e in entries)
    click.echo(f"{len(entries)} entries, {human_size(total)} stored")


def _parts(title: str, fingerprint) -> str:  # type: ignore[no-untyped-def]
    lines = [f"{title} {fingerprint.digest}"]
    lines.append(key_value([(k, shorten(v, PART_WIDTH)) for k, v in sorted(fingerprint.as_dict().items())]))
    return "\n".join(lines)


def _numbers(title: str, values) -> str:  # type: ignore[no-untyped-def]
    if not values:
        return f"{title}: not recorded"
    pairs = []
    for k, v in sorted(values.items()):
        text = f"{v:g}" if isinstance(v, float) else str(v)
        if k.endswith("_in_bytes") and isinstance(v, int):
            text += f" ({human_size(v)})"
        pairs.append((k, text))
    return f"{title}\n{key_value(pairs)}"


def _symbolic_summary(manifest) -> str:  # type: ignore[no-untyped-def]
    from aot.symbolic import patterns_of, variables_of

    names = ", ".join(variables_of(patterns_of(manifest.args)))
    constraints = "; ".join(manifest.symbolic_constraints) or "no constraints"
    return (
        f"symbolic in {names} ({constraints}); no executable: aot.load compiles one "
        "per concrete shape"
    )


def _render(details) -> str:  # type: ignore[no-untyped-def]
    e = details.entry
    m = details.manifest
    out = [f"{e.name} ({e.signature})"]
    pairs = [
        ("key", e.key),
        ("state", e.state + (f": {e.state_reason}" if e.state_reason else "")),
        ("platform", e.platform),
        ("size", f"{human_size(e.raw_size)} ({human_size(e.stored_size)} stored)"),
        ("compiled", f"{when(e.created_at)} UTC in {e.compile_seconds:.3f}s"),
        ("last used", f"{when(e.last_used_at)} UTC ({e.hits} hits)"),
    ]
    if m is not None:
        pairs += [
            ("kind", m.kind),
            ("devices", ", ".join(map(str, m.device_ids))),
            ("jax", f"{m.jax_version} (jaxlib {m.jaxlib_version}), format v{m.format_version}"),
            ("signed", "yes" if m.hmac else "no"),
        ]
        if m.is_symbolic:
            pairs.append(("shapes", _symbolic_summary(m)))
    if details.this_environment:
        pairs.append(("environment", "this one"))
    elif m is not None:
        diffs = "; ".join(d.describe() for d in details.environment_differences)
        pairs.append(("environment", f"another one: {diffs}"))
    out.append(key_value(pairs))
    if m is None:
        out.append(f"manifest: unreadable: {details.manifest_error}")
        return "\n".join(out)
    out.append(_parts("program fingerprint", m.program))
    out.append(_parts("environment fingerprint", m.environment))
    out.append(_numbers("cost analysis", m.cost_analysis))
    out.append(_numbers("memory analysis", m.memory_analysis))
    return "\n".join(out)


@click.command("show", short_help="Show an entry: manifest, fingerprints, analysis, HLO.")
@click.argument("key_or_name", metavar="KEY|NAME")
@click.option("--hlo", is_flag=True, help="Print the StableHLO text of the portable HLO instead.")
@click.option("--debug-info", is_flag=True, help="With --hlo: keep the source locations.")
@json_option
@pass_state
def show_command(state: State, key_or_name: str, hlo: bool, debug_info: bool, as_json: bool) -> None:
    """Show an entry (a key or a unique key prefix) or every entry of a NAME.

    Prints the manifest, the program and environment fingerprint parts, and XLA's
    cost and memory analysis; --hlo prints the stored StableHLO.
    """
    from aot.cache.details import describe_entries

    details = describe_entries(state.cache(), key_or_name, hlo=hlo, debug_info=debug_info)
    if as_json:
        echo_json({"entries": [d.to_dict() for d in details]})
    elif hlo:
        for d in details:
            if len(details) > 1:
                click.echo(f"// {d.entry.name} ({d.entry.signature}) key {d.entry.key}")
            click.echo(d.hlo.rstrip("\n") if d.hlo else "")
    else:
        click.echo("\n\n".join(_render(d) for d in details))

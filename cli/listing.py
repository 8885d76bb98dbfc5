"""``aot ls`` and ``aot show``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from aot.cache.units import counted
from aot.cli.common import (
    F,
    State,
    echo_json,
    human_size,
    key_value,
    pass_state,
    resolve_served_release,
    served_release_option,
    shorten,
    table,
    terminal_width,
    unknown_environment_note,
    when,
)
from aot.cli.params import complete_entry_names

if TYPE_CHECKING:
    from aot.artifact import Manifest
    from aot.cache.cache import Cache
    from aot.cache.reports.details import EntryDetails
    from aot.fingerprint import Fingerprint

PART_WIDTH = 100
# Narrowest signature column, however narrow the terminal.
MIN_SIGNATURE_WIDTH = 24
# Piped output (no terminal, no COLUMNS) folds signatures to this width, as `aot warmup`
# and `aot stats` do (`params: {41 arrays}`): a row is read by people and grep, and a
# 41-array pytree in full made it thousands of characters wide. --json keeps every leaf.
PIPED_SIGNATURE_WIDTH = 72

ENV_OPTION_HELP = (
    "'this': only entries built for this environment; 'all': every entry, "
    "with the ENV column naming what differs."
)


def env_option(fn: F) -> F:
    return click.option(
        "--env", type=click.Choice(["this", "all"]), default="all", show_default=True,
        help=ENV_OPTION_HELP,
    )(fn)


@click.command("ls", short_help="List entries.")
@click.argument("glob", required=False, metavar="[NAME_GLOB]", shell_complete=complete_entry_names)
@env_option
@served_release_option
@pass_state
def ls_command(state: State, glob: str | None, env: str, release: str | None) -> None:
    """List the cache's entries (all, or those whose name matches NAME_GLOB).

    SIGNATURE names each argument (params: [{b: f32[512], w: f32[784,512]}, ...],
    x: f32[8,784]), folded to fit the terminal; ENV is 'this' or the first part of the
    environment that differs (device_count 8: the stored value); JAX, shown when the
    entries listed were compiled by more than one JAX release, names each one's (0.9.2);
    TARGET names what the
    entry is for: a device target (tpu:v5e:2x2), else the platform and device count
    (cpu x8); STATE is ok,
    superseded (another entry is served for the same name, signature and environment;
    `aot gc --superseded` removes it) or quarantined. SERVED is 'ref' for the entry
    aot.load serves because its ref names it, 'newest' where no ref exists (the legacy
    rule: the newest intact entry), '-' otherwise, followed by the release labels
    naming the entry ([prod,canary]). With a release (--release, else AOT_RELEASE,
    else the cache's default, as aot.load chooses), SERVED is 'release' for the members
    of that label, which a replica of it serves, and '-' for every other entry. When the cache holds entries of JAX's persistent
    compilation cache (aot.jax_cache), a KIND column says 'aot' or 'jit'; a jit row's
    NAME is the jitted function's, its KEY the start of JAX's hash, its ENV the platform.
    """
    from aot.cache.reports.listing import list_entries
    from aot.cache.rows import jax_release

    cache = state.cache()
    listing = list_entries(cache, glob, env=env, release=resolve_served_release(cache, release))
    if state.json:
        echo_json(listing.to_dict())
        return
    if not listing.rows and not listing.jit:
        what = f" matching {glob!r}" if glob else ""
        where = " for this environment" if env == "this" else ""
        click.echo(f"no entries{what}{where} in the cache at {listing.location}")
        unknown_environment_note(listing.environment_known)
        return
    headers: tuple[str, ...] = ("KEY", "NAME", "SIGNATURE", "ENV", "TARGET", "SIZE", "COMPILED", "LAST USED", "HITS", "STATE", "SERVED")
    rows = [
        [
            r.entry.key[:12], r.entry.name, "", r.environment.short(),
            (r.environment.target or "-") + (f" {r.autotune}" if r.autotune else ""),
            human_size(r.entry.stored_size),
            when(r.entry.created_at), when(r.entry.last_used_at), r.entry.hits, r.status,
            (r.served_by or "-") + (f" [{','.join(r.releases)}]" if r.releases else ""),
        ]
        for r in listing.rows
    ]
    width = terminal_width()
    signature_width = PIPED_SIGNATURE_WIDTH
    if width is not None:
        others = sum(
            max(len(str(headers[i])), *(len(str(row[i])) for row in rows)) + 2
            for i in range(len(headers)) if i != 2
        )
        signature_width = max(MIN_SIGNATURE_WIDTH, width - others - 2)
    for row, r in zip(rows, listing.rows):
        row[2] = r.signature.compact(signature_width)
    right = (5, 8)
    releases = [jax_release(r.environment.jax, r.environment.jaxlib) for r in listing.rows]
    if len(set(releases)) > 1:  # entries of several JAX releases: which is which
        headers = (*headers[:4], "JAX", *headers[4:])
        rows = [[*row[:4], release, *row[4:]] for row, release in zip(rows, releases)]
        right = (6, 9)
    if listing.jit:  # KIND: jit beside aot
        rows = [["aot", *row] for row in rows] + [
            [
                "jit", e.key.rpartition("-")[2][:12], e.name, "-", *(["-"] if "JAX" in headers else []),
                e.platform, "-", human_size(e.stored_size),
                when(e.created_at), when(e.last_used_at), e.hits, "ok", "-",
            ]
            for e in listing.jit
        ]
        headers = ("KIND", *headers)
        right = (right[0] + 1, right[1] + 1)
    click.echo(table(headers, rows, right=right))
    footer = f"{counted(len(listing.rows) + len(listing.jit), 'entry')}, {human_size(listing.stored_size)} stored"
    if listing.other_environments:
        footer += f"; {listing.other_environments} for other environments (--env this hides them)"
    if listing.unknown_environments:
        footer += f"; {listing.unknown_environments} for an unknown environment"
    if listing.superseded:
        footer += f"; {listing.superseded} superseded (aot gc --superseded removes them)"
    if listing.release is not None:
        footer += f"; SERVED: as a replica of release {listing.release} serves"
    click.echo(footer)
    unknown_environment_note(listing.environment_known)


def _parts(title: str, fingerprint: Fingerprint) -> str:
    lines = [f"{title} {fingerprint.digest}"]
    # One line each: libtpu's platform version has several (--json has it as it is).
    lines.append(key_value([
        (k, shorten("; ".join(v.splitlines()) if "\n" in v else v, PART_WIDTH))
        for k, v in sorted(fingerprint.as_dict().items())
    ]))
    return "\n".join(lines)


def _numbers(title: str, values: Mapping[str, Any] | None) -> str:
    if not values:
        return f"{title}: not recorded"
    pairs = []
    for k, v in sorted(values.items()):
        text = f"{v:g}" if isinstance(v, float) else str(v)
        if k.endswith("_in_bytes") and isinstance(v, int):
            text += f" ({human_size(v)})"
        pairs.append((k, text))
    return f"{title}\n{key_value(pairs)}"


def _symbolic_summary(manifest: Manifest) -> str:
    from aot.symbolic import patterns_of, variables_of

    names = ", ".join(variables_of(patterns_of(manifest.args)))
    constraints = "; ".join(manifest.symbolic_constraints) or "no constraints"
    return (
        f"symbolic in {names} ({constraints}); no executable: aot.load compiles one "
        "per concrete shape"
    )


def _render(details: EntryDetails) -> str:
    e = details.entry
    m = details.manifest
    arguments = details.arguments
    # The arguments section below lists every leaf: the header folds them (one line).
    out = [f"{e.name} ({arguments.compact(PIPED_SIGNATURE_WIDTH if arguments.has_paths else None)})"]
    state = e.state + (f": {e.state_reason}" if e.state_reason else "")
    if details.served_by == "release":
        state += f"; served by release {details.release} (its set names it)"
    elif details.release is not None and e.ok:
        state += f"; not served by release {details.release} (its set names another entry or none here)"
    elif details.superseded_by:
        state = (
            f"superseded by {details.superseded_by[:12]} (the entry served for this name, "
            "signature and environment; aot gc --superseded removes this one)"
        )
    elif details.served_by == "ref":
        state += "; served (its ref names it)"
    elif details.served_by == "newest":
        state += "; served (no ref: the newest entry of its signature)"
    if details.releases:
        state += f"; in release {', '.join(details.releases)}"
    pairs = [
        ("key", e.key),
        ("state", state),
        ("platform", e.platform),
        ("target", details.target or "unknown (unreadable manifest)"),
        *([("autotune", _autotune_text(m.autotune))] if m is not None and m.autotune else []),
        ("size", f"{human_size(e.raw_size)} ({human_size(e.stored_size)} stored)"),
        ("compiled", f"{when(e.created_at)} UTC in {e.compile_seconds:.3f}s"),
        ("last used", f"{when(e.last_used_at)} UTC ({counted(e.hits, 'hit')})"),
    ]
    if m is not None:
        pairs += [
            # `ls`'s KIND vocabulary: an aot entry (not `jit`, an entry of JAX's own cache);
            # the manifest's kind ("jit"/"pmap") is the program's: a mesh or a pmap one.
            ("kind", f"aot ({'pmap' if m.kind == 'pmap' else 'mesh'} program)"),
            ("devices", ", ".join(map(str, m.device_ids))),
            ("jax", f"{m.jax_version} (jaxlib {m.jaxlib_version}), format v{m.format_version}"),
            ("signed", "yes" if m.hmac else "no"),
        ]
        if m.is_symbolic:
            pairs.append(("shapes", _symbolic_summary(m)))
    if details.this_environment:
        pairs.append(("environment", "this one"))
    elif m is not None and not details.environment_known:
        pairs.append(("environment", "unknown: this host's environment is not recorded yet"))
    elif m is not None:
        diffs = "; ".join(d.describe() for d in details.environment_differences)
        pairs.append(("environment", f"another one: {diffs}"))
    out.append(key_value(pairs))
    if arguments.has_paths:
        out.append("arguments")
        out.append(key_value(
            [(leaf.path, leaf.aval) for leaf in arguments.leaves]
            + [(f"{label} (static)", value) for label, _, value in (s.partition("=") for s in arguments.statics)]
        ))
    if m is None:
        out.append(f"manifest: unreadable: {details.manifest_error}")
        return "\n".join(out)
    out.append(_parts("program fingerprint", m.program))
    out.append(_parts("environment fingerprint", m.environment))
    out.append(_numbers("cost analysis", m.cost_analysis))
    out.append(_numbers("memory analysis", m.memory_analysis))
    return "\n".join(out)


def _show_jit(state: State, cache: Cache, key_or_name: str, hlo: bool) -> bool:
    """Shows the KIND jit entries of ``key_or_name``; False when there is none."""
    from aot.cache.admin.jit_entries import describe_jit_entries

    found = describe_jit_entries(cache, key_or_name)
    if not found:
        return False
    if hlo:
        raise click.UsageError("a jit entry (JAX's cache) stores no portable HLO: --hlo does not apply")
    if state.json:
        echo_json({"entries": [d.to_dict() for d in found]})
        return True
    blocks = []
    for d in found:
        e = d.entry
        blocks.append("\n".join([
            f"{e.name}  (KIND jit: an entry of JAX's persistent cache)",
            f"  key             {e.key}",
            f"  blob            {e.digest}",
            f"  size            {human_size(e.size)} ({human_size(e.stored_size)} stored)",
            f"  compile time    {e.compile_seconds:.2f}s",
            f"  hits            {e.hits}",
            f"  platform        {e.platform}",
            f"  created         {e.created_at:%Y-%m-%d %H:%M:%S} UTC",
            f"  last used       {e.last_used_at:%Y-%m-%d %H:%M:%S} UTC",
            f"  hmac            {d.hmac}",
        ]))
    click.echo("\n\n".join(blocks))
    return True


@click.command("show", short_help="Show an entry: arguments, fingerprints, analysis, HLO.")
@click.argument("key_or_name", metavar="KEY|NAME", shell_complete=complete_entry_names)
@click.option("--hlo", is_flag=True, help="Print the StableHLO text of the portable HLO instead.")
@click.option("--debug-info", is_flag=True, help="With --hlo: keep the source locations.")
@served_release_option
@pass_state
def show_command(state: State, key_or_name: str, hlo: bool, debug_info: bool, release: str | None) -> None:
    """Show an entry (a key, or a unique key prefix of 4+ hex digits) or every entry
    of a NAME.

    Prints the arguments by pytree path, the manifest, the program and environment
    fingerprint parts, and XLA's cost and memory analysis; --hlo prints the stored
    StableHLO. Whether an entry is served is said for the release a replica would
    serve (--release, else AOT_RELEASE, else the cache's default; none: the refs).
    """
    from aot.cache.reports.details import describe_entries
    from aot.errors import ArtifactNotFoundError

    cache = state.cache()
    try:
        details = describe_entries(
            cache, key_or_name, hlo=hlo, debug_info=debug_info, release=resolve_served_release(cache, release),
        )
    except ArtifactNotFoundError:
        if not _show_jit(state, cache, key_or_name, hlo):  # JAX's key or a jitted function's name
            raise
        return
    if state.json:
        echo_json({"entries": [d.to_dict() for d in details]})
    elif hlo:
        for d in details:
            if len(details) > 1:
                click.echo(f"// {d.entry.name} ({d.entry.signature}) key {d.entry.key}")
            click.echo(d.hlo.rstrip("\n") if d.hlo else "")
    else:
        click.echo("\n\n".join(_render(d) for d in details))
        unknown_environment_note(all(d.environment_known for d in details))


def _autotune_text(value: str) -> str:
    state, _, digest = value.partition(" ")
    return {
        "tuned": f"tuned (the GPU's captured autotune results, {digest[7:19]})",
        "defaults": "defaults (XLA's default configs: no autotune results covered its fusions)",
        "measured": "measured (compiled on the GPU, which autotuned it)",
    }.get(state, value)

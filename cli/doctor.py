"""``aot doctor``: is this host ready to compile into / serve from the cache?"""

from __future__ import annotations

import click

from aot.cache.units import counted
from aot.cli.common import State, echo_json, human_size, key_value, pass_state

_SETTING_LABELS = {
    "cache": "cache",
    "blobs": "blobs",
    "local": "local tier",
    "signing_key_file": "signing key",
    "manifest": "manifest",
}


@click.command("doctor", short_help="Versions, devices, settings, cache location and health.")
@click.option("--no-verify", is_flag=True, help="Skip re-hashing the blobs (faster on a big cache).")
@pass_state
def doctor_command(state: State, no_verify: bool) -> None:
    """Versions, devices, the environment fingerprint, the settings and where each came
    from (flag, environment, [tool.aot] in pyproject.toml, default), cache location,
    schema and health.

    Opens the cache read-only and changes nothing. Exit status 1 if the cache cannot
    be opened or has problems.
    """
    from aot.cache.reports.doctor import diagnose, is_gpu_compiler_key

    d = diagnose(check=not no_verify, settings=state.settings)
    if state.json:
        echo_json(d.to_dict())
    else:
        gpu = {k: v for k, v in d.versions.items() if is_gpu_compiler_key(k)}
        click.echo("versions")
        click.echo(key_value(sorted((k, v) for k, v in d.versions.items() if k not in gpu)))
        click.echo("gpu compiler")  # JAX's CUDA plugin, ptxas, and whether a cuda: target compiles here
        click.echo(key_value(sorted(gpu.items())))
        dev = d.devices
        click.echo("devices")
        if "error" in dev:
            click.echo(key_value([("error", dev["error"])]))
        else:
            click.echo(key_value([
                ("platform", f"{dev['platform']} ({dev['device_kind']})"),
                ("devices", f"{dev['count']} ({dev['local_count']} local)"),
                ("process", f"{dev['process_index']} of {dev['process_count']}"),
            ]))
        parts = d.environment["parts"]
        if d.environment["digest"] is None:
            click.echo(f"environment unknown: {d.environment.get('unknown', '')}")
        else:
            click.echo(f"environment {d.environment['digest'][:16]}" + ("" if "error" not in dev else " (recorded)"))
        shown = [(k, v if len(v) <= 80 else v[:77] + "...") for k, v in sorted(parts.items())]
        outside = d.environment.get("outside_key", {}).get("xla_flags")
        if outside:
            shown.append(("xla_flags outside the key", outside))
        click.echo(key_value(shown))
        settings = state.settings
        click.echo("settings" + (f" (config: {settings.config_file})" if settings.config_file else " (no [tool.aot] found)"))
        click.echo(key_value([
            (_SETTING_LABELS[s.name], f"{s.shown()}  ({s.source})") for s in settings.all()
        ]))
        click.echo("timeouts (seconds; blob_retries: attempts)")
        click.echo(key_value([(s.name, f"{s.shown()}  ({s.source})") for s in settings.bounds]))
        click.echo("cache")
        pairs = [("location", d.location)]
        if d.index is not None:
            pairs.append(("index", d.index))
        if d.blobs is not None:
            pairs.append(("blobs", d.blobs))
        if d.schema_version is not None:
            pairs.append(("schema", f"v{d.schema_version} (this jax-aot supports up to v{d.supported_schema_version})"))
        if d.entries is not None:
            pairs.append((
                "entries",
                f"{d.entries} ({'?' if d.entries_here is None else d.entries_here} usable in this environment, "
                f"{d.quarantined} quarantined), "
                f"{human_size(d.stored_bytes)} stored",
            ))
        if d.error is not None:
            pairs.append(("error", d.error))
        elif d.health is not None:
            h = d.health
            status = "ok" if h.ok else (
                f"{counted(len(h.problems), 'problem')}, {counted(len(h.orphan_blobs), 'unreferenced blob')} "
                "(run `aot verify`)"
            )
            pairs.append(("health", f"{status}: {counted(h.checked_entries, 'entry')}, {counted(h.checked_blobs, 'blob')} checked"))
        pairs.extend(("problem", problem) for problem in d.cache_problems)
        click.echo(key_value(pairs))
        if d.local is not None:
            tier = d.local
            click.echo("local tier")
            tier_pairs = [("location", tier["location"])]
            if tier["error"] is not None:
                tier_pairs.append(("error", tier["error"]))
            else:
                tier_pairs.append((
                    "entries",
                    f"{tier['entries']} ({tier['entries_this_environment']} usable in this "
                    f"environment), {human_size(tier['stored_bytes'])} stored",
                ))
            click.echo(key_value(tier_pairs))
        if d.aging is not None:
            for line in d.aging.lines():
                click.echo(line)
    if not d.ok:
        click.get_current_context().exit(1)

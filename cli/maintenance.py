"""``aot verify``, ``aot gc`` and ``aot rm``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from aot.cache.units import counted
from aot.cli.common import (
    State,
    confirm,
    echo_json,
    human_size,
    pass_state,
    stdin_is_tty,
    terminal_width,
)
from aot.cli.listing import env_option
from aot.cli.params import AGE, SIZE, complete_entry_names, complete_manifests

if TYPE_CHECKING:
    from aot.cache.admin.maintenance import GcPlan, GcVictim
    from aot.cache.admin.removal import RemovalPlan

VICTIM_SIGNATURE_WIDTH = 60


@click.command("verify", short_help="Check integrity (and manifest coverage).")
@click.option(
    "--manifest", metavar="MANIFEST.toml", shell_complete=complete_manifests,
    help="Also check that every entry the manifest lists is stored for the environment it is "
    "compiled for: its device target's (the manifest's target) or this host's.",
)
@click.option(
    "--strict", is_flag=True,
    help="Exit 1 when a ref or a release member names an entry that is not stored and "
    "intact, or when an entry of the manifest is missing (the manifest defaults to "
    "AOT_MANIFEST or [tool.aot] manifest; without one, only refs and releases are checked).",
)
@click.option(
    "--no-lower", is_flag=True,
    help="Check the manifest's coverage from its specs only, without lowering (cheap; does "
    "not notice code changes).",
)
@click.option(
    "--target", "device_targets", multiple=True, metavar="PLATFORM:CHIP:TOPOLOGY",
    help="Check every entry of the manifest for this accelerator instead of the manifest's "
    "own targets, as aot warmup --target compiles them, e.g. tpu:v5e:2x2 (needs libtpu, not "
    "the device), or 'host' (this host's environment); repeat for several.",
)
@click.option(
    "--require-tuned", is_flag=True,
    help="Also fail when a served GPU entry (of the manifest's names, with --manifest) was compiled "
    "with XLA's default autotune configs instead of the GPU's captured results (aot ls says tuned/defaults).",
)
@click.option(
    "--recompile", is_flag=True,
    help="Also compile each entry of this host's environment from its stored portable HLO and "
    "compare it with the stored executable (equal bytes, else bit-identical outputs on "
    "generated inputs, the optimized HLO compared too): OK, DIFFERS (what) or SKIPPED (why) per entry; "
    "exit 1 on any DIFFERS. Needs the device; on the chip it proves a deviceless compile.",
)
@click.option(
    "--jax-release", "jax_release", metavar="VERSION",
    help="Also list the entries whose portable HLO JAX release VERSION (e.g. 0.12.1) would refuse "
    "(old export formats, from 0.11.1) or no longer promise to call (older than its six-month "
    "window), read from each export's header without that release; exit 1 when any "
    "(aot warmup --refresh-exports exports them again).",
)
@pass_state
def verify_command(
    state: State, manifest: str | None, strict: bool, no_lower: bool, device_targets: tuple[str, ...],
    require_tuned: bool, recompile: bool, jax_release: str | None,
) -> None:
    """Check the cache: re-hash every blob, parse every manifest.

    Bad entries are quarantined (unless --read-only); exit status 1 on any problem
    with an entry (blobs that no entry references are reported; `aot gc` removes them).
    With --manifest --strict this is the CI coverage check: it also fails when an
    entry of the manifest is missing for the environment it is compiled for (its
    device target's, computed without the device; else this host's), and says why (not stored,
    quarantined, or stored for another environment: device_count 8 != 1), and, as it
    lowers every entry (no compile; --no-lower skips this), when the code changed since
    the served entry was compiled (stale). --strict also fails (with or without a
    manifest) when a current ref or a member of a release label's current set names an
    entry that is not stored, quarantined or damaged (dangling: what a strict server
    refuses).
    """
    from aot.cache.reports.coverage import verify_with_coverage
    from aot.cache.warmup.manifest import canonical_targets
    from aot.errors import DeviceTargetError

    if (strict or device_targets) and manifest is None:
        manifest = state.settings.manifest.value  # None: refs and releases only
    if device_targets and manifest is None:
        raise click.UsageError("--target checks a manifest's entries for a target: give --manifest MANIFEST.toml")
    state.use_gpu_targets(*device_targets, manifest=manifest)  # a fleet's captured GPUs
    try:
        targets = canonical_targets(device_targets)  # "host": this host's environment
    except DeviceTargetError as exc:
        raise click.BadParameter(str(exc), param_hint="'--target'") from None
    from aot.cache.admin.aging import aged_entries

    cache = state.cache()
    # A target this host cannot compile for (no libtpu, no CUDA plugin of this jaxlib) is
    # a failure of the gate, exit 1 in one line: the command line itself was right.
    report = verify_with_coverage(
        cache, manifest, strict=strict, lower=not no_lower, targets=targets, require_tuned=require_tuned,
    )
    aging = aged_entries(cache, deep=True)
    exports = None
    if jax_release is not None:
        from aot.cache.admin.export_expiry import expired_exports
        from aot.errors import UsageError

        try:
            exports = expired_exports(cache, jax_release)
        except UsageError as exc:
            raise click.BadParameter(str(exc), param_hint="'--jax-release'") from None
    parity = None
    if recompile:
        from aot.cache.admin.parity import verify_recompile

        parity = verify_recompile(cache)
    if state.json:
        echo_json({
            **report.to_dict(), "aging": aging.to_dict(),
            **({"recompile": parity.to_dict()} if parity is not None else {}),
            **({"exports": exports.to_dict()} if exports is not None else {}),
        })
    else:
        click.echo(report.summary())
        for line in report.problem_lines():
            click.echo(line)
        integrity = report.integrity
        if integrity.quarantined:
            click.echo(f"quarantined {counted(len(integrity.quarantined), 'entry')} (`aot gc` removes them)")
        if integrity.removed:
            click.echo(f"removed {counted(len(integrity.removed), 'jit entry')} (JAX compiles them again on a miss)")
        if integrity.orphan_blobs:
            click.echo(
                f"{counted(len(integrity.orphan_blobs), 'blob')} no entry references (`aot gc` removes "
                "them once they are old enough)"
            )
        for note in integrity.notes[:5]:
            click.echo(f"info: {note}")
        if len(integrity.notes) > 5:
            click.echo(f"info: ... and {len(integrity.notes) - 5} more entries (`aot verify --json` lists them)")
        if report.coverage is not None:
            click.echo(report.coverage.summary())
            for missing in report.coverage.missing:
                click.echo(f"  {missing.describe()}")
            for stale in report.coverage.stale:
                click.echo(stale.describe())
        for line in aging.lines():
            click.echo(line)
        for line in exports.lines() if exports is not None else ():
            click.echo(line)
        if parity is not None:
            click.echo(parity.summary())
            for line in parity.lines():
                click.echo(line)
    if not report.ok or (parity is not None and not parity.ok) or (exports is not None and not exports.ok):
        click.get_current_context().exit(1)


def _victim_line(victim: GcVictim) -> str:
    key = victim.key[:40] if victim.kind == "jit" else victim.key[:12]  # JAX's key: name-hash
    return (
        f"  {key}  {victim.describe(VICTIM_SIGNATURE_WIDTH)}  "
        f"{human_size(victim.stored_size)}  {victim.reason}"
    )


def _render_gc(plan: GcPlan, *, err: bool = False, asking: bool = False) -> None:
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=err)
    if not plan.entries and not plan.blobs:
        click.echo(f"nothing to collect (cache {human_size(plan.size_before)})", err=err)
        _render_pins(plan, err=err)
        return
    verb = "would remove" if not plan.executed else "removed"
    click.echo(
        f"{verb} {counted(len(plan.entries), 'entry')} and {counted(len(plan.blobs), 'blob')}, freeing "
        f"{human_size(plan.bytes_freed)} (cache {human_size(plan.size_before)} -> "
        f"{human_size(plan.size_after)})" + (" [dry run]" if plan.dry_run and not asking else ""),
        err=err,
    )
    for victim in plan.entries:
        click.echo(_victim_line(victim), err=err)
    _render_pins(plan, err=err)


def _render_pins(plan: GcPlan, *, err: bool = False) -> None:
    from aot.cache.admin.maintenance import UNPIN_ADVICE

    for name, signature in plan.dropped_refs:
        click.echo(f"{'dropped' if plan.executed else 'would drop'} the ref of {name} ({signature}): not in the manifest", err=err)
    if plan.jax_release is not None:
        n = len(plan.retired_environments)
        click.echo(
            f"JAX release {plan.jax_release}: "
            + (f"{'dropped' if plan.executed else 'would drop'} the refs and release members of its "
               f"{counted(n, 'environment')} with its entries (no host of it serves them)" if n
               else "no entry in this cache was compiled by it"),
            err=err,
        )
    if plan.pinned:
        click.echo(f"kept {len(plan.pinned)} pinned {'entry' if len(plan.pinned) == 1 else 'entries'}:", err=err)
        for victim in plan.pinned:
            click.echo(_victim_line(victim), err=err)
        click.echo(f"  to unpin: {UNPIN_ADVICE}", err=err)


@click.command("gc", short_help="Remove stale entries and unreferenced blobs.")
@click.option("--max-size", type=SIZE, metavar="SIZE", help="Evict least recently used entries until the cache fits, e.g. 10G.")
@click.option(
    "--older-than", type=AGE, metavar="AGE",
    help="Remove entries unused for longer than this: 30d, 12h, 15min, 2w, 1mo (30 days).",
)
@click.option("--superseded", is_flag=True, help="Also remove entries another one of the same name, signature and environment supersedes (the ref'd one, else the newest).")
@click.option(
    "--manifest", "gc_manifest", metavar="MANIFEST.toml", shell_complete=complete_manifests,
    help="Drop the refs of signatures of the manifest's names that it no longer lists, and "
    "collect their entries.",
)
@click.option(
    "--kind", "gc_kind", type=click.Choice(["all", "aot", "jit"]), default="all", show_default=True,
    help="Select only entries compiled through jax-aot (aot) or only entries of JAX's "
    "persistent cache stored through aot.jax_cache (jit).",
)
@click.option(
    "--jax-release", metavar="VERSION",
    help="Retire a JAX release (0.9.2): remove every entry it compiled, pinned or not, with the "
    "refs and release members of its environments. Once no host runs it.",
)
@click.option("--force", is_flag=True, help="Collect even when the index is empty but blobs exist (a lost index?).")
@click.option("--dry-run", is_flag=True, help="Only print the plan.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation on a terminal.")
@pass_state
def gc_command(
    state: State, max_size: int | None, older_than: str | None, superseded: bool,
    gc_manifest: str | None, gc_kind: str, jax_release: str | None, force: bool, dry_run: bool, yes: bool,
) -> None:
    """Remove quarantined, stale, superseded and least recently used entries, and
    unreferenced blobs. Entries of JAX's cache (KIND jit, aot.jax_cache) are selected
    by --older-than and --max-size too, in one LRU order with the aot entries.

    Prints the plan (what goes and the bytes it frees); on a terminal asks before
    carrying it out (--yes does not ask; without a terminal nothing asks), and
    --dry-run stops after the plan.
    """
    cache = state.cache()
    options: dict[str, Any] = dict(max_size=max_size, older_than=older_than, superseded=superseded, force=force,
                   manifest=gc_manifest, kind=gc_kind, jax_release=jax_release)
    if not dry_run and not yes and stdin_is_tty():
        plan = cache.gc(dry_run=True, **options)
        if not plan.entries and not plan.blobs:
            _finish_gc(state, plan)
            return
        _render_gc(plan, err=state.json, asking=True)
        confirm(
            f"Remove {counted(len(plan.entries), 'entry')} and {counted(len(plan.blobs), 'blob')} "
            f"({human_size(plan.bytes_freed)})?", yes=yes,
        )
    _finish_gc(state, cache.gc(dry_run=dry_run, **options))


def _finish_gc(state: State, plan: GcPlan) -> None:
    if state.json:
        echo_json(plan.to_dict())
    else:
        _render_gc(plan)


@click.command("rm", short_help="Remove entries by key or name, planned and confirmed.")
@click.argument("target", metavar="KEY|NAME_GLOB", shell_complete=complete_entry_names)
@click.option(
    "--signature", "signatures", multiple=True, metavar="SPEC",
    help="Only entries with this input signature: the whole flat one ('f32[8], f32[8]') or "
    "leaves by path ('x: f32[1,784]'). Repeat for several.",
)
@env_option
@click.option(
    "--force", is_flag=True,
    help="Remove entries a release label pins too (the plan names the labels; without "
    "--force rm refuses them).",
)
@click.option("--dry-run", is_flag=True, help="Only print the plan.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation on a terminal.")
@pass_state
def rm_command(
    state: State, target: str, signatures: tuple[str, ...], env: str, force: bool, dry_run: bool, yes: bool,
) -> None:
    """Remove the entry KEY (a full key or a unique prefix of 4+ hex digits) or every
    entry whose name matches NAME_GLOB, with their blobs (those no other entry uses).

    Prints the plan; on a terminal asks before removing (--yes does not ask; without a
    terminal nothing asks); --dry-run stops after the plan. Exit status 1 when the
    target matches nothing, and when a release label pins an entry of the plan (a
    member of a set the label serves or a rollback could reach): the plan names the
    labels, and --force removes such entries anyway.
    """
    from aot.cache.admin.removal import SignatureFilter, execute_removal, plan_removal
    from aot.errors import AotError, SpecError

    for text in signatures:
        try:
            SignatureFilter.parse(text)
        except SpecError as exc:
            raise click.BadParameter(str(exc), param_hint="'--signature'") from None
    cache = state.cache()
    plan = plan_removal(cache, target, signatures=signatures, env=env)
    if dry_run or not plan.entries:
        _finish_rm(state, plan)
        return
    if plan.pinned and not force:
        _render_rm(plan, err=True)
        raise AotError(plan.refusal())
    if not yes and stdin_is_tty():
        _render_rm(plan, err=state.json)
        confirm(f"Remove {len(plan.entries)} entr{'y' if len(plan.entries) == 1 else 'ies'} "
                f"({human_size(plan.bytes_freed)})?", yes=yes)
    _finish_rm(state, execute_removal(cache, plan, force=force))


def _render_rm(plan: RemovalPlan, *, err: bool = False) -> None:
    if not plan.entries:
        narrowed = " with those signatures" if plan.signatures else ""
        narrowed += " for this environment" if plan.env == "this" else ""
        click.echo(f"nothing to remove: no entry of {plan.target!r}{narrowed}", err=err)
        return
    click.echo(plan.summary() + ("" if plan.executed else " [plan]"), err=err)
    width = terminal_width()
    for victim in plan.entries:
        if victim.pinned_by:  # what serves it, not what listing calls it ("superseded")
            extra = [f"pinned by release {', '.join(victim.pinned_by)}"]
        else:
            extra = [victim.status] if victim.status != "ok" else []
        if victim.environment != "this" and victim.kind == "aot":
            extra.append(f"env {victim.environment}")
        note = f"  ({', '.join(extra)})" if extra else ""
        click.echo(
            f"  {victim.describe(None if width is None else max(24, width - 40))}  "
            f"{human_size(victim.stored_size)}{note}", err=err,
        )


def _finish_rm(state: State, plan: RemovalPlan) -> None:
    if state.json:
        echo_json(plan.to_dict())
    else:
        _render_rm(plan)

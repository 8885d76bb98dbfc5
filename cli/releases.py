"""``aot release ls|show|history|diff|promote|rollback|rm`` and ``aot history``: what is served, thin
over :class:`aot.Cache`'s release and ref methods."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from aot.cli.common import State, confirm, echo_json, pass_state, stdin_is_tty
from aot.cli.params import complete_entry_names
from aot.cache.units import counted

if TYPE_CHECKING:
    from aot.cache.index.releases import Release, ReleaseRemoval


def _short(key: str) -> str:
    return key[:12]


def _release_line(release: Release) -> str:
    previous = f"previous set {release.previous}" if release.previous is not None else "no previous set"
    commit = f"  commit {release.commit}" if release.commit else ""
    return (f"{release.label}  set {release.id}  {release.created_at:%Y-%m-%d %H:%M:%S}  "
            f"{release.user}@{release.host}  {release.move()}{commit}  ({previous})")


def _render(state: State, release: Release, verb: str) -> None:
    if state.json:
        echo_json(release.to_dict())
        return
    click.echo(f"{verb} {release.label}: set {release.id}, {counted(len(release.members), 'member')}")


@click.group("release", short_help="List, show, promote, roll back and remove release labels.")
def release_group() -> None:
    """Release labels: each names a set of refs (what `aot warmup --release LABEL` compiled
    or hit); a replica loading a label serves exactly that set."""


@release_group.command("ls", short_help="List release labels and their current set.")
@pass_state
def release_ls(state: State) -> None:
    """List every release label with its current set (who made it, when, from what)."""
    releases = state.cache().releases()
    if state.json:
        echo_json({"releases": [r.to_dict() for r in releases]})
        return
    if not releases:
        click.echo("no releases (`aot warmup --release LABEL` records one)")
    for release in releases:
        click.echo(_release_line(release))


@release_group.command("default", short_help="Show or set the release a replica serves when it names none.")
@click.argument("label", required=False)
@click.option("--clear", is_flag=True, help="Declare no default: a replica that names no release serves the refs.")
@pass_state
def release_default(state: State, label: str | None, clear: bool) -> None:
    """Show (no LABEL) or set the cache's default release: what `aot.load` serves
    without `release=` and without AOT_RELEASE, and what `aot why`, `show` and `ls`
    answer for. A label, not a set: the default follows the label's promotions and
    rollbacks. With no default declared, such a replica serves the refs (the last
    warm-up's)."""
    if label is not None and clear:
        raise click.UsageError("give a LABEL or --clear, not both")
    cache = state.cache()
    if label is None and not clear:
        current = cache.default_release()
        if state.json:
            echo_json({"default_release": current})
        else:
            click.echo(current if current is not None else "no default release (a replica that names none serves the refs)")
        return
    before = cache.set_default_release(None if clear else label)
    if state.json:
        echo_json({"default_release": None if clear else label, "previous": before})
    elif clear:
        click.echo(f"no default release (was {before!r}): a replica that names none serves the refs")
    else:
        click.echo(f"default release: {label} (was {before!r})")


@release_group.command("show", short_help="The members of a label's current set.")
@click.argument("label")
@pass_state
def release_show(state: State, label: str) -> None:
    """The members of LABEL's current set: key, target (tpu:v5e:2x2, or cpu x8 for a
    host's environment), the JAX release that compiled it (jax 0.9.2) when the set
    holds entries of more than one, name and signature."""
    from aot.cache.rows import environment_names, environment_parts_of, jax_release

    cache = state.cache()
    release = cache.release(label)
    keys = {m.env_fp: m.key for m in release.members}
    targets = environment_names(cache, keys)
    parts = environment_parts_of(cache, keys)
    jax = {env: (p.get("jax"), p.get("jaxlib")) for env, p in parts.items()}
    if state.json:
        data = release.to_dict()
        for member in data["members"]:
            member["target"] = targets.get(member["env_fp"])
            member["jax"], member["jaxlib"] = jax.get(member["env_fp"], (None, None))
        echo_json(data)
        return
    click.echo(_release_line(release))
    width = max((len(targets.get(m.env_fp, "-")) for m in release.members), default=0)
    releases = {m.env_fp: "jax " + jax_release(*jax.get(m.env_fp, (None, None))) for m in release.members}
    several = len(set(releases.values())) > 1  # a label holding two JAX releases: which is which
    shown = max((len(r) for r in releases.values()), default=0)
    for member in release.members:
        target = targets.get(member.env_fp, "-").ljust(width)
        version = f"  {releases[member.env_fp].ljust(shown)}" if several else ""
        click.echo(f"  {_short(member.key)}  {target}{version}  {member.name} ({member.signature})")


def _before(release: Release) -> str:
    """What ``previous`` means for this set: the set it replaced, or, for a set a
    rollback made (a copy of an older set), where the next rollback goes."""
    if release.source.startswith("rollback"):
        return (f"a rollback goes to set {release.previous}" if release.previous is not None
                else "no earlier set")
    return f"replaced set {release.previous}" if release.previous is not None else "first set"


@release_group.command("history", short_help="Every move of a label: declarations, promotions, rollbacks.")
@click.argument("label")
@click.option("--limit", type=click.IntRange(min=1), help="Only the newest N moves.")
@pass_state
def release_history(state: State, label: str, limit: int | None) -> None:
    """Every set LABEL pointed to, newest first: the set, when (the index's clock), who
    (user@host), the move (declared by a warm-up or push, promoted from another label,
    rolled back) and the set it replaced. The first line is the current set."""
    from aot.cache.rows import set_targets

    cache = state.cache()
    sets = cache.release_history(label, limit=limit)
    targets = set_targets(cache, sets)
    if state.json:
        echo_json({"label": label, "history": [
            {**r.to_dict(), "move": r.move(), "targets": targets[r.id]} for r in sets
        ]})
        return
    for n, release in enumerate(sets):
        commit = f"  commit {release.commit}" if release.commit else ""
        click.echo(f"{'*' if n == 0 else ' '} set {release.id}  {release.created_at:%Y-%m-%d %H:%M:%S}  "
                   f"{release.user}@{release.host}  {release.move()}{commit}  "
                   f"[{_targets_text(targets[release.id])}]  ({_before(release)})")


def _targets_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{target} ({n})" if n > 1 else target for target, n in counts.items()) or "no members"


@release_group.command("diff", short_help="The members that differ between two labels, and why.")
@click.argument("a")
@click.argument("b")
@pass_state
def release_diff(state: State, a: str, b: str) -> None:
    """The members that differ from label A's current set to B's: + added (in B only),
    - removed (in A only), ~ changed (another key for the same name and signature),
    each with its key(s), target, name and signature; under a changed member, the
    fingerprint parts that differ (A's value first), as `aot why` names them. `aot
    release diff prod candidate` says what promoting candidate to prod changes."""
    diff = state.cache().release_diff(a, b)
    if state.json:
        echo_json(diff.to_dict())
    else:
        click.echo(diff.describe())


@release_group.command("promote", short_help="Point TARGET at SOURCE's current set.")
@click.argument("source")
@click.argument("target")
@pass_state
def release_promote(state: State, source: str, target: str) -> None:
    """Point label TARGET at the set SOURCE points to now (aot release promote candidate
    prod). `aot release rollback TARGET` undoes it."""
    _render(state, state.cache().promote(source, target), "promoted")


@release_group.command("rollback", short_help="Point LABEL back at its previous set.")
@click.argument("label")
@pass_state
def release_rollback(state: State, label: str) -> None:
    """Point LABEL back at the set it pointed to before its current one (again: one more
    step back). Prints the set whose members it serves again, the new set that holds
    them and the set it leaves."""
    release = state.cache().rollback(label)
    back = release.rolled_back
    if state.json or back is None:
        _render(state, release, "rolled back")
        return
    click.echo(f"rolled back {release.label} to set {back[0]} (now set {release.id}, "
               f"{counted(len(release.members), 'member')}); left set {back[1]}")


@release_group.command("rm", short_help="Remove labels: what only they pinned becomes collectable.")
@click.argument("labels", metavar="LABEL [LABEL ...]", nargs=-1, required=True)
@click.option("--dry-run", is_flag=True, help="Only print the plan.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation on a terminal.")
@pass_state
def release_rm(state: State, labels: tuple[str, ...], dry_run: bool, yes: bool) -> None:
    """Remove release LABELs (every set each pointed to), so that `aot gc` may collect
    the entries only they pinned; entries a ref or another label pins stay pinned. A
    replica loading a removed label fails at start-up.

    Prints the plan (each label's current and rollback sets, the entries unpinned);
    on a terminal asks before removing (--yes does not ask; without a terminal nothing
    asks); --dry-run stops after the plan. Exit status 1 for an unknown label.
    """
    cache = state.cache()
    if dry_run or yes or not stdin_is_tty() or cache.read_only:  # read-only: refused before asking
        _render_removal(state, cache.remove_release(labels, dry_run=dry_run))
        return
    plan = cache.remove_release(labels, dry_run=True)
    _print_removal(plan, err=state.json)
    confirm(f"Remove {counted(len(plan.releases), 'release label')} "
            f"(unpins {counted(len(plan.unpinned), 'entry')})?", yes=yes)
    _render_removal(state, cache.remove_release(plan))


def _render_removal(state: State, plan: ReleaseRemoval) -> None:
    if state.json:
        echo_json(plan.to_dict())
    else:
        _print_removal(plan)


def _print_removal(plan: ReleaseRemoval, *, err: bool = False) -> None:
    click.echo(plan.summary() + ("" if plan.executed else " [plan]"), err=err)
    for release in plan.releases:
        click.echo(f"  release {release.describe()}", err=err)
    verb = "unpinned" if plan.executed else "would unpin"
    for member in plan.unpinned:
        click.echo(f"  {verb} {_short(member.key)}  {member.name} ({member.signature})", err=err)
    if plan.still_pinned:
        n = len(plan.still_pinned)
        click.echo(f"  {counted(n, 'member')} {'stays' if n == 1 else 'stay'} pinned by a ref or another label "
                   "(--json says which)", err=err)


@click.command("history", short_help="The history of the refs of a name.")
@click.argument("name", shell_complete=complete_entry_names)
@click.option("--limit", type=click.IntRange(min=1), help="Only the newest N changes.")
@pass_state
def history_command(state: State, name: str, limit: int | None) -> None:
    """Every change of the refs of NAME, newest first: when (the index's clock), the key
    served from then on, host, user, source (manifest or call), release and commit."""
    refs = state.cache().history(name, limit=limit)
    if state.json:
        echo_json({"name": name, "history": [r.to_dict() for r in refs]})
        return
    if not refs:
        click.echo(f"no ref of {name!r} was ever set (a warm-up or compile sets them)")
    for ref in refs:
        extra = "".join(f"  {k} {v}" for k, v in (("release", ref.release), ("commit", ref.commit)) if v)
        click.echo(f"{ref.set_at:%Y-%m-%d %H:%M:%S}  {_short(ref.key)}  ({ref.signature})  "
                   f"{ref.user}@{ref.host}  {ref.source}{extra}")

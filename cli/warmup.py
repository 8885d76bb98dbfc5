"""``aot warmup``: compile everything a manifest lists (the CI step)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from aot.cli.common import State, echo_json, pass_state, stderr_is_tty, stdout_is_tty
from aot.cli.distributed import DISTRIBUTED_HELP, JobRole, job_command
from aot.cli.params import complete_manifests
from aot.cli.progress import Progress

if TYPE_CHECKING:
    from aot.cache.warmup.following import WarmupLeader
    from aot.cache.warmup.steps import ItemResult


class JobsType(click.ParamType):
    """A count >= 1, or ``auto`` (kept as ``"auto"``: the command resolves it with
    :func:`aot.cache.warmup.jobs.auto_jobs` once it knows how many entries there are)."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        from aot.cache.warmup.jobs import AUTO, resolve_jobs

        if isinstance(value, int) and not isinstance(value, bool):
            text: int | str = value
        else:
            text = str(value)
            if text.strip().lower() == AUTO:
                return AUTO
        try:
            return resolve_jobs(text)
        except ValueError:
            self.fail(f"{value!r} is not a number >= 1 or 'auto'", param, ctx)


def _parse_shard(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    from aot.cache.warmup.shard import parse_shard

    try:
        return parse_shard(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("warmup", short_help="Compile everything a manifest lists (CI).")
@click.argument("manifest", required=False, metavar="[MANIFEST.toml]", shell_complete=complete_manifests)
@click.option(
    "-j", "--jobs", type=JobsType(), default="1", show_default=True,
    help="Run this many XLA compiles at once: here and in N-1 worker processes ('auto': "
    "one per 3 usable cores, since XLA compiles on several threads; 2 GiB of available "
    "memory each; at most one per entry; a warning when N exceeds the cores).",
)
@click.option(
    "--isolate", is_flag=True,
    help="Compile in --jobs worker processes only, none here: a crash or out-of-memory "
    "kill fails only its entry.",
)
@click.option(
    "--relower", is_flag=True,
    help="Accepted for compatibility: every warm-up lowers every entry now (a hit "
    "skips only the compile).",
)
@click.option(
    "--commit", metavar="SHA",
    help="The commit recorded with the refs set (default: GIT_COMMIT, GITHUB_SHA, "
    "CI_COMMIT_SHA, BUILDKITE_COMMIT or CIRCLE_SHA1).",
)
@click.option(
    "--release", metavar="LABEL",
    help="Also record the refs under release LABEL (e.g. candidate): the warm-ups of one "
    "run (same --run, default the same commit: shards, several manifests) add to one set; "
    "one of another run opens a new set that keeps LABEL's members it does not compile.",
)
@click.option(
    "--run", "run_id", metavar="ID",
    help="The run id the warm-ups of one --release set share (default: the commit, "
    "--commit or GIT_COMMIT, ...).",
)
@click.option(
    "--replace", is_flag=True,
    help="With --release: start LABEL over with this run's entries, dropping the members "
    "of its current set that this warm-up does not compile (the warm-ups of this run still add to it).",
)
@click.option(
    "--shard", metavar="I/N", callback=_parse_shard, default=None,
    help="Compile only share I of N (1 <= I <= N), balanced by estimated compile time: "
    "one CI runner's part of the manifest.",
)
@click.option(
    "--claims/--no-claims", default=None,
    help="Claim each entry in the index before compiling it, so runners of one manifest "
    "without --shard compile each entry once in total (default: on for a shared "
    "PostgreSQL index; any --jobs, and --isolate).",
)
@click.option(
    "--target", "device_targets", multiple=True, metavar="PLATFORM:CHIP:TOPOLOGY",
    help="Compile every entry for this accelerator instead of this host's devices, e.g. "
    "tpu:v5e:2x2 (without the device: needs libtpu, pip install 'jax-aot[tpu]'); repeat "
    "for several ('host': this host's devices). Replaces every target the manifest names: "
    "the top-level one and each [[function]]'s own.",
)
@click.option("--distributed", is_flag=True, help=DISTRIBUTED_HELP)
@click.option(
    "--refresh-exports", is_flag=True,
    help="Also export again, with this JAX, the portable HLO of every entry compiled or hit whose "
    "export the newest supported JAX release would refuse or no longer promise to call (jax.export's "
    "window; `aot verify --jax-release` lists them), replacing the stored blob; the executable is kept.",
)
@pass_state
def warmup_command(
    state: State, manifest: str | None, jobs: int | str, shard: tuple[int, int] | None,
    isolate: bool, relower: bool, commit: str | None, release: str | None, run_id: str | None,
    claims: bool | None, device_targets: tuple[str, ...], replace: bool, distributed: bool,
    refresh_exports: bool,
) -> None:
    """Compile every (function x bucket) listed in MANIFEST.toml into the cache.

    MANIFEST.toml defaults to AOT_MANIFEST or [tool.aot] manifest. Entries already in
    the cache cost no compile (every entry is lowered). Every entry is tried; the exit
    status is 1 if any failed (--debug prints their tracebacks). Progress goes to
    stderr when it is a terminal; otherwise one line per entry. The manifest format is
    in docs/manifest.md.

    With --distributed, start it in every process of a multi-process job (a manifest
    whose meshes span the processes): process 0 stores and reports for the job.
    """
    with job_command(state, distributed, "warmup") as role:
        _warmup(
            state, manifest, jobs, shard, isolate, commit, release, run_id, claims, device_targets,
            replace, role=role, distributed=distributed, refresh_exports=refresh_exports,
        )


def _warmup(
    state: State, manifest: str | None, jobs: int | str, shard: tuple[int, int] | None,
    isolate: bool, commit: str | None, release: str | None, run_id: str | None,
    claims: bool | None, device_targets: tuple[str, ...], replace: bool, *, role: JobRole,
    distributed: bool, refresh_exports: bool = False,
) -> None:
    from aot.cache.warmup.following import WarmupLeader

    # Process 0 of a job tells the others what it warms up, item by item (they follow).
    leader = WarmupLeader() if state.job is not None and state.job.primary else None
    try:
        _warm(state, manifest, jobs, shard, isolate, commit, release, run_id, claims, device_targets, replace,
              role=role, distributed=distributed, leader=leader, refresh_exports=refresh_exports)
    except BaseException as exc:
        if leader is not None and not (isinstance(exc, click.exceptions.Exit) and exc.exit_code == 0):
            leader.abort(role.failure or f"{type(exc).__name__}: {exc}")
        raise


def _warm(
    state: State, manifest: str | None, jobs: int | str, shard: tuple[int, int] | None,
    isolate: bool, commit: str | None, release: str | None, run_id: str | None,
    claims: bool | None, device_targets: tuple[str, ...], replace: bool, *, role: JobRole,
    distributed: bool, leader: WarmupLeader | None, refresh_exports: bool = False,
) -> None:
    from aot.cache.warmup.run import expand, follow_warmup, load_manifest, run_warmup
    from aot.export_rules import newest_release
    from aot.distributed_job import requested

    reports = role.reports
    if manifest is None:
        manifest = state.settings.manifest.value
        if manifest is None:
            raise click.UsageError(
                "no manifest: give MANIFEST.toml, or set AOT_MANIFEST or manifest in "
                "[tool.aot] of pyproject.toml"
            )

    from aot.cache.index.refs import RefOrigin, default_commit
    from aot.cache.warmup.jobs import resolve_jobs
    from aot.cache.warmup.run import release_run
    from aot.errors import DeviceTargetError, UsageError
    from aot.targets import compile_only_here, parse_target

    state.use_gpu_targets(*device_targets, manifest=manifest, create=True)  # a fleet's captured GPUs
    loaded = load_manifest(manifest)  # logs the old target = "module:attr" spelling once
    loaded.check_fleet()  # another libtpu than the fleet's: fail here, not at the deploy
    if device_targets:
        try:
            loaded = loaded.for_targets(device_targets)  # each target once
        except DeviceTargetError as exc:
            raise click.BadParameter(str(exc), param_hint="'--target'") from None
    items = expand(loaded)
    # The device targets the items are compiled for, each once (None: this host's devices).
    targets = list(dict.fromkeys(item.device_target for item in items))
    if None not in targets:
        compile_only_here()  # before the worker processes start: they inherit it
    jobs = resolve_jobs(jobs, entries=len(items))  # "auto": at most one job per entry
    if requested(distributed) and (jobs > 1 or isolate):
        # Worker processes are not in the job: they would not see the other processes' devices.
        raise click.UsageError("--distributed compiles in this process: give no --jobs above 1 and no --isolate")
    origin = RefOrigin(f"warmup {manifest}", commit=commit or default_commit())
    if replace and release is None:
        raise click.UsageError("--replace starts a release label over: give --release LABEL with it")
    if release is not None and run_id is None:
        try:
            run_id = release_run(origin.commit, shard=shard)
        except UsageError as exc:
            raise click.UsageError(str(exc)) from None
    # The worker processes start now: they import JAX while this process does (opening
    # the cache imports it). --isolate starts them only for entries not stored.
    workers = None
    if jobs > 1 and not isolate:
        from aot.cache.warmup.workers import WorkerPool

        workers = WorkerPool(min(jobs - 1, len(items) - 1))
    try:
        with state.start_up():  # SQLAlchemy and JAX, whose backend the environment starts
            cache = state.cache(create=True)
            if None in targets:  # entries for device targets never open this host's device
                cache.environment  # noqa: B018 - every warm-up needs it; computed once
            for target in targets:  # libtpu missing, or refusing a held chip: one line
                if target is not None:
                    parse_target(target).devices()
    except BaseException:
        if workers is not None:
            workers.close()
        raise
    if shard is not None:
        from aot.cache.warmup.shard import select_shard

        total = len(select_shard(items, shard, cache))
    else:
        total = len(items)
    progress = None
    if stderr_is_tty() and reports:
        progress = Progress(total, f"warmup ({jobs} job{'s' if jobs > 1 else ''})")
    # One line per entry, unless --json, or a progress bar already shows it on the
    # terminal the lines would go to.
    lines = reports and not state.json and not (progress is not None and stdout_is_tty())

    def on_result(result: ItemResult) -> None:
        if progress is not None:
            progress.update(result.label, failed=not result.ok, compiled=result.status == "compiled")
        if lines:
            click.echo(result.line())

    if progress is not None:
        progress.start()
    try:
        if state.job is not None and not state.job.primary:  # loads what process 0 stores
            report = follow_warmup(cache, items, on_result=on_result)
        else:
            report = run_warmup(
                cache, items, jobs=jobs, shard=shard, on_result=on_result, isolate=isolate,
                workers=workers, origin=origin, release=release, run=run_id, replace=replace, claims=claims,
                leader=leader, refresh_exports=newest_release() if refresh_exports else None,
            )
    finally:
        if progress is not None:
            progress.finish()
    if reports and state.json:
        echo_json(report.to_dict())
    elif reports:
        for refreshed in report.refreshed:
            click.echo(refreshed.line())
        click.echo(report.summary())
    if not state.json or not reports:  # another process of the job: its own failures, on stderr
        for failure in report.failures:
            where = f" ({failure.source})" if failure.source else ""
            click.echo(f"failed: {failure.label}{where}: {failure.error}", err=True)
    if state.debug:
        for failure in report.failures:
            click.echo(f"traceback of {failure.label}:\n{(failure.traceback or '').rstrip()}", err=True)
    if not report.ok:
        first = report.failures[0] if report.failures else None
        role.failure = f"{len(report.failures)} failed" + (f", first {first.label}: {first.error}" if first else "")
        click.get_current_context().exit(1)

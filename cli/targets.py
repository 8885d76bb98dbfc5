"""``aot target capture|ls|show``: a fleet's own GPUs in the cache, thin over
:meth:`aot.Cache.capture_target` and :meth:`aot.Cache.captured_targets`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from aot.cli.common import State, echo_json, pass_state, table
from aot.platforms.cuda import config_name

if TYPE_CHECKING:
    from aot.cache.index.targets import CapturedTarget


def _summary(target: CapturedTarget) -> str:
    versions = target.version_map
    cuda = " ".join(f"{k} {versions[k]}" for k in ("runtime", "cudnn", "cublas", "nccl") if k in versions) or "versions unknown"
    tuned = f"autotune results {target.autotune_digest[7:19]}" if target.autotune_digest else "no autotune results"
    return f"cuda:{target.name}: {target.device_kind}, config {target.config_digest[7:19]}, {cuda}, {tuned}"


@click.group("target", short_help="Capture a fleet's own GPU; list and show the captured ones.")
def target_group() -> None:
    """GPU targets captured from the fleet's hosts: `aot target capture NAME` on a GPU host
    records the GPU's target config, CUDA versions and autotune results; then
    `--target cuda:NAME` anywhere (a CPU CI runner) compiles for exactly that GPU."""


@target_group.command("capture", short_help="Record this host's GPU as cuda:NAME in the cache.")
@click.argument("name")
@click.option("--from-file", "config_file", type=click.Path(dir_okay=False), default=None,
              help="Record this target config (a GpuTargetConfigProto in text format) instead of this host's GPU.")
@click.option("--versions", "versions_file", type=click.Path(dir_okay=False), default=None,
              help="With --from-file: the CUDA versions recorded with it (a JSON object: runtime, cudnn, cublas, nccl).")
@click.option("--autotune", "autotune_file", type=click.Path(dir_okay=False), default=None,
              help="XLA's autotune results measured on this GPU (--xla_gpu_dump_autotune_results_to=FILE).")
@pass_state
def target_capture(
    state: State, name: str, config_file: str | None, versions_file: str | None, autotune_file: str | None,
) -> None:
    """Record this host's GPU (its target config, the CUDA runtime, driver, cuDNN, cuBLAS
    and NCCL versions, and autotune results when given) as `cuda:NAME` in the cache.
    A capture under a name already recorded replaces it."""
    if versions_file is not None and config_file is None:
        raise click.UsageError("--versions goes with --from-file (a capture on the GPU reads them itself)")
    record = state.cache(create=True).capture_target(
        name, config_file=config_file, versions_file=versions_file, autotune_file=autotune_file,
    )
    if state.json:
        echo_json(record.to_dict())
        return
    click.echo(f"captured {_summary(record)}")


@target_group.command("ls", short_help="List the GPUs captured in the cache.")
@pass_state
def target_ls(state: State) -> None:
    """List the captured GPUs: name, device, config digest, CUDA versions, autotune results."""
    captured = state.cache().captured_targets()
    if state.json:
        echo_json({"targets": [t.to_dict() for t in captured]})
        return
    if not captured:
        click.echo("no captured GPUs (`aot target capture NAME` on a GPU host records one)")
        return
    rows = [
        (f"cuda:{t.name}", t.device_kind, t.config_digest[7:19],
         "tuned " + t.autotune_digest[7:19] if t.autotune_digest else "none",
         f"{t.captured_at:%Y-%m-%d %H:%M}", f"{t.user}@{t.host}")
        for t in captured
    ]
    click.echo(table(("TARGET", "DEVICE", "CONFIG", "AUTOTUNE", "CAPTURED", "BY"), rows))


@target_group.command("show", short_help="Show one captured GPU, its config and versions.")
@click.argument("name")
@pass_state
def target_show(state: State, name: str) -> None:
    """Show a captured GPU: its versions, its target config, whether it has autotune results."""
    found = {t.name: t for t in state.cache().captured_targets()}
    target = found.get(config_name(name))
    if target is None:
        known = ", ".join(f"cuda:{n}" for n in found) or "none"
        raise click.ClickException(f"no captured GPU {name!r} in this cache; captured: {known}")
    if state.json:
        echo_json(target.to_dict(with_texts=True))
        return
    click.echo(_summary(target))
    for key, value in target.version_map.items():
        click.echo(f"  {key}: {value}")
    click.echo(f"  captured {target.captured_at:%Y-%m-%d %H:%M:%S} by {target.user}@{target.host}")
    click.echo(target.config.rstrip())

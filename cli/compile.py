"""``aot compile`` and ``aot why``."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

from aot.cli.common import (
    State,
    echo_json,
    human_size,
    key_value,
    parse_kwargs,
    parse_static,
    pass_state,
    resolve_served_release,
    served_release_option,
)
from aot.cli.distributed import DISTRIBUTED_HELP, job_command
from aot.cli.params import MESH, complete_entry_names, complete_manifests
from aot.platforms import captured_target

F = TypeVar("F", bound=Callable[..., Any])

SPEC_HELP = (
    "A spec like f32[8,784], i32[] or f32[64,512]@data,None (with --mesh), or "
    "@MODULE:CALLABLE for the pytree of specs it returns. Repeat for each positional argument."
)


def lowering_options(fn: F) -> F:
    """The options that describe how a function is lowered, one definition for
    ``aot compile`` and ``aot why``: the same options lower the same program (parsed
    into a warm-up item by :func:`aot.cache.warmup.functions.function_item`)."""
    options = [
        click.option("--arg", "args", multiple=True, metavar="SPEC", help=SPEC_HELP),
        click.option("--kwarg", "kwargs", multiple=True, metavar="NAME=SPEC", help="A keyword argument's spec."),
        click.option(
            "--args-from", metavar="MODULE:CALLABLE",
            help="A callable returning the argument specs (e.g. via jax.eval_shape): a tuple is "
            "several positional arguments, anything else one. They come before --arg.",
        ),
        click.option(
            "--static", multiple=True, metavar="NAME=JSON",
            help="A static argument, e.g. training=false or act='\"relu\"'.",
        ),
        click.option("--pmap", "pmap_axis", metavar="AXIS", help="Lower with jax.pmap over this axis name."),
        click.option(
            "--mesh", type=MESH, metavar="AXIS=SIZE,...",
            help="A device mesh, e.g. data=4,model=2 (over the first devices; with --target, "
            "the target's).",
        ),
        click.option(
            "--in-sharding", "in_shardings", multiple=True, metavar="PSPEC",
            help="One per positional argument: a partition spec like 'data,None', '' (replicated) "
            "or 'auto'. Needs --mesh.",
        ),
        click.option(
            "--out-sharding", "out_shardings", multiple=True, metavar="PSPEC",
            help="Output partition spec(s); one applies to every output. Needs --mesh.",
        ),
        click.option(
            "--donate", multiple=True, type=click.IntRange(min=0), metavar="I",
            help="Donate positional argument I.",
        ),
        click.option(
            "--x64", is_flag=True,
            help="Lower and compile with 64-bit types enabled (f64, i64 specs), as under "
            "jax.enable_x64(True); serve it from a process with x64 enabled.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def lowering_values(
    args: tuple[str, ...], kwargs: tuple[str, ...], args_from: str | None, static: tuple[str, ...],
    pmap_axis: str | None, mesh: tuple[tuple[str, int], ...] | None, in_shardings: tuple[str, ...],
    out_shardings: tuple[str, ...], donate: tuple[int, ...], x64: bool,
) -> dict[str, Any]:
    """:func:`lowering_options`' values, parsed, as
    :func:`aot.cache.warmup.functions.function_item` takes them."""
    return dict(
        args=args, kwargs=parse_kwargs(kwargs), args_from=args_from, static=parse_static(static),
        pmap=pmap_axis, mesh=mesh, in_shardings=in_shardings, out_shardings=out_shardings,
        donate=donate, x64=x64,
    )


@click.command("compile", short_help="Compile a function for given argument specs into the cache.")
@click.argument("function", metavar="MODULE:FUNCTION")
@lowering_options
@click.option("--name", help="The name to store it under (default MODULE.FUNCTION).")
@click.option(
    "--commit", metavar="SHA",
    help="The commit recorded with the ref set (default: GIT_COMMIT or the CI's variable).",
)
@click.option(
    "--target", "device_target", metavar="PLATFORM:CHIP:TOPOLOGY",
    help="Compile for this accelerator instead of this host's devices, e.g. tpu:v5e:2x2 "
    "(without the device: needs libtpu, pip install 'jax-aot[tpu]'); --mesh is then over "
    "the target's devices.",
)
@click.option("--distributed", is_flag=True, help=DISTRIBUTED_HELP)
@pass_state
def compile_command(
    state: State, function: str, args: tuple[str, ...], kwargs: tuple[str, ...],
    args_from: str | None, static: tuple[str, ...], name: str | None, pmap_axis: str | None,
    mesh: tuple[tuple[str, int], ...] | None, in_shardings: tuple[str, ...],
    out_shardings: tuple[str, ...], donate: tuple[int, ...], x64: bool, commit: str | None,
    device_target: str | None, distributed: bool,
) -> None:
    """Compile MODULE:FUNCTION for the given argument specs into the cache.

    Prints the key, the sizes, the compile time and whether it was already cached.

    \b
    Examples:
      aot compile fixtures.models:tiny --arg f32[8] --arg f32[8]
      aot compile fixtures.models:mlp_forward --name mlp.forward \\
          --arg @fixtures.models:mlp_param_specs --arg f32[32,784]
      aot compile fixtures.models:allreduce --pmap i --arg f32[8,1024]
      aot compile fixtures.models:tiny --arg f32[8] --arg f32[8] --target tpu:v5e:1x1

    With --distributed, start it in every process of a multi-process job (--mesh over
    every process's devices): process 0 stores and reports.
    """
    options = lowering_values(
        args, kwargs, args_from, static, pmap_axis, mesh, in_shardings, out_shardings, donate, x64,
    ) | dict(name=name, device_target=device_target)
    with job_command(state, distributed, "compile") as role:
        _compile(state, function, commit, reports=role.reports, **options)


def _compile(state: State, function: str, commit: str | None, *, reports: bool, **options: object) -> None:
    from aot.signatures import Signature
    from aot.cache.index.refs import RefOrigin, default_commit
    from aot.cache.warmup.functions import compile_function
    from aot.errors import ManifestError

    device_target = options["device_target"]
    options["origin"] = RefOrigin("compile", commit=commit or default_commit())
    state.use_gpu_targets(device_target, create=True)  # type: ignore[arg-type]  # a fleet's captured GPUs
    if device_target is not None:
        from aot.targets import compile_only_here

        compile_only_here()
    with state.start_up():  # SQLAlchemy and JAX, whose backend the environment starts
        cache = state.cache(create=True)
        if device_target is None:  # a target's compile never opens this host's device
            cache.environment  # noqa: B018 - the compile needs it; computed with the imports
    try:
        result = compile_function(cache, function, **options)  # type: ignore[arg-type]
    except ManifestError as exc:  # inconsistent options: a usage error
        raise click.UsageError(getattr(exc, "problem", str(exc))) from None
    if not reports:  # another process of a multi-process job: process 0 reports
        return
    if state.json:
        echo_json(result.to_dict())
        return
    entry = result.entry
    if result.hit:
        click.echo(f"hit: {entry.name} was in the cache (no compile)")
    elif device_target is not None:
        click.echo(f"miss: compiled {entry.name} for {device_target} and stored it")
    elif entry.stored_size == 0 and state.read_only:
        click.echo(f"miss: compiled {entry.name} (not stored: the cache is read-only)")
    elif entry.exe_digest is None:
        click.echo(
            f"stored the symbolic program {entry.name} (portable HLO; compiled for each "
            "concrete shape when served)"
        )
    else:
        click.echo(f"miss: compiled and stored {entry.name}")
    click.echo(key_value([
        ("signature", Signature.from_manifest_json(entry.manifest, entry.signature).compact()),
        ("key", entry.key),
        ("size", f"{human_size(entry.raw_size)} ({human_size(entry.stored_size)} stored)"),
        ("compile", f"{entry.compile_seconds:.3f}s" + (" (when it was compiled)" if result.hit else "")),
        ("this run", f"{result.seconds:.3f}s"),
        ("cache", state.cache().display_location),
    ]))


@click.command("why", short_help="Explain a miss: the nearest entry and what differs.")
@click.argument("name", shell_complete=complete_entry_names)
@lowering_options
@click.option(
    "--function", "function", metavar="MODULE:FUNCTION",
    help="Also lower the function (with --mesh, shardings, --donate... as aot compile lowers "
    "it) and compare every program part (not just the signature).",
)
@click.option(
    "--manifest", metavar="MANIFEST.toml", shell_complete=complete_manifests,
    help="Explain NAME's entries of this warm-up manifest, each described and lowered exactly "
    "as aot warmup lowers it (its buckets, mesh, shardings, donation, target); NAME may be a "
    "label (mlp.forward[batch=8]). Takes none of the options that describe the request.",
)
@click.option(
    "--target", "device_target", metavar="PLATFORM:CHIP:TOPOLOGY",
    help="Explain for a replica on this accelerator, e.g. tpu:v5e:1x1: compare with its "
    "environment (needs libtpu, not the device) and lower --function for it ('host': this "
    "host's; with --manifest, instead of the manifest's targets). "
    "(--target MODULE:FUNCTION, the old spelling of --function, still works, with a warning.)",
)
@served_release_option
@pass_state
def why_command(
    state: State, name: str, args: tuple[str, ...], kwargs: tuple[str, ...], args_from: str | None,
    static: tuple[str, ...], pmap_axis: str | None, mesh: tuple[tuple[str, int], ...] | None,
    in_shardings: tuple[str, ...], out_shardings: tuple[str, ...], donate: tuple[int, ...], x64: bool,
    function: str | None, manifest: str | None, device_target: str | None, release: str | None,
) -> None:
    """Explain a miss: the nearest stored entry of NAME and which parts differ.

    Compares the input signature argument by argument (and, with --function or
    --manifest, every program fingerprint part: StableHLO, shardings, donation...) and
    the environment: this host's, or with --target that of a replica on that
    accelerator (would it hit?). With a release (--release, else AOT_RELEASE, else the
    cache's default, as aot.load chooses) a signature that the release's set lacks is a
    miss, naming the label. Exits 0 on a hit, 1 on a miss.

    \b
    Examples:
      aot why train.step --function model:train_step --arg @model:param_specs \\
          --arg f32[64,512]@data,None --mesh data=4 --donate 0 --target tpu:v5e:2x2
      aot why --manifest train.toml train.step
    """
    from aot.cache.warmup.functions import function_item
    from aot.cache.warmup.manifest import expand, items_named, load_manifest
    from aot.errors import ManifestError

    from aot.cache.warmup.manifest import HOST

    here = device_target is not None and device_target.strip().lower() == HOST  # this host's
    state.use_gpu_targets(None if here else device_target, manifest=manifest)  # a fleet's captured GPUs
    function, device_target = _function_and_target(function, None if here else device_target)
    lowering = lowering_values(
        args, kwargs, args_from, static, pmap_axis, mesh, in_shardings, out_shardings, donate, x64,
    )
    if manifest is not None:
        given = [flag for flag, value in _request_flags(lowering, function) if value]
        if given:
            raise click.UsageError(
                f"--manifest describes NAME's entries as aot warmup compiles them; give no "
                f"{', '.join(given)} with it"
            )
        loaded = load_manifest(manifest)
        if here:
            loaded = loaded.for_targets((HOST,))
        elif device_target is not None:
            loaded = loaded.for_targets((device_target,))
        items = items_named(expand(loaded), name, manifest)
    elif function is not None:
        try:
            items = [function_item(function, name=name, device_target=device_target, **lowering)]
        except ManifestError as exc:  # inconsistent options: a usage error
            raise click.UsageError(getattr(exc, "problem", str(exc))) from None
    else:
        items = []
    cache = state.cache()
    served = resolve_served_release(cache, release)
    # A target this host cannot compile for (no libtpu, no CUDA plugin of this jaxlib):
    # Error: and exit 1, as any failure to answer (not a usage error).
    if items:
        explanations = [cache.explain_item(item, release=served) for item in items]
    else:
        explanations = [_explain_signature(cache, name, lowering, device_target, served)]
    if state.json:
        shown = [e.to_dict() for e in explanations]
        echo_json(shown if manifest is not None else shown[0])
    else:
        for explanation in explanations:
            click.echo(explanation.describe())
    if not all(e.hit for e in explanations):
        click.get_current_context().exit(1)


def _request_flags(lowering: dict[str, Any], function: str | None) -> list[tuple[str, Any]]:
    """The options that describe a request, with their values (empty: not given)."""
    return [
        ("--arg", lowering["args"]), ("--kwarg", lowering["kwargs"]), ("--args-from", lowering["args_from"]),
        ("--static", lowering["static"]), ("--function", function), *_program_flags(lowering),
        ("--mesh", lowering["mesh"]), ("--x64", lowering["x64"]),
    ]


def _program_flags(lowering: dict[str, Any]) -> list[tuple[str, Any]]:
    """The options that change the program, not its input signature."""
    return [
        ("--pmap", lowering["pmap"]), ("--in-sharding", lowering["in_shardings"]),
        ("--out-sharding", lowering["out_shardings"]), ("--donate", lowering["donate"]),
    ]


def _explain_signature(
    cache: Any, name: str, lowering: dict[str, Any], device_target: str | None, release: str | None,
) -> Any:
    """``aot why`` without a function: the input signature (and the statics given)
    compared, with the specs resolved as aot compile resolves them (--mesh for
    sharded specs, --x64)."""
    import contextlib

    from aot.cache.warmup.functions import make_mesh
    from aot.cache.warmup.run import resolve_args

    given = [flag for flag, value in _program_flags(lowering) if value]
    if given:
        raise click.UsageError(
            f"{', '.join(given)} change{'s' if len(given) == 1 else ''} the program, not its input "
            "signature: give --function MODULE:FUNCTION to lower it and compare every part (or "
            "--manifest MANIFEST.toml to explain an entry as aot warmup compiles it)"
        )
    if lowering["x64"]:
        import jax

        x64: contextlib.AbstractContextManager[Any] = jax.enable_x64(True)
    else:
        x64 = contextlib.nullcontext()
    with x64:
        mesh = make_mesh(lowering["mesh"], device_target) if lowering["mesh"] is not None else None
        positional, keywords = resolve_args(lowering["args"], lowering["kwargs"], lowering["args_from"], mesh=mesh)
        # Keyword arguments' leaves follow the positional ones in sorted-name order; the
        # statics given are compared by name.
        statics = dict(lowering["static"]) if lowering["static"] else None
        return cache.explain(
            name, *positional, statics=statics, release=release, device_target=device_target, **keywords
        )


#: ``module.sub:attr``: what the old ``aot why --target`` took (a Python function).
_FUNCTION_SPELLING = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _function_and_target(function: str | None, device_target: str | None) -> tuple[str | None, str | None]:
    """``aot why``'s (--function, --target), the target parsed (tpu:v5e:1x1). A
    --target that is no device target but reads MODULE:FUNCTION is the old spelling of
    --function (before 'target' meant only an accelerator): accepted with a warning."""
    from aot.errors import DeviceTargetError
    from aot.targets import parse_target

    if device_target is None:
        return function, None
    try:
        return function, parse_target(device_target).name
    except DeviceTargetError as exc:
        # cuda:NAME has the shape of MODULE:FUNCTION: a GPU target's error is its own.
        if not _FUNCTION_SPELLING.match(device_target.strip()) or captured_target(device_target):
            raise click.BadParameter(str(exc), param_hint="'--target'") from None
    if function is not None:
        raise click.BadParameter(
            f"expected a device target such as tpu:v5e:1x1, got {device_target!r} with --function "
            f"{function}; give the function once, with --function", param_hint="'--target'",
        )
    click.echo(
        f"warning: --target MODULE:FUNCTION is now --function MODULE:FUNCTION (--target names a "
        f"device target, e.g. tpu:v5e:2x2); running as --function {device_target}", err=True,
    )
    return device_target.strip(), None

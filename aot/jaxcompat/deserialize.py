"""From XLA's serialized bytes to a ``jax.stages.Compiled``, and the custom-call
targets a fresh process must register before running one.

Wraps the jaxlib client's ``deserialize_executable``, the
construction of ``pxla.UnloadedMeshExecutable`` (a dataclass whose fields we fill from
the manifest) and of ``stages.Compiled``, and JAX's lazy initialisers of its LAPACK
(``jax._src.lax.linalg``, ``jax._src.lib.lapack``) and GPU solver kernels. JAX has no
public API to load an executable without the Python function it was traced from.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Sequence
from typing import Any

import jax
from jax._src import stages
from jax._src.interpreters import pxla

log = logging.getLogger(__name__)
# JAX's names of a GPU's platform: its GPU solver kernels serve each (a JAX fact, kept
# here with the release differences; aot.platforms.names maps them for everything else).
_GPU_PLATFORMS = frozenset({"cuda", "rocm", "gpu"})

#: Release difference "UnloadedMeshExecutable.auto_spmd_lowering": a required field of
#: JAX 0.9.x (dropped in 0.10.0), filled where the release has it. A loaded artifact is
#: never auto-sharded: its shardings are the compiled ones.
RELEASE_FIELDS: dict[str, Any] = {"auto_spmd_lowering": False}


@functools.cache
def _release_fields() -> dict[str, Any]:
    present = {f.name for f in dataclasses.fields(pxla.UnloadedMeshExecutable)}
    return {name: value for name, value in RELEASE_FIELDS.items() if name in present}


def deserialize_xla_executable(backend: Any, exe_bytes: bytes, devices: Any) -> Any:
    """XLA's executable from its bytes, onto ``devices`` (an ``xla_client.DeviceList``);
    raises what XLA raises (``XlaRuntimeError`` and friends)."""
    return backend.deserialize_executable(exe_bytes, devices)


def arg_infos(args: Sequence[Any]) -> list[Any]:
    """``stages.ArgInfo`` of flat inputs (objects with ``shape``, ``dtype``,
    ``weak_type`` and ``donated``)."""
    return [
        stages.ArgInfo(jax.core.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type), a.donated)
        for a in args
    ]


def load_compiled(
    xla_executable: Any,
    *,
    devices: Any,
    backend: Any,
    in_avals: Sequence[Any],
    in_shardings: Sequence[Any],
    out_avals: Sequence[Any],
    out_shardings: Sequence[Any],
    committed: bool,
    name: str,
    kept_var_idx: set[int],
    args: Sequence[Any],
    in_tree: Any,
    out_tree: Any,
    host_callbacks: Sequence[Any] = (),
    constants: Sequence[tuple[Any, Any]] = (),
) -> Any:
    """A ``jax.stages.Compiled`` around a deserialized XLA executable, as JAX's own
    ``Lowered.compile()`` would have built it for a program without effects or custom
    layouts (which artifacts refuse at lowering time); ``host_callbacks`` are those the
    executable was deserialized with (aot.callbacks); ``constants``, (array on its
    devices, aval) pairs, the constants JAX hoisted into its leading parameters: the
    ``Compiled`` passes them before the caller's inputs, as ``jax.jit`` does
    (``stages.CompiledCallParams.const_args``)."""
    if constants:
        values = [value for value, _ in constants]
        in_avals = [*(aval for _, aval in constants), *in_avals]
        in_shardings = [*(value.sharding for value in values), *in_shardings]
        kept_var_idx = set(range(len(values))) | {i + len(values) for i in kept_var_idx}
    unloaded = pxla.UnloadedMeshExecutable(
        xla_executable=xla_executable,
        device_list=devices,
        backend=backend,
        input_avals=list(in_avals),
        input_shardings=list(in_shardings),
        output_avals=list(out_avals),
        output_shardings=list(out_shardings),
        committed=committed,
        name=name,
        unordered_effects=[],
        ordered_effects=[],
        keepalive=[],
        host_callbacks=list(host_callbacks),
        kept_var_idx=kept_var_idx,
        mut=None,
        xla_in_layouts=[None] * len(in_avals),
        dispatch_in_layouts=[None] * len(in_avals),
        xla_out_layouts=[None] * len(out_avals),
        all_args_info=None,
        pgle_profiler=None,
        **_release_fields(),
    )
    args_info = in_tree.unflatten(arg_infos(args))
    return stages.Compiled(
        unloaded.load(), [value for value, _ in constants], args_info, out_tree, no_kwargs=False
    )


_custom_calls_ready: set[str] = set()
_custom_calls_lock = threading.Lock()
_lapack_needles: tuple[bytes, ...] | None = None


def lapack_targets() -> tuple[bytes, ...]:
    """What an executable that calls a LAPACK kernel of jaxlib names: ``lapack_``
    (``lapack_sgetrf_ffi``, ...) or one of jaxlib's other names for such kernels
    (``tridiagonal_solve_perturbed_ffi``), from jaxlib's own registrations."""
    global _lapack_needles
    if _lapack_needles is None:
        needles = {b"lapack_"}
        try:
            from jax._src.lib import lapack

            for targets in lapack.registrations().values():
                needles.update(
                    name.encode() for name, *_ in targets if not name.startswith("lapack_")
                )
        except Exception as exc:  # noqa: BLE001 - a jaxlib without them: the prefix alone
            log.debug("jaxlib's LAPACK registrations unavailable: %s", exc)
        _lapack_needles = tuple(sorted(needles))
    return _lapack_needles


def ensure_custom_call_targets(platform: str, exe_bytes: bytes | None = None) -> None:
    """Registers JAX's own custom-call targets for ``platform`` before an executable
    runs, as ``jax.export`` does before calling an exported program: XLA CPU programs
    using jnp.linalg call LAPACK kernels that JAX initialises lazily while lowering,
    and a serving process that never lowered anything would crash (SIGSEGV) on them.

    On CPU, initialising LAPACK imports ``scipy.linalg`` (most of the time to load a
    small executable), so it is done only for an executable whose serialized bytes
    name one of jaxlib's LAPACK targets (XLA resolves custom calls by those names;
    ``exe_bytes=None``: always). A JAX upgrade that stopped storing the names in plain
    bytes would show in tests/aot/test_rehydrate.py's fresh-process linalg test and
    the conformance suite's ``lapack`` group."""
    if platform in _custom_calls_ready:
        return
    if platform == "cpu" and exe_bytes is not None and not any(
        needle in exe_bytes for needle in lapack_targets()
    ):
        return
    with _custom_calls_lock:
        if platform in _custom_calls_ready:
            return
        try:
            from jax._src.lax import linalg

            if platform == "cpu":
                # Release difference "initialize_lapack": JAX 0.10+ has the initialiser
                # in linalg; 0.9.x calls jaxlib's when lowering a LAPACK call.
                initialize = getattr(linalg, "initialize_lapack", None)
                if initialize is None:
                    from jax._src.lib import lapack

                    initialize = lapack._lapack.initialize
                initialize()
            elif platform in _GPU_PLATFORMS:
                from jax._src.lib import gpu_solver

                gpu_solver.initialize_hybrid_kernels()
        except Exception as exc:  # noqa: BLE001 - a jaxlib without these kernels
            log.warning("could not initialise JAX's %s custom-call targets: %s", platform, exc)
        _custom_calls_ready.add(platform)

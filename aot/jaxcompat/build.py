"""Compiling and reading what JAX compiled: the private side of ``jax.stages``.

Wraps ``stages.Lowered._lowering`` (``pxla.MeshComputation``: its ``compile_args``,
device list and compiler options), ``stages.Compiled._executable`` (the loaded
``pxla.MeshExecutable`` and the ``UnloadedMeshExecutable`` it came from, whose avals,
shardings and kept arguments an artifact records), ``stages.Compiled._params`` and
``pxla.UnloadedMeshExecutable.from_hlo``. JAX offers no public way to these: the
public ``Compiled`` neither serializes nor says which arguments it kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax._src import stages
from jax._src.interpreters import pxla


def unloaded_executable(compiled: Any) -> Any | None:
    """The ``pxla.UnloadedMeshExecutable`` behind ``compiled`` (avals, shardings, kept
    arguments, devices, host callbacks); None for an executable JAX built otherwise."""
    return getattr(getattr(compiled, "_executable", None), "_unloaded_executable", None)


def built_unloaded_executable(compiled: Any) -> Any:
    """:func:`unloaded_executable` of a ``Compiled`` that ``jit(...).lower(...).compile()``
    built in this process, where JAX always keeps it (never None)."""
    unloaded = unloaded_executable(compiled)
    if unloaded is None:
        raise TypeError(f"{type(compiled).__name__} was not built by jit's lower().compile() in this process")
    return unloaded


def hoisted_constants(compiled: Any) -> Sequence[Any]:
    """The constants JAX hoisted out of the program into extra arguments: the leading
    flat parameters of the executable, before the caller's (JAX 0.12.1 hoists every
    closed-over array above ``jax_embedded_constants_max_bytes``; 0.10.2 embeds them
    unless ``jax_use_simplified_jaxpr_constants`` is set)."""
    return tuple(compiled._params.const_args)


def lowering_constants(lowered: Any) -> Sequence[Any]:
    """The constants ``lowered`` hoisted (what :func:`hoisted_constants` of its compile
    will be), known before compiling: ``pxla.MeshComputation.const_args``."""
    return tuple(getattr(lowered._lowering, "const_args", None) or ())


def serialize_compiled(compiled: Any) -> bytes:
    """XLA's serialized bytes of ``compiled`` (PJRT ``serialize_executable``)."""
    xla_executable = compiled._executable.xla_executable
    if not hasattr(xla_executable, "client"):  # compiled for a target (compile-only devices)
        return bytes(xla_executable.serialize())
    return bytes(xla_executable.client.serialize_executable(xla_executable))


def compile_args(lowered: Any) -> dict[str, Any]:
    """The keyword arguments JAX will compile ``lowered`` with (``global_in_avals``,
    ``global_out_avals``, ``committed``, shardings, ...)."""
    return lowered._lowering.compile_args


def lowered_devices(lowered: Any) -> tuple[Any, ...]:
    """The devices ``lowered`` was lowered for, in order."""
    return tuple(lowered._lowering._device_list)


def compile_uncached(lowered: Any, compiler_options: dict[str, Any] | None) -> Any:
    """``lowered.compile()`` without JAX's in-memory executable cache: a copy of the
    module (the cache is keyed by the module object) compiled as JAX would."""
    # Imports JAX's MLIR bindings, which serving never needs.
    from aot.jaxcompat.mlir import copy_module

    lowering = lowered._lowering
    module = copy_module(lowering.stablehlo())
    options = tuple((compiler_options or {}).items())
    executable = pxla.UnloadedMeshExecutable.from_hlo(
        lowering._name, module, **lowering.compile_args,
        compiler_options_kvs=lowering._compiler_options_kvs + options,
        device_list=lowering._device_list,
    )
    return stages.Compiled(
        executable, lowering.const_args, lowered.args_info, lowered.out_tree, lowered._no_kwargs,
        lowered._in_types, lowered._out_types,
    )

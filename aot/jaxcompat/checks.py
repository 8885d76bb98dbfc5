"""What a deserialized XLA executable takes and returns, as XLA shows it.

Wraps ``jax._src.lib.hlo`` (``HloPrintOptions``, to print the HLO module cheaply),
``xla_client.Shape`` and ``jax._src.core.physical_aval`` (how an array of a dtype is
laid out: a typed key is its key data), and the loaded executable's
``hlo_modules``/``get_*_shardings``/``get_output_memory_kinds``. jaxlib offers no
cheaper way to an executable's entry shapes: ``get_parameter_layouts`` gives
layouts without shapes, ``HloComputation`` neither shapes nor which one is the
entry, and the module's proto costs more to serialize than its text.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax._src import core
from jax._src.lib import xla_client as xc

# Release difference "HloPrintOptions": jaxlib 0.10.1+ has it in its ``_hlo`` module
# (``jax._src.lib.hlo``), 0.10.0 and older in ``_jax``.
try:
    from jax._src.lib import hlo as _hlo
except ImportError:
    from jax._src.lib import _jax as _hlo

# What the module's text need not show: only its first line (the entry computation's
# layout) is read, and XLA prints that line whatever these say. Each one left on grows
# the text of every instruction.
UNPRINTED_OPTIONS = (
    "print_metadata", "print_backend_config", "print_large_constants",
    "print_operand_shape", "print_result_shape", "print_operand_names", "print_ids",
    "print_extra_attributes", "print_control_dependencies", "print_percent",
    "print_program_shape", "include_layout_in_shapes",
)


def print_options() -> Any:
    """``HloPrintOptions`` that print little more than the entry layout; None where
    jaxlib has none."""
    options_class = getattr(_hlo, "HloPrintOptions", None)
    if options_class is None:
        return None
    options = options_class.short_parsable()
    for name in UNPRINTED_OPTIONS:
        if hasattr(options, name):
            setattr(options, name, False)
    return options


def hlo_module_header(xla_executable: Any) -> str | None:
    """The first line of the executable's HLO module text (its entry computation's
    layout); None for an executable without exactly one module to show. The module is
    printed with every option that does not change that line switched off."""
    try:
        modules = xla_executable.hlo_modules()
        if len(modules) != 1:
            return None
        options = print_options()
        text = modules[0].to_string(options) if options is not None else modules[0].to_string()
    except Exception:  # noqa: BLE001 - an executable without an HLO module to show
        return None
    return text.split("\n", 1)[0]


def physical_shape_text(shape: tuple[int, ...], dtype: Any) -> str:
    """How XLA shows an array of ``dtype`` (``s4[2,3]{1,0}`` for int4): a typed-key
    array is its key data, ``key<fry>[4]`` is ``u32[4,2]``."""
    aval = core.physical_aval(jax.core.ShapedArray(tuple(shape), dtype))
    return str(xc.Shape.array_shape(np.dtype(aval.dtype), tuple(aval.shape)))


def parameter_shardings(xla_executable: Any) -> list[Any] | None:
    """The ``OpSharding`` of each parameter XLA compiled for; None where the
    backend does not report them."""
    try:
        shardings = xla_executable.get_parameter_shardings()
    except Exception:  # noqa: BLE001 - not every backend reports shardings
        return None
    return list(shardings) if shardings else None


def output_shardings(xla_executable: Any) -> list[Any] | None:
    """The ``OpSharding`` of each output (or one for the root tuple); None where the
    backend does not report them."""
    try:
        shardings = xla_executable.get_output_shardings()
    except Exception:  # noqa: BLE001 - not every backend reports shardings
        return None
    return list(shardings) if shardings else None


def output_memory_kinds(xla_executable: Any) -> list[str | None]:
    """The memory kind of each output; empty where the backend does not report them."""
    try:
        return list(xla_executable.get_output_memory_kinds()[0])
    except Exception:  # noqa: BLE001 - not every backend reports memory kinds
        return []

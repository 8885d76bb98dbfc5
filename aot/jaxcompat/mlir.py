"""StableHLO modules in an MLIR context: JAX's ``mlir`` interpreter helpers and its
bundled MLIR Python bindings (``jax._src.interpreters.mlir``, ``jax._src.lib.mlir.ir``).

Used to copy a module (so that JAX's in-memory compile cache, keyed by the module
object, does not answer) and to print a stored module without source locations.
"""

from __future__ import annotations

from typing import Any

from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir


def copy_module(module: Any) -> Any:
    """A new ``ir.Module`` equal to ``module``, in ``module``'s context."""
    with module.context:
        return ir.Module.parse(mlir.module_to_bytecode(module))


def text_without_locations(text: str) -> str:
    """StableHLO ``text`` printed again without its ``loc(...)`` debug information."""
    with mlir.make_ir_context():
        return str(ir.Module.parse(text).operation.get_asm(enable_debug_info=False))

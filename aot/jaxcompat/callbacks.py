"""Host callbacks of a lowered program, and XLA executables loaded with them.

Wraps the closures JAX builds while lowering a callback primitive
(``callback.emit_python_callback``'s ``_wrapped_callback`` over
``pure_callback_lowering``'s ``_callback`` over a ``callback._FlatCallback``), found in
``stages.Lowered._lowering.compile_args["host_callbacks"]`` in the order of the
``index`` attribute of the ``xla_ffi_python_cpu_callback`` custom calls, and the
``host_callbacks`` parameter of the jaxlib client's ``deserialize_executable``. JAX has
no public way to learn which Python function a compiled program calls back, nor to
load a serialized executable with callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LoweredCallback:
    """One host callback of a lowered program: the primitive's Python function (None
    when JAX built the callback otherwise), its argument structure and result avals."""

    function: Callable[..., Any] | None
    in_tree: Any
    result_avals: tuple[Any, ...]
    description: str


def _cells(fn: Any) -> dict[str, Any]:
    code = getattr(fn, "__code__", None)
    closure = getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, closure)}


def pure_callback_function(params: dict[str, Any]) -> Callable[..., Any] | None:
    """The user's function of a ``pure_callback`` equation (its ``_FlatCallback``)."""
    return getattr(params.get("callback"), "callback_func", None)


def lowered_callbacks(lowered: Any) -> tuple[LoweredCallback, ...]:
    """The host callbacks ``lowered`` compiles with, in the order of their index."""
    out = []
    for wrapped in lowered._lowering.compile_args.get("host_callbacks", ()) or ():
        outer = _cells(wrapped)
        inner = outer.get("callback")
        flat = _cells(inner).get("callback")
        function = getattr(flat, "callback_func", None)
        in_tree = getattr(flat, "in_tree", None)
        primitive = getattr(getattr(inner, "__code__", None), "co_qualname", "?")
        described = (
            f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', '?')}"
            if function is not None else f"a host callback ({primitive})"
        )
        if not primitive.startswith("pure_callback_lowering"):
            function = None  # io_callback / debug_callback: effects, never bound
        out.append(LoweredCallback(
            function, in_tree, tuple(outer.get("result_avals", ())), described,
        ))
    return tuple(out)


def deserialize_with_callbacks(
    backend: Any, exe_bytes: bytes, devices: Any, host_callbacks: Sequence[Callable[..., Any]]
) -> Any:
    """XLA's executable from its bytes with ``host_callbacks`` bound to the indices of
    its callback custom calls (as ``Lowered.compile()`` bound JAX's own)."""
    return backend.deserialize_executable(exe_bytes, devices, None, host_callbacks=list(host_callbacks))

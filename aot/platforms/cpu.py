"""The CPU: no device targets (a CPU compiles where it runs), its key's ISA part, and
its compile step (plain)."""

from __future__ import annotations

import platform as _host
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from aot.platforms.tuning import Tuning

__all__ = [
    "CAPTURED_CONFIGS", "COMPILER_ARGS", "DEVICELESS", "NAME", "chip_count", "compile_step", "cpu_isa_features",
    "environment_parts", "hint", "known_targets", "lowering_error", "parse", "target_name", "target_text",
    "topology_devices",
]

NAME = "cpu"
#: Targets of this platform are named by captured configs (``cuda:NAME``): no.
CAPTURED_CONFIGS = False
#: Compiled for without the device (a topology of compile-only devices): no.
DEVICELESS = False
#: The key part and environment variable of the compiler's own flags: none.
COMPILER_ARGS: tuple[str, str] | None = None


@lru_cache(maxsize=1)
def cpu_isa_features() -> str:
    """The host CPU's ISA feature flags, sorted; XLA's CPU backend compiles for them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return " ".join(sorted(set(value.split())))
    except OSError:
        pass
    return f"{_host.machine()} {_host.processor()}".strip()


def environment_parts(devices: Sequence[Any]) -> dict[str, str]:
    return {"cpu_isa": cpu_isa_features()}


def parse(text: str, fields: list[str], hosts: str) -> tuple[str, str, tuple[int, int, int]] | None:
    """None: a CPU is no device target (compile where it runs)."""
    return None


def known_targets() -> str:
    return ""


def target_name(parts: Mapping[str, str]) -> str | None:
    return None


def compile_step(devices: Sequence[Any], options: dict[str, Any] | None, compile_fn: Callable[..., Any], name: str) -> tuple[Any, Tuning | None]:
    return compile_fn(options), None


def target_text(chip: str, topology: str, host_bounds: tuple[int, int, int]) -> str:
    raise AssertionError("a CPU is no device target")


def chip_count(topology: str, host_bounds: tuple[int, int, int]) -> int:
    raise AssertionError("a CPU is no device target")


def topology_devices(chip: str, topology: str, host_bounds: tuple[int, int, int], name: str) -> tuple[Any, ...]:
    raise AssertionError("a CPU is no device target")


def hint(text: str) -> str | None:
    return None


def lowering_error(name: str, target: str, exc: BaseException) -> Exception | None:
    """None: a lowering's failure for this platform's targets is JAX's own."""
    return None

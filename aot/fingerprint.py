"""Program and environment fingerprints, built from named parts.

Each part is a short, human-readable value (a version, a count, a list of flags) or,
for large inputs such as the StableHLO text, a sha256 of it. A fingerprint's digest is
the sha256 of its canonical JSON, so two fingerprints can be compared part by part to
say *why* they differ (``aot why``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aot.device import accelerator_runtime
from aot.digests import canonical_json, parts_digest, sha256_hex, sorted_parts
from aot.errors import DeviceUnavailableError
from aot.env_record import read_parts, remember
from aot.environment import (
    ENVIRONMENT_KIND,
    environment_parts,
    relevant_xla_flags,
    xla_flags_outside_key,
)
from aot.platforms.cpu import cpu_isa_features

log = logging.getLogger(__name__)

__all__ = [
    "Fingerprint",
    "PartDifference",
    "canonical_json",
    "combined_key",
    "cpu_isa_features",
    "describe_differences",
    "environment_fingerprint",
    "environment_parts",
    "is_digest",
    "known_environment",
    "program_fingerprint",
    "recorded_environment",
    "UNKNOWN_ENVIRONMENT_NOTE",
    "relevant_xla_flags",
    "sha256_hex",
    "xla_flags_outside_key",
]


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A named set of parts and the sha256 over them."""

    kind: str
    parts: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, kind: str, parts: Mapping[str, str]) -> Fingerprint:
        return cls(kind, sorted_parts(parts))

    @property
    def digest(self) -> str:
        return parts_digest(self.kind, self.parts)

    def as_dict(self) -> dict[str, str]:
        return dict(self.parts)

    def diff(self, actual: Fingerprint) -> tuple[PartDifference, ...]:
        """Parts of ``self`` (expected) that differ in ``actual``."""
        mine, theirs = self.as_dict(), actual.as_dict()
        names = sorted(name for name in set(mine) | set(theirs) if mine.get(name) != theirs.get(name))
        if "platform" in names and "cpu_isa" in names:
            # Another platform (a TPU entry, a CPU host): the CPU's features, recorded
            # for CPU executables only, say nothing more.
            names.remove("cpu_isa")
        if not names:
            return ()
        return tuple(PartDifference(name, mine.get(name), theirs.get(name)) for name in names)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "digest": self.digest, "parts": self.as_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        return cls.of(str(data["kind"]), dict(data["parts"]))


@dataclass(frozen=True, slots=True)
class PartDifference:
    """One named part that differs between two fingerprints."""

    part: str
    expected: str | None
    actual: str | None

    def describe(self) -> str:
        expected, actual = self.expected, self.actual
        if self.part == "cpu_isa" and expected is not None and actual is not None:
            missing = sorted(set(expected.split()) - set(actual.split()))
            extra = sorted(set(actual.split()) - set(expected.split()))
            return (
                f"cpu_isa: stored artifact needs {missing or 'nothing more'}, "
                f"this CPU adds {extra or 'nothing'}"
            )
        # Long values that share a long beginning (shardings' JSON over one mesh) are
        # shown from a little before where they part, else both would read the same.
        start = 0
        if expected is not None and actual is not None and max(len(expected), len(actual)) > _LIMIT:
            common = len(os.path.commonprefix([expected, actual]))
            start = max(0, common - 20) if common > _LIMIT // 2 else 0
        return f"{self.part} {_short(expected, start)} != {_short(actual, start)}"

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "expected": self.expected, "actual": self.actual}


_LIMIT = 80


def _short(value: str | None, start: int = 0, limit: int = _LIMIT) -> str:
    """One line (libtpu's platform version has several) of at most ``limit``
    characters, from ``start`` (then led by ``...``)."""
    if value is None:
        return "(absent)"
    value = "; ".join(value.splitlines()) if "\n" in value else value
    if start:
        value = "..." + value[start:]
    return value if len(value) <= limit else value[: limit - 3] + "..."


def combined_key(program: Fingerprint, environment: Fingerprint) -> str:
    """The artifact key: one digest over both fingerprints."""
    return sha256_hex(f"{program.digest}:{environment.digest}")


def environment_fingerprint(backend: str | None = None, devices: Sequence[Any] | None = None) -> Fingerprint:
    """This host's environment fingerprint, or that of a device target's ``devices``."""
    parts = environment_parts(backend, devices)
    if backend is None and devices is None:
        remember(parts)  # for listing commands that run without JAX (aot.env_record)
    return Fingerprint.of(ENVIRONMENT_KIND, parts)


def recorded_environment() -> Fingerprint | None:
    """This host's environment fingerprint as a process with JAX last computed it under
    the same versions, variables and boot (:mod:`aot.env_record`), without importing
    JAX; None when there is no such record. For listing and filtering only: loading
    and compiling always compute :func:`environment_fingerprint`."""
    parts = read_parts()
    return None if parts is None else Fingerprint.of(ENVIRONMENT_KIND, parts)


#: Said where this host's environment is unknown (:func:`known_environment` gave None).
UNKNOWN_ENVIRONMENT_NOTE = (
    "this host's environment is not recorded yet, so no entry is shown as 'this': any aot "
    "command that opens the device while it is free records it (aot doctor, aot.load, a compile)"
)


def known_environment(compute: Callable[[], Fingerprint]) -> Fingerprint | None:
    """This host's environment fingerprint without opening a device, for commands that
    only read (listing, verify, why): ``compute()`` (the real one) when this process's
    JAX backend is already up; else the per-host record (:mod:`aot.env_record`); else,
    on a CPU-only host (nothing there can be held), ``compute()``; else None: unknown,
    because this host has a device (a TPU's device files, a CUDA/ROCm plugin,
    ``JAX_PLATFORMS``: :func:`aot.device.accelerator_runtime`), and starting it could
    open, or wait for, a device another process holds."""
    from aot.jaxcompat.runtime import backend_started

    if backend_started():
        return compute()
    recorded = recorded_environment()
    if recorded is not None:
        return recorded
    runtime = accelerator_runtime()
    if runtime is not None:
        log.debug("this host's environment is not recorded and %s is installed: not opening the device", runtime)
        return None
    try:
        return compute()
    except DeviceUnavailableError as exc:  # a CPU backend that cannot start: unknown
        log.info("this host's environment is unknown: %s", exc)
        return None


def program_fingerprint(parts: Mapping[str, str]) -> Fingerprint:
    return Fingerprint.of("program", parts)


def describe_differences(diffs: Iterable[PartDifference]) -> str:
    return "; ".join(d.describe() for d in diffs)


#: The environment parts a JAX release changes (the platform version is the jaxlib's).
RELEASE_PARTS = frozenset({"jax", "jaxlib", "platform_version"})


def release_only(diffs: Iterable[PartDifference]) -> bool:
    """Whether ``diffs`` are another JAX release's and nothing else (the same device and
    flags): an entry a warm-up of this release replaces, in the same label."""
    parts = {d.part for d in diffs}
    return bool(parts & {"jax", "jaxlib"}) and parts <= RELEASE_PARTS


def is_digest(text: str) -> bool:
    return bool(re.match(r"^[0-9a-f]{64}$", text))  # compiled on first use, not at import


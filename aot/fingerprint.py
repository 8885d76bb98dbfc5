"""Program and environment fingerprints, built from named parts.

Each part is a short, human-readable value (a version, a count, a list of flags) or,
for large inputs such as the StableHLO text, a sha256 of it. A fingerprint's digest is
the sha256 of its canonical JSON, so two fingerprints can be compared part by part to
say *why* they differ (``aot why``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from aot.env_record import read_parts, remember

# XLA flags that cannot change the compiled executable, decided flag by flag from
# JAX's own list (jax/_src/cache_key.py, xla_flags_to_exclude_from_cache_key). They are
# left out of the environment fingerprint (setting XLA_FLAGS=--xla_dump_to=... to debug
# must not make every stored entry miss) and shown by `aot why` / `aot doctor`.
_FLAGS_OUTSIDE_KEY = frozenset({
    # Dumping writes files next to the compilation; the executable is the same.
    "--xla_dump_to",
    "--xla_dump_hlo_as_text",
    "--xla_dump_hlo_as_long_text",
    "--xla_dump_hlo_as_proto",
    "--xla_dump_hlo_as_dot",
    "--xla_dump_hlo_as_html",
    "--xla_dump_hlo_as_url",
    "--xla_dump_hlo_module_re",
    "--xla_dump_hlo_pass_re",
    "--xla_dump_hlo_pipeline_re",
    "--xla_dump_hlo_snapshots",
    "--xla_dump_fusion_visualization",
    "--xla_dump_max_hlo_modules",
    "--xla_dump_module_metadata",
    "--xla_dump_compress_protos",
    "--xla_dump_include_timestamp",
    "--xla_dump_disable_metadata",
    # Covered by the `device_count` and `topology` parts.
    "--xla_force_host_platform_device_count",
    # Reporting of TPU silent-data-corruption checks (metrics, callbacks, logging);
    # whether the checker runs is a different flag, which stays in the key.
    "--xla_tpu_sdc_checker_streamz_metric",
    "--xla_tpu_sdc_checker_enable_sdc_event_callbacks",
    "--xla_tpu_sdc_checker_enable_coresweep_ng_callbacks",
    "--xla_tpu_sdc_checker_no_logging_if_callbacks_are_present",
})
# JAX also leaves out these two; they stay in our key because they can change the
# code: --xla_gpu_cuda_data_dir picks the CUDA toolkit (ptxas, libdevice) that builds
# the kernels, and --xla_gpu_experimental_autotune_cache_mode decides whether stored
# autotuning results choose them.
_FLAGS_KEPT_DESPITE_JAX = ("--xla_gpu_cuda_data_dir", "--xla_gpu_experimental_autotune_cache_mode")


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A named set of parts and the sha256 over them."""

    kind: str
    parts: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, kind: str, parts: Mapping[str, str]) -> Fingerprint:
        return cls(kind, tuple(sorted((str(k), str(v)) for k, v in parts.items())))

    @property
    def digest(self) -> str:
        return _digest(self.kind, self.parts)

    def as_dict(self) -> dict[str, str]:
        return dict(self.parts)

    def diff(self, actual: Fingerprint) -> tuple[PartDifference, ...]:
        """Parts of ``self`` (expected) that differ in ``actual``."""
        mine, theirs = self.as_dict(), actual.as_dict()
        names = sorted(name for name in set(mine) | set(theirs) if mine.get(name) != theirs.get(name))
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
        return f"{self.part} {_short(expected)} != {_short(actual)}"

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "expected": self.expected, "actual": self.actual}


def _short(value: str | None, limit: int = 80) -> str:
    if value is None:
        return "(absent)"
    return value if len(value) <= limit else value[: limit - 3] + "..."


@lru_cache(maxsize=256)
def _digest(kind: str, parts: tuple[tuple[str, str], ...]) -> str:
    """A fingerprint's digest, computed once per fingerprint (a load asks for the
    same few several times: the manifest's key check, the environment's row filter)."""
    return sha256_hex(canonical_json({"kind": kind, "parts": dict(parts)}))


def combined_key(program: Fingerprint, environment: Fingerprint) -> str:
    """The artifact key: one digest over both fingerprints."""
    return sha256_hex(f"{program.digest}:{environment.digest}")


# ---------------------------------------------------------------- environment


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
    return f"{platform.machine()} {platform.processor()}".strip()


def _flag_name(flag: str) -> str:
    return flag.partition("=")[0]


def relevant_xla_flags(flags: str | None = None) -> str:
    """The XLA flags that can change the executable (the ``xla_flags`` part), sorted."""
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    kept = [f for f in flags.split() if _flag_name(f) not in _FLAGS_OUTSIDE_KEY]
    return " ".join(sorted(kept))


_COVERED_BY_PARTS = frozenset({"--xla_force_host_platform_device_count"})


def xla_flags_outside_key(flags: str | None = None) -> str:
    """The XLA flags set here that are in no part of the key (they cannot change the
    executable); the device count is not one of them: its own part covers it."""
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    return " ".join(sorted(
        f for f in flags.split()
        if _flag_name(f) in _FLAGS_OUTSIDE_KEY and _flag_name(f) not in _COVERED_BY_PARTS
    ))


def _topology(devices: Sequence[Any]) -> str:
    parts = []
    for d in devices:
        coords = getattr(d, "coords", None)
        core = getattr(d, "core_on_chip", None)
        extra = f"@{tuple(coords)}" if coords is not None else ""
        extra += f"/{core}" if core is not None else ""
        parts.append(f"{d.id}{extra}")
    text = ",".join(parts)
    return text if len(text) <= 200 else "sha256:" + sha256_hex(text)


def environment_parts(backend: str | None = None) -> dict[str, str]:
    """The parts of the environment that decide whether an executable can run here."""
    import jax  # here, not at module level: listing commands use this module without JAX
    import jaxlib

    devices = jax.devices(backend)
    first = devices[0]
    client = first.client
    parts = {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "platform": first.platform,
        "platform_version": str(client.platform_version),
        "device_kind": first.device_kind,
        "device_count": str(len(devices)),
        "process_count": str(jax.process_count()),
        "topology": _topology(devices),
        "x64": str(bool(jax.config.jax_enable_x64)).lower(),
        "xla_flags": relevant_xla_flags(),
    }
    if first.platform == "cpu":
        parts["cpu_isa"] = cpu_isa_features()
    return parts


def environment_fingerprint(backend: str | None = None) -> Fingerprint:
    parts = environment_parts(backend)
    if backend is None:
        remember(parts)  # for listing commands that run without JAX (aot.env_record)
    return Fingerprint.of("environment", parts)


def recorded_environment() -> Fingerprint | None:
    """This host's environment fingerprint as a process with JAX last computed it under
    the same versions, variables and boot (:mod:`aot.env_record`), without importing
    JAX; None when there is no such record. For listing and filtering only: loading
    and compiling always compute :func:`environment_fingerprint`."""
    parts = read_parts()
    return None if parts is None else Fingerprint.of("environment", parts)


def program_fingerprint(parts: Mapping[str, str]) -> Fingerprint:
    return Fingerprint.of("program", parts)


def describe_differences(diffs: Iterable[PartDifference]) -> str:
    return "; ".join(d.describe() for d in diffs)


def is_digest(text: str) -> bool:
    return bool(re.match(r"^[0-9a-f]{64}$", text))  # compiled on first use, not at import


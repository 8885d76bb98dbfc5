"""The exception hierarchy: every error jax-aot raises on purpose is an AotError.

Messages say what happened, quote the expected and the received values, and say
what to do about it.
"""

from __future__ import annotations


class AotError(Exception):
    """Base class of every error raised by jax-aot."""


class SpecError(AotError, ValueError):
    """A spec string or spec pytree could not be parsed."""


class UsageError(AotError, ValueError):
    """A call's arguments contradict each other (``aot.load(lazy=True, background=True)``)."""


class AvalMismatchError(AotError, TypeError):
    """Inputs do not match the avals (shape, dtype, structure, sharding) compiled for."""

    def __init__(self, message: str, mismatches: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.mismatches = mismatches


class SignatureNotFoundError(AotError, LookupError, TypeError):
    """No stored executable matches the input signature of a call.

    Also a ``TypeError``, as ``jax.jit``'s compiled functions raise for arguments of
    other shapes or dtypes."""

    def __init__(self, message: str, available: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.available = available


class ReleaseNotFoundError(SignatureNotFoundError):
    """``aot.load(name, release=LABEL)`` cannot serve the release: no such label, no
    member of ``name`` in it, or a member signature that cannot be served here."""


class IncompatibleEnvironmentError(AotError):
    """An artifact was built for another environment (jaxlib, devices, CPU, format)."""

    def __init__(self, message: str, differences: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.differences = differences


class ExportWindowError(IncompatibleEnvironmentError):
    """An entry of another JAX release has no executable for this one, and its portable
    HLO is outside what this release's ``jax.export`` can call (its compatibility
    window): it must be compiled from its code on this release."""


class CorruptArtifactError(AotError):
    """Stored bytes do not match their digest, or a manifest cannot be read."""


class UnsupportedComputationError(AotError):
    """The function cannot be served from an artifact (host callbacks, effects, ...)."""


class SymbolicShapeError(UnsupportedComputationError):
    """A program cannot be lowered for symbolic shapes (says which dimension or
    constraint), or symbolic dimensions from incompatible scopes were mixed."""


class IntegrityError(AotError):
    """A signature over a manifest is missing or does not verify."""


class CacheError(AotError):
    """The cache cannot do what was asked (unreachable index, bad location, ...)."""


class ReadOnlyCacheError(CacheError, PermissionError):
    """A write was attempted on a cache opened read-only."""


class ArtifactNotFoundError(AotError, KeyError):
    """No artifact with this key or name is stored."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class TargetError(AotError, LookupError):
    """A ``module:attribute`` target cannot be imported or found."""


class DeviceTargetError(AotError, ValueError):
    """A device target (``tpu:v5e:2x2``) is unknown, or cannot be compiled for here
    (no libtpu), or an entry compiled for one was asked to run on this host."""


class ManifestError(AotError, ValueError):
    """A warmup manifest (TOML) is malformed."""


class PytreeNodeError(UnsupportedComputationError):
    """A pytree node recorded in an artifact cannot be rebuilt in this process."""

    def __init__(self, message: str, node: str = "") -> None:
        super().__init__(message)
        self.node = node


class BlobLocationError(CacheError):
    """A client's blob location (or compression, format) contradicts what the shared
    cache recorded about itself when it was created."""


class DeviceUnavailableError(AotError, RuntimeError):
    """JAX could not start the backend of this host's device (no device found, a
    driver problem): the command needed it. Also a ``RuntimeError``, as JAX raises."""


class DeviceBusyError(DeviceUnavailableError):
    """The device (a TPU chip) is held by another process; the command needed it.
    ``pid`` names the holder when it is known."""

    def __init__(self, message: str, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


class MetricsError(AotError, RuntimeError):
    """The metrics exporter cannot start: ``prometheus_client`` is not installed
    (``pip install 'jax-aot[metrics]'``), ``AOT_METRICS_PORT`` is not a port, or the
    port is taken."""


class SliceError(AotError, RuntimeError):
    """A process of a multi-process job (a pod slice under ``jax.distributed``) could not
    get the entry another process was compiling for the slice: that process failed
    (its error is quoted), died, or did not finish within ``AOT_SLICE_WAIT_SECONDS``.
    ``key`` is the entry's artifact key, ``process`` the compiling process."""

    def __init__(self, message: str, key: str = "", process: int | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.process = process


class SliceTimeoutError(SliceError, TimeoutError):
    """The compiling process of the slice did not publish the entry within
    ``AOT_SLICE_WAIT_SECONDS`` (it froze, or its compile is longer than the bound)."""


class DistributedJobError(AotError, RuntimeError):
    """A multi-process job (``jax.distributed``) could not start, or one of its
    processes failed, died or gave no answer within the bound
    (``AOT_DISTRIBUTED_TIMEOUT``): every process of the job reports it."""


class UnsupportedJaxError(AotError, RuntimeError):
    """The installed jax or jaxlib is not a release jax-aot supports (raised at
    ``import aot``; :mod:`aot.jaxcompat.versions` holds the range)."""

    def __init__(self, message: str, installed: tuple[tuple[str, str | None], ...] = ()) -> None:
        super().__init__(message)
        self.installed = installed


class GpuCompilerMissingError(DeviceTargetError):
    """A GPU target (``cuda:h200``) was asked for, and the CUDA plugin of JAX that
    compiles for it (with ptxas) is not installed here: ``pip install 'jax-aot[cuda12]'``."""


class TargetCaptureError(DeviceTargetError):
    """``aot target capture`` could not record this host's GPU (no GPU here, a config
    file that is not a GPU target config, an autotune results file that is not XLA's)."""

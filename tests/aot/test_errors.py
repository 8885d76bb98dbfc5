"""The exception hierarchy: every deliberate error is an AotError, and the builtin it acts as."""

from __future__ import annotations

import pytest

import aot
from aot import errors

HIERARCHY = {
    aot.SpecError: (ValueError,),
    aot.AvalMismatchError: (TypeError,),
    # A TypeError too: jax.jit's compiled functions raise one for other shapes/dtypes.
    aot.SignatureNotFoundError: (LookupError, TypeError),
    # A release that cannot serve a name is a signature the caller asked for and lacks.
    aot.ReleaseNotFoundError: (aot.SignatureNotFoundError,),
    aot.IncompatibleEnvironmentError: (),
    # Another JAX release's portable HLO this release cannot call: an environment, not corruption.
    aot.ExportWindowError: (aot.IncompatibleEnvironmentError,),
    aot.CorruptArtifactError: (),
    aot.UnsupportedComputationError: (),
    aot.SymbolicShapeError: (aot.UnsupportedComputationError,),
    aot.PytreeNodeError: (aot.UnsupportedComputationError,),
    aot.IntegrityError: (),
    aot.CacheError: (),
    aot.ReadOnlyCacheError: (aot.CacheError, PermissionError),
    aot.BlobLocationError: (aot.CacheError,),
    aot.MetricsError: (RuntimeError,),
    aot.ArtifactNotFoundError: (KeyError,),
    aot.ManifestError: (ValueError,),
    aot.TargetError: (LookupError,),
    aot.UsageError: (ValueError,),
    # RuntimeErrors too, as JAX raises when its backend cannot start.
    aot.DeviceUnavailableError: (RuntimeError,),
    aot.DeviceBusyError: (aot.DeviceUnavailableError, RuntimeError),
    aot.DeviceTargetError: (ValueError,),
    # GPU targets: no CUDA plugin to compile with; a capture that cannot record the GPU.
    aot.GpuCompilerMissingError: (aot.DeviceTargetError, ValueError),
    aot.TargetCaptureError: (aot.DeviceTargetError, ValueError),
    # A process of a multi-process job that could not get its slice's entry.
    aot.SliceError: (RuntimeError,),
    aot.SliceTimeoutError: (aot.SliceError, TimeoutError),
    # A multi-process job that cannot start, or whose process failed (RuntimeError, as JAX raises).
    aot.DistributedJobError: (RuntimeError,),
    # A jax or jaxlib outside the supported range, refused at `import aot`.
    aot.UnsupportedJaxError: (RuntimeError,),
}


@pytest.mark.parametrize("cls", list(HIERARCHY), ids=lambda c: c.__name__)
def test_every_error_is_an_aot_error_and_its_builtin(cls):
    assert issubclass(cls, aot.AotError)
    for base in HIERARCHY[cls]:
        assert issubclass(cls, base)
    assert getattr(errors, cls.__name__) is cls
    assert cls.__name__ in aot.__all__


def test_every_public_error_is_listed():
    public = {
        name for name in dir(errors)
        if isinstance(getattr(errors, name), type) and issubclass(getattr(errors, name), Exception)
    }
    assert public == {c.__name__ for c in HIERARCHY} | {"AotError"}


def test_aval_mismatch_carries_its_mismatches():
    exc = aot.AvalMismatchError("f: bad", ("x: expected f32[2], got f32[3]",))
    assert exc.mismatches == ("x: expected f32[2], got f32[3]",)
    assert str(exc) == "f: bad"
    assert aot.AvalMismatchError("m").mismatches == ()


def test_incompatible_environment_carries_its_differences():
    exc = aot.IncompatibleEnvironmentError("m", ("jaxlib 0.10.2 != 0.10.1",))
    assert exc.differences == ("jaxlib 0.10.2 != 0.10.1",)


def test_signature_not_found_lists_what_exists():
    exc = aot.SignatureNotFoundError("m", ("f32[8,784]", "f32[32,784]"))
    assert exc.available == ("f32[8,784]", "f32[32,784]")


def test_artifact_not_found_message_is_not_quoted():
    # KeyError would repr() its message: KeyError('no such key') prints with quotes.
    exc = aot.ArtifactNotFoundError("no artifact with key abc")
    assert str(exc) == "no artifact with key abc"
    with pytest.raises(KeyError):
        raise exc


def test_one_except_clause_catches_everything_deliberate():
    caught = []
    for cls in HIERARCHY:
        try:
            raise cls("boom")
        except aot.AotError as exc:
            caught.append(type(exc))
    assert caught == list(HIERARCHY)

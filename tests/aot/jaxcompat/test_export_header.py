"""The canary of aot.jaxcompat.export_header: the generated flatbuffer reader of
``jax.export`` reads the fields that date an export, on this release's real exports."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aot.jaxcompat.export_header import read_export_header
from aot.jaxcompat.versions import release_tuple

pytestmark = pytest.mark.version_suite


def test_a_real_export_header_reads_what_jax_export_says() -> None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    fn = jax.jit(lambda x: x * 2, in_shardings=sharding)
    exported = jax.export.export(fn)(jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharding))
    header = read_export_header(bytes(exported.serialize()))
    assert header is not None
    assert header.calling_convention == exported.calling_convention_version
    assert header.nr_devices == exported.nr_devices == 2
    assert header.nr_devices_short in (0, 2)  # 0.9.0-0.9.1 also wrote the 16-bit field
    assert header.named_shardings and not header.hlo_sharding_only
    if release_tuple(jax.__version__) >= (0, 11, 1):  # serialization version 12: recorded
        assert header.serialization_field >= 12 and header.jax_version == jax.__version__
    else:
        assert header.serialization_field == 3 and header.jax_version is None


def test_bytes_that_are_no_export_read_as_none() -> None:
    assert read_export_header(b"") is None
    assert read_export_header(b"\xff" * 7) is None

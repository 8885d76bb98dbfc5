"""JAX 0.11.1+'s export rules, judged from an export's header (aot.export_rules): the
formats 0.11.1+ refuses, the six-month window, the export's date from its bytes and
its entry, on real exports of this JAX and on headers of the old formats."""

from __future__ import annotations

import dataclasses
import datetime as dt

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aot.export_rules import RELEASE_DATES, date_export, judge, judge_header, newest_release, window_start
from aot.jaxcompat.export_header import ExportHeader, read_export_header
from aot.jaxcompat.versions import TESTED_RELEASES, release_tuple
from tests.aot.export_blobs import old_format_export

pytestmark = pytest.mark.version_suite

RECORDS = release_tuple(jax.__version__) >= (0, 11, 1)


def _export(sharded: bool = False) -> bytes:
    spec = jax.ShapeDtypeStruct((8,), jnp.float32)
    fn = jax.jit(lambda x: jnp.sin(x) * 2)
    if sharded:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
        fn = jax.jit(lambda x: x + 1, in_shardings=sharding)
        spec = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharding)
    return bytes(jax.export.export(fn)(spec).serialize())


#: A format-11 export of 0.10.2, as its header reads (the field says 3 before 0.11.1).
V11 = ExportHeader(3, None, 10, 1, 0, True, False, False)


def test_every_tested_release_has_a_date_and_the_window_is_six_months() -> None:
    assert set(TESTED_RELEASES) <= set(RELEASE_DATES)
    assert newest_release() == TESTED_RELEASES[-1]
    assert window_start("0.12.1") == dt.date(2026, 5, 18)
    assert window_start("0.10.2") == dt.date(2025, 12, 17)
    assert window_start("0.9.0.1") == dt.date(2025, 8, 3)


def test_a_fresh_export_of_this_jax_is_called_by_this_release_and_dated_by_it() -> None:
    # The newest release promises to call it when this release is inside its window
    # (0.10.1 and later for 0.12.1); 0.9.x's and 0.10.0's exports are outside it.
    inside = RELEASE_DATES[jax.__version__] >= window_start(newest_release())
    for sharded in (False, True):
        blob = _export(sharded)
        here = judge(blob, jax.__version__, jax.__version__)
        assert here is not None and here.status is None, here
        newest = judge(blob, jax.__version__, newest_release())
        assert newest is not None and newest.status == (None if inside else "expired"), newest
        date = judge(blob, jax.__version__, jax.__version__).date
        assert date.made == RELEASE_DATES[jax.__version__] and date.producer == jax.__version__


def test_the_date_comes_from_the_recorded_release_or_the_entrys_when_the_bytes_agree() -> None:
    assert date_export(V11, "0.10.2").made == dt.date(2026, 6, 17)
    # A ladder-recompiled entry of 0.12.1 keeps a pre-0.11.1 export: the format's date, a lower bound.
    inherited = date_export(V11, "0.12.1")
    assert inherited.made == dt.date(2026, 4, 4) and inherited.producer is None
    recorded = dataclasses.replace(V11, serialization_field=12, jax_version="0.11.2")
    assert date_export(recorded, "0.12.1").made == dt.date(2026, 9, 17)
    unknown = dataclasses.replace(V11, serialization_field=14, jax_version="0.13.0")
    assert date_export(unknown, None).made == dt.date(2026, 10, 30)  # the newest format known


def test_old_formats_are_refused_from_0_11_1_and_outside_every_window() -> None:
    hlo_only = dataclasses.replace(V11, indexed=False, hlo_sharding_only=True)
    short = dataclasses.replace(V11, nr_devices=0, nr_devices_short=4)
    for header, why in ((hlo_only, "HloSharding protos only (made before 2026-01-15"),
                        (short, "only in the 16-bit field of serialization formats before 5")):
        before = judge_header(header, "0.9.0", "0.11.0")
        assert before.refused == () and before.status == "expired"  # 0.11.0 still reads it
        after = judge_header(header, "0.9.0", "0.11.1")
        assert after.status == "refused" and why in after.refused[0], after
        assert "older than jax 0.11.1's 6-month window (from 2026-02-17)" in after.expired[0]


def test_the_window_of_a_release_by_the_exports_date() -> None:
    assert judge_header(V11, "0.10.2", "0.12.1").status is None  # 2026-06-17 >= 2026-05-18
    old = judge_header(V11, "0.10.0", "0.12.1")  # 2026-04-15
    assert old.status == "expired" and old.refused == ()
    assert old.expired == ("made by jax 0.10.0 (2026-04-15) is older than jax 0.12.1's 6-month window "
                           "(from 2026-05-18)",)
    cc = judge_header(dataclasses.replace(V11, calling_convention=8), "0.10.2", "0.10.2")
    assert cc.refused == ("calling convention 8 is outside jax 0.10.2's (9..10)",)


def test_a_real_export_in_the_pre_5_layout_is_refused_by_jax_as_by_the_rules() -> None:
    blob = _export()
    old = old_format_export(blob)
    header = read_export_header(old)
    assert header is not None and (header.nr_devices, header.nr_devices_short) == (0, 1)
    verdict = judge(old, jax.__version__, jax.__version__)
    assert verdict is not None and verdict.date.made is None
    if RECORDS:  # JAX itself refuses it: the rules say what it does
        assert verdict.status == "refused"
        with pytest.raises(ValueError, match="older than the 6-month"):
            jax.export.deserialize(bytearray(old))
    else:  # this JAX reads it (and calls it), outside the window it promises
        assert verdict.status == "expired"
        assert jax.export.deserialize(bytearray(old)).nr_devices == 1
    assert judge(old, jax.__version__, "0.12.1").status == "refused"

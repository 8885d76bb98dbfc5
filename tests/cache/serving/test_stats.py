"""Serving statistics (aot.cache.stats_recorder): a dispatcher counts calls with one increment on
the program it holds; counts reach the index in batches (never a write per call),
from any number of processes; HITS and last-used times follow calls, not loads."""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

import aot
from aot.cache import stats_recorder as stats_mod
from aot.cache.index.entry import SCHEMA_VERSION, utcnow
from aot.cache.index.sql import Index
from aot.cache.reports.stats import read_stats, zero_stats
from aot.cache.stats_report import SignatureStats
from aot.errors import CacheError, SignatureNotFoundError


@pytest.fixture(autouse=True)
def _no_background_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts reach the index only when a test flushes (or closes): deterministic."""
    monkeypatch.setattr(stats_mod, "FLUSH_SECONDS", None)


def _call(fn, compiled, n: int) -> None:  # noqa: ANN001
    for _ in range(n):
        np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)


def test_calls_reach_the_index_in_batches_and_count_as_hits(open_cache, compiled) -> None:  # noqa: ANN001
    cache = open_cache()
    entry = cache.put(compiled.tiny)
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    _call(fn, compiled, 25)
    assert open_cache().index.get(entry.key).hits == 0  # nothing written per call
    assert cache.stats.flush()
    reader = open_cache()
    row = reader.index.get(entry.key)
    assert row.hits == 25 and row.last_used_at >= entry.last_used_at
    (stats,) = read_stats(reader, compiled.TINY_NAME).rows
    assert (stats.name, stats.signature, stats.this_environment) == (entry.name, entry.signature, True)
    assert (stats.calls, stats.loads, stats.misses, stats.recompiles) == (25, 1, 0, 0)
    assert stats.saved_seconds == pytest.approx(entry.compile_seconds)
    assert stats.load_seconds > 0
    assert cache.stats.flush()  # nothing new: nothing added
    _call(fn, compiled, 5)
    cache.close()  # the last counts
    assert read_stats(reader, compiled.TINY_NAME).rows[0].calls == 30
    assert reader.index.get(entry.key).hits == 30


@pytest.mark.postgres
def test_no_statement_reaches_the_database_per_call(cache_of_kind, compiled) -> None:  # noqa: ANN001
    cache = cache_of_kind("postgresql")()
    cache.put(compiled.tiny)
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    statements: list[str] = []
    sa.event.listen(cache.index.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    _call(fn, compiled, 200)
    assert statements == []
    cache.stats.flush()
    assert statements and len(statements) < 10  # one transaction: clock, upsert, hits


def test_misses_and_recompiles_with_their_signature_and_reason(open_folder_cache, compiled, foreign) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    other = cache.put_artifact(foreign(compiled.tiny, jaxlib="0.0.1"))
    fn = aot.load(compiled.TINY_NAME, cache=cache)  # recompiles from the portable HLO
    _call(fn, compiled, 3)
    x, y = compiled.tiny_inputs
    with pytest.raises(SignatureNotFoundError):
        fn(x[:4], y)
    with pytest.raises(SignatureNotFoundError):
        fn(x[:4], y)
    cache.stats.flush()
    rows = {r.signature: r for r in read_stats(cache).rows}
    served = rows[other.signature]
    assert (served.calls, served.recompiles, served.misses) == (3, 1, 0)
    assert "jaxlib 0.0.1" in served.recompile_reason and served.recompile_seconds > 0
    missed = rows["f32[4], f32[8]"]
    assert (missed.misses, missed.calls, missed.miss_reason) == (2, 0, "no stored signature")


def test_a_wrong_pytree_under_a_stored_signature_is_filed_as_a_structure_mismatch(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    entry = cache.put(compiled.tiny)
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    x, y = compiled.tiny_inputs
    with pytest.raises(SignatureNotFoundError, match="pytree structure"):
        fn((x, y))  # the stored leaves, in one tuple: the signature is stored, the structure is not
    cache.stats.flush()
    (row,) = [r for r in read_stats(cache).rows if r.misses]
    assert row.signature == entry.signature and row.misses == 1
    assert row.miss_reason.startswith("pytree structure mismatch with the stored signature")
    assert "no stored signature" not in row.miss_reason


def test_missed_signatures_are_bounded_per_name(open_folder_cache, compiled, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(stats_mod, "MAX_MISSED_SIGNATURES", 2)
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    x, y = compiled.tiny_inputs
    for n in (1, 2, 3, 4, 1):
        with pytest.raises(SignatureNotFoundError):
            fn(x[:n], y)
    cache.stats.flush()
    misses = {r.signature: r.misses for r in read_stats(cache).rows if r.misses}
    assert misses == {"f32[1], f32[8]": 2, "f32[2], f32[8]": 1, stats_mod.OTHER_SIGNATURES: 2}


def test_padded_calls_count_for_the_bucket_that_served_them(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    for artifact in compiled.mlp.values():
        cache.put(artifact)
    fn = aot.load(compiled.MLP_NAME, cache=cache, pad={"x": 0})
    fn(compiled.params, compiled.inputs[4][:3])  # 3 rows: padded to the batch-4 bucket
    fn(compiled.params, compiled.inputs[1])
    cache.stats.flush()
    calls = {r.signature: r.calls for r in read_stats(cache).rows}
    assert calls[compiled.mlp[4].manifest.signature] == 1
    assert calls[compiled.mlp[1].manifest.signature] == 1
    assert sum(r.misses for r in read_stats(cache).rows) == 0


def test_a_read_only_cache_keeps_its_statistics_in_memory(open_cache, compiled) -> None:  # noqa: ANN001
    writer = open_cache()
    entry = writer.put(compiled.tiny)
    replica = open_cache(read_only=True)
    fn = aot.load(compiled.TINY_NAME, cache=replica)
    _call(fn, compiled, 7)
    assert replica.stats.flush() and not replica.stats.stored
    report = replica.stats.report()
    assert not report.stored and [r.calls for r in report.rows] == [7]
    assert writer.index.get(entry.key).hits == 0
    assert read_stats(writer).rows == () and read_stats(replica).rows == ()


def test_a_failed_write_never_reaches_the_caller_and_is_retried(open_folder_cache, compiled, caplog) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    entry = cache.put(compiled.tiny)
    fn = aot.load(compiled.TINY_NAME, cache=cache)
    _call(fn, compiled, 4)
    index_file = Path(cache.location) / "index.sqlite"
    with sqlite3.connect(index_file) as conn:
        conn.execute("ALTER TABLE call_stats RENAME TO call_stats_away")
    assert cache.stats.flush() is False
    assert "could not record call statistics" in caplog.text
    _call(fn, compiled, 3)  # serving goes on
    with sqlite3.connect(index_file) as conn:
        conn.execute("ALTER TABLE call_stats_away RENAME TO call_stats")
    assert cache.stats.flush() is True
    assert read_stats(cache).rows[0].calls == 7
    assert cache.index.get(entry.key).hits == 7


def test_gc_older_than_finds_the_buckets_nobody_calls(open_cache, compiled) -> None:  # noqa: ANN001
    """A replica loads every bucket at start-up; only the called one stays young."""
    cache = open_cache()
    keys = {batch: cache.put_artifact(a).key for batch, a in compiled.mlp.items()}  # no refs (as copies): unpinned
    for key in keys.values():
        cache.index.touch(key, when=utcnow() - dt.timedelta(days=40))
    fn = aot.load(compiled.MLP_NAME, cache=cache)  # loads all three: not a use
    fn(compiled.params, compiled.inputs[2])
    cache.stats.flush()
    plan = cache.gc(older_than="30d", dry_run=True)
    assert {v.key for v in plan.entries} == {keys[1], keys[4]}


def test_zero_resets_the_statistics_not_the_hits(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    entry = cache.put(compiled.tiny)
    _call(aot.load(compiled.TINY_NAME, cache=cache), compiled, 2)
    assert zero_stats(cache, "no-such-*") == 0
    assert zero_stats(cache, "ti*") == 1
    assert read_stats(cache).rows == ()
    assert cache.index.get(entry.key).hits == 2


_PROCESS = textwrap.dedent(
    """
    import sys
    import numpy as np
    import aot

    location, calls = sys.argv[1], int(sys.argv[2])
    fn = aot.load("tiny", cache=location, strict=True)
    for _ in range(calls):
        fn(np.ones(8, np.float32), np.ones(8, np.float32)).block_until_ready()
    # no close: the counts are written at exit
    """
)


@pytest.mark.postgres
def test_two_processes_count_into_one_postgresql_index(cache_of_kind, compiled) -> None:  # noqa: ANN001
    factory = cache_of_kind("postgresql")
    cache = factory()
    entry = cache.put(compiled.tiny)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen([sys.executable, "-c", _PROCESS, factory.location, str(n)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in (37, 55)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
    (row,) = read_stats(cache).rows
    assert (row.calls, row.loads) == (92, 2)
    assert cache.index.get(entry.key).hits == 92


def test_an_index_of_schema_3_gains_the_statistics_table(index_url: str) -> None:
    with Index(index_url) as idx:
        with idx.engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE call_stats")
            conn.exec_driver_sql("UPDATE schema_version SET version = 3")
    with pytest.raises(CacheError, match="opened read-only so it was not migrated"):
        Index(index_url, read_only=True)
    with Index(index_url) as idx:
        assert idx.schema_version() == SCHEMA_VERSION
        assert "call_stats" in sa.inspect(idx.engine).get_table_names()


def test_report_round_trips_through_json(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    _call(aot.load(compiled.TINY_NAME, cache=cache), compiled, 3)
    cache.stats.flush()
    report = read_stats(cache)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["totals"]["calls"] == 3 and data["stored"] is True
    assert SignatureStats.from_dict(data["rows"][0]) == report.rows[0]


def test_a_dispatcher_collected_during_a_flush_does_not_deadlock() -> None:
    """A dispatcher in a reference cycle is freed by the garbage collector, which may
    run inside a flush (the sink allocates); its finalizer takes the recorder's lock
    on the same thread."""
    import gc
    import threading
    from types import SimpleNamespace

    class Owner:  # stands for a dispatcher
        pass

    owner = Owner()
    owner.cycle = owner  # only the cyclic collector frees it
    programs = {"p": SimpleNamespace(calls=3, counted=0, signature="f32[2]", executable=None)}
    held: list[Owner] = [owner]
    written: list[list[dict]] = []

    class Sink:
        def write(self, rows, touches) -> None:  # noqa: ANN001
            written.append(rows)
            held.clear()
            gc.collect()  # the owner's finalizer runs here, on the flushing thread

    recorder = stats_mod.StatsRecorder("test", lambda: Sink())
    recorder.watch(owner, programs, "env", "name")
    del owner
    flusher = threading.Thread(target=recorder.flush, daemon=True)
    flusher.start()
    flusher.join(timeout=30)
    assert not flusher.is_alive(), "flush deadlocked on a finalizer taking the recorder's lock"
    assert [r["calls"] for r in written[0]] == [3]
    recorder._sink_factory = None  # what is left stays in memory
    assert recorder.report().totals["calls"] == 3

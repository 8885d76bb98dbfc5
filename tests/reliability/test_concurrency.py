"""Concurrent writers: 8 processes x 25 compile/put each into one cache, keys overlap.

Every writer is a separate process with its own XLA client and database connections
(forked from one parent that imported JAX but created no backend: importing JAX eight
times would cost ~12 s of CPU on 2 cores); they wait on a start file so that their
writes really overlap. The SQLite cache is
not created beforehand: the 8 writers also race to create its schema.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.reliability import reliability_workers as workers
from tests.reliability.helpers import check_scaled, child_env, worker_command

WORKERS = 8
OPS = 25
SEED = 20261207


def run_writers(location: str, tmp_path: Path) -> list[dict]:
    """8 writer processes (forked from one parent after the imports, before any XLA
    backend exists, so each has its own XLA client and database connections)."""
    sync = tmp_path / "sync"
    sync.mkdir()
    proc = subprocess.Popen(
        worker_command("concurrent-forked", location, str(WORKERS), str(OPS), str(SEED), str(sync)),
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(sync.glob("ready.*"))) < WORKERS:
            assert time.monotonic() < deadline, "writers did not start"
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        (sync / "go").touch()
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"a writer failed:\n{err[-6000:]}"
    assert "Traceback" not in err, err[-6000:]
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert sorted(r["worker"] for r in results) == list(range(WORKERS))
    return results


def check_cache(location: str, results: list[dict], monkeypatch: pytest.MonkeyPatch) -> int:
    """Every entry present once, intact and loadable; returns the orphan blobs that
    lost races left (collected by gc)."""
    import sqlalchemy as sa

    from aot.cache.admin import maintenance
    from aot.cache.cache import Cache
    from aot.cache.index.schema import ARTIFACTS, BLOBS

    with Cache(location) as cache:
        entries = cache.entries(workers.CONCURRENT_NAME)
        keys = [e.key for e in entries]
        # one entry per distinct program, each present once
        assert len(keys) == len(set(keys)) == len(workers.CONCURRENT_SIZES), keys
        with cache.index.engine.connect() as conn:
            rows = conn.execute(sa.select(ARTIFACTS.c.key)).scalars().all()
            blob_rows = conn.execute(sa.select(BLOBS.c.digest)).scalars().all()
        assert sorted(rows) == sorted(keys)
        assert len(blob_rows) == len(set(blob_rows))
        assert all(e.ok for e in entries), [e.state_reason for e in entries]
        # every load (hits, and the get after each put) was counted in its row:
        # no use-count update was lost to a busy database
        loads = sum(r["hits"] for r in results) + WORKERS * (OPS // 5)
        assert sum(e.hits for e in entries) == loads
        report = cache.verify()
        assert report.problems == () and report.quarantined == (), report.to_dict()
        # XLA's serialized executables are not byte-identical across processes (they
        # depend on what the process compiled before), so when several writers compile
        # one key at once, the losers' executable blobs are written (blobs go first)
        # but no row references them. They are intact, unreferenced, and gc takes them.
        referenced = cache.index.referenced_digests()
        orphans = report.orphan_blobs
        assert not set(orphans) & referenced
        assert all(cache.blobs.check(d) is None for d in orphans)
        monkeypatch.setattr(maintenance, "ORPHAN_GRACE_SECONDS", 0.0)
        plan = cache.gc()
        assert plan.entries == () and set(plan.blobs) == set(orphans)
        final = cache.verify()
        assert final.ok, final.to_dict()
        by_shape = {}
        for entry in cache.entries(workers.CONCURRENT_NAME):
            exe = cache.load(entry)
            (arg,) = exe.info.args
            by_shape[arg.shape] = exe
        for n in workers.CONCURRENT_SIZES:
            check_scaled(by_shape[(n,)], n)
        return len(orphans)


@pytest.mark.slow
def test_sqlite_folder_cache_8_writers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    location = str(tmp_path / "cache")
    results = run_writers(location, tmp_path)
    assert sum(r["hits"] + r["misses"] for r in results) == WORKERS * OPS * 4 // 5
    orphans = check_cache(location, results, monkeypatch)
    print(f"sqlite: {sum(r['misses'] for r in results)} misses, {orphans} orphan blobs of lost races")


@pytest.mark.slow
@pytest.mark.postgres
def test_postgresql_cache_8_writers(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = run_writers(postgres_url, tmp_path)
    assert sum(r["hits"] + r["misses"] for r in results) == WORKERS * OPS * 4 // 5
    orphans = check_cache(postgres_url, results, monkeypatch)
    print(f"postgresql: {sum(r['misses'] for r in results)} misses, {orphans} orphan blobs of lost races")


def test_storing_an_entry_again_leaves_no_orphan(tmp_path: Path, tiny: Any) -> None:
    """XLA executables differ from one compile to the next: a second put (or a second
    `aot compile`) of a stored key must not write a blob no row will reference; and a
    put over a damaged entry still repairs it."""
    import aot
    from aot.artifact import EXECUTABLE
    from aot.cache.cache import Cache

    with Cache(tmp_path / "cache") as cache:
        first = cache.put(aot.lower(workers.scaled, aot.spec("f32[7]"), name="rel.again"))
        again = cache.put(aot.lower(workers.scaled, aot.spec("f32[7]"), name="rel.again"))
        assert again.key == first.key and again.exe_digest == first.exe_digest
        report = cache.verify()
        assert report.ok and report.orphan_blobs == (), report.to_dict()
        # damaged: the next put writes its blobs and replaces the quarantined row
        cache.blobs.store.path_for(first.exe_digest).unlink()
        artifact = tiny.by_size[3]
        cache.put_artifact(artifact)
        # Two intact entries beside the two damaged ones: verify takes most blobs missing
        # at once for a wrong --blobs and quarantines nothing then (a likely misconfiguration).
        cache.put_artifact(tiny.by_size[1])
        cache.put_artifact(tiny.by_size[2])
        digest = artifact.manifest.blobs[EXECUTABLE].digest
        cache.blobs.store.path_for(digest).unlink()
        assert set(cache.verify().quarantined) == {first.key, artifact.manifest.key}
        cache.put_artifact(artifact)
        check_scaled(cache.get(artifact.manifest.key), 3)
        cache.put(aot.lower(workers.scaled, aot.spec("f32[7]"), name="rel.again"))
        check_scaled(cache.get(first.key), 7)
        cache.gc()
        assert cache.verify().ok

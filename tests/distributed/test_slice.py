"""jax-aot in every process of a multi-process job (a pod slice simulated on loopback:
N processes x 2 CPU devices, gloo, ``jax.distributed``), a mesh spanning them.

Each job is a few seconds; every wait is bounded (tests/distributed/harness.py)."""

from __future__ import annotations

import time

import jax
import pytest

import aot
from aot.jaxcompat.versions import release_tuple
from tests.distributed.harness import run_job, values

pytestmark = pytest.mark.slow

WORKERS = "tests.distributed.workers"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> str:
    """A cache holding the train step, compiled by a 2-process job (read, never changed)."""
    cache = str(tmp_path_factory.mktemp("compiled") / "cache")
    values(run_job(f"{WORKERS}:compile_step", {"cache": cache}))
    return cache


def _digests_equal(results: list[dict], field: str = "got", against: list[dict] | None = None) -> None:
    for i, value in enumerate(results):
        want = (against or results)[i]["want"]
        assert value[field] == want, f"process {i}: {field} differs from jax.jit's shards"


@pytest.mark.parametrize("processes", [2, 4])
def test_compiled_once_for_the_slice_then_served_strict_without_the_model(tmp_path, processes: int) -> None:
    cache = str(tmp_path / "cache")
    first = values(run_job(f"{WORKERS}:compile_step", {"cache": cache}, processes=processes))
    # One process compiled and stored; the others waited and loaded its entry.
    assert [v["hit"] for v in first] == [False] + [True] * (processes - 1)
    assert len({v["key"] for v in first}) == 1
    assert [v["entries"] for v in first] == [1] * processes
    _digests_equal(first)
    assert len(aot.Cache(cache).entries()) == 1

    again = values(run_job(f"{WORKERS}:compile_step", {"cache": cache}, processes=processes))
    assert [v["hit"] for v in again] == [True] * processes  # stored: nobody compiles

    modes = ["eager", "lazy", "background"] if processes == 2 else ["eager"]
    served = values(run_job(f"{WORKERS}:serve_step", {"cache": cache, "modes": modes}, processes=processes))
    for i, value in enumerate(served):
        assert value["model_imported"] is False
        for mode in modes:
            assert value[mode] == first[i]["want"], f"process {i}, {mode}: not jax.jit's shards"


def test_cache_put_of_a_computation_compiles_once_for_the_slice(tmp_path) -> None:
    cache = str(tmp_path / "cache")
    first = values(run_job(f"{WORKERS}:put_step", {"cache": cache}))
    # Process 0 compiled and stored; process 1 waited and returned its entry.
    assert [v["compiles"] for v in first] == [1, 0]
    assert len({v["key"] for v in first}) == 1
    (entry,) = aot.Cache(cache).entries("dist.put")
    assert entry.key == first[0]["key"]
    assert [r.slot[0] for r in aot.Cache(cache).refs_named("dist.put")] == ["dist.put"]


def test_a_read_only_slice_compiles_in_every_process_without_waiting_for_the_leader(tmp_path) -> None:
    cache = str(tmp_path / "cache")
    aot.Cache(cache).close()  # an empty cache, opened read-only by the job
    # The leader's compile is held for 8 s; a follower that waited for it would raise
    # after 2 s: it is told at once that nothing will be stored, and compiles itself.
    results = values(run_job(
        f"{WORKERS}:compile_step", {"cache": cache, "read_only": True},
        env={"AOT_SLICE_WAIT_SECONDS": "2"}, env_per_process={0: {"AOT_TEST_PAUSE": "slice.compiling=sleep:8"}},
    ))
    assert [v["hit"] for v in results] == [False, False]
    _digests_equal(results)
    assert aot.Cache(cache).entries() == []


def test_statics_donation_and_padding_in_every_process(tmp_path) -> None:
    cache = str(tmp_path / "cache")
    first = values(run_job(
        f"{WORKERS}:compile_step", {"cache": cache, "forward_rows": [8, 16], "static_donate": True},
    ))
    assert [v["forward_hits"] for v in first] == [[False, False], [True, True]]
    assert [v["static_hits"] for v in first] == [[False, False], [True, True]]  # one entry per lr
    assert all(v["static_equal"] == [True, True] for v in first)
    assert all(v["donated"] == [True, True] for v in first)  # w was donated in every process
    assert len(aot.Cache(cache).entries()) == 5
    # 6 rows, served by the 8-row bucket and sliced back: jax.jit's rows, in every process.
    padded = values(run_job(f"{WORKERS}:serve_forward_padded", {"cache": cache, "rows": 6}))
    assert padded == [{"shape": [6, 16], "equal": True}] * 2


def test_the_fallback_ladder_recompiles_once_for_the_slice_and_heals(tmp_path) -> None:
    cache = str(tmp_path / "cache")
    first = values(run_job(f"{WORKERS}:compile_step", {"cache": cache}))
    store = aot.Cache(cache)
    (entry,) = store.entries("dist.step")
    store.blobs.delete([entry.exe_digest])  # the executable is gone; its portable HLO is not
    laddered = values(run_job(f"{WORKERS}:serve_step", {"cache": cache, "strict": False}))
    assert [v["eager"] for v in laddered] == [v["want"] for v in first]
    assert [v["recompiled"] for v in laddered] == [1, 0]  # once for the slice; process 1 loaded it
    healed = aot.Cache(cache).index.get(entry.key)
    assert healed.ok and aot.Cache(cache).blobs.check(healed.exe_digest) is None
    served = values(run_job(f"{WORKERS}:serve_step", {"cache": cache}))  # strict again
    assert [v["eager"] for v in served] == [v["want"] for v in first]


def test_pmap_within_each_process_works_and_across_processes_is_refused(tmp_path) -> None:
    cache = str(tmp_path / "cache")
    local = values(run_job(f"{WORKERS}:pmap_step", {"cache": cache, "local": True}))
    # Each process's own devices: its own program (no slice to share), jax.pmap's shards.
    assert local == [{"hit": False, "equal": True}] * 2
    # Across the job, aot's jit(pmap) would psum over one process: refused, every process.
    for r in run_job(f"{WORKERS}:pmap_step", {"cache": cache}):
        assert r.error is not None and r.error["type"] == "UnsupportedComputationError", r.stderr
        assert "a pmap across the 2 processes of this job is not supported" in r.error["message"]


def test_a_leader_that_fails_to_compile_fails_the_others_at_once_with_its_error(tmp_path) -> None:
    cache = str(tmp_path / "cache")
    started = time.monotonic()
    results = run_job(
        f"{WORKERS}:compile_step",
        {"cache": cache, "leader_fails": "RESOURCE_EXHAUSTED: out of memory compiling (test)"},
        env={"AOT_SLICE_WAIT_SECONDS": "120"},
    )
    assert time.monotonic() - started < 60  # not the 120 s wait
    leader, other = (r.error for r in results)
    assert leader["type"] == "RuntimeError" and "out of memory" in leader["message"]
    assert other["type"] == "SliceError" and other["aot"]
    assert "process 0 failed to compile dist.step" in other["message"]
    assert "RESOURCE_EXHAUSTED: out of memory compiling (test)" in other["message"]
    assert aot.Cache(cache).entries() == []


def test_a_frozen_leader_costs_the_others_the_named_timeout(tmp_path) -> None:
    cache = str(tmp_path / "cache")
    results = run_job(
        f"{WORKERS}:compile_step", {"cache": cache},
        env={"AOT_SLICE_WAIT_SECONDS": "2", "AOT_TEST_BARRIER_SECONDS": "1"},
        env_per_process={0: {"AOT_TEST_PAUSE": "slice.compiling=sleep:30"}},
    )
    waiting = results[1].error
    assert waiting is not None and waiting["type"] == "SliceTimeoutError", results[1].stderr
    message = waiting["message"]
    assert "waited 2 s for process 0" in message and "AOT_SLICE_WAIT_SECONDS" in message
    assert "dist.step (" in message  # the key, after the name
    assert aot.Cache(cache).entries() == []  # the leader was ended before it stored anything


def test_a_leader_killed_mid_compile_ends_the_job_fast_and_stores_nothing(tmp_path) -> None:
    cache = str(tmp_path / "cache")
    started = time.monotonic()
    results = run_job(
        f"{WORKERS}:compile_step", {"cache": cache}, env={"AOT_SLICE_WAIT_SECONDS": "120"},
        env_per_process={0: {"AOT_TEST_PAUSE": "slice.compiling=kill"}},
    )
    assert time.monotonic() - started < 40
    assert results[0].returncode == -9
    # JAX's coordination service lived in process 0: the waiting process raises SliceError
    # when its wait fails first, or JAX ends it, saying so, when its agent notices first.
    waiting = results[1]
    if waiting.error is not None:
        assert waiting.error["type"] == "SliceError"
        assert "lost the job's coordination service while process 0 compiled dist.step" in waiting.error["message"]
    else:
        assert waiting.returncode != 0 and "another task died" in waiting.stderr
    assert aot.Cache(cache).entries() == []
    assert aot.Cache(cache).verify().problems == ()


def test_a_process_killed_mid_load_ends_the_job_bounded(compiled: str) -> None:
    cache = compiled
    started = time.monotonic()
    results = run_job(
        f"{WORKERS}:serve_step", {"cache": cache, "die_mid_load": 1},
    )
    assert time.monotonic() - started < 45
    assert results[1].returncode == -9
    # Process 0's first call needs process 1: JAX's coordination service ends it (its
    # heartbeat bound, 10 s here), saying another task died; no hang.
    assert results[0].returncode not in (0, None) and results[0].result is None
    assert "stopped sending heartbeats" in results[0].stderr or "another task died" in results[0].stderr
    assert aot.Cache(cache).verify().problems == ()  # the reader changed nothing


def test_an_entry_of_another_process_count_is_refused_in_every_process(compiled: str) -> None:
    cache = compiled
    results = run_job(f"{WORKERS}:serve_step", {"cache": cache}, processes=4)
    for r in results:
        assert r.error is not None and r.error["type"] == "SignatureNotFoundError", r.stderr
        assert "process_count 2 != 4" in r.error["message"]


def test_a_mesh_that_does_not_match_the_compiled_one_is_refused_in_every_process(compiled: str) -> None:
    cache = compiled
    results = run_job(f"{WORKERS}:serve_step", {"cache": cache, "mesh_shape": [1, 4]})
    for r in results:
        assert r.error is not None and r.error["type"] == "AvalMismatchError", r.stderr
        assert "'data': 1, 'model': 4" in r.error["message"] and "'data': 2, 'model': 2" in r.error["message"]


def test_a_wrong_process_count_fails_every_process_within_the_bound(tmp_path) -> None:
    started = time.monotonic()
    # Each of 2 processes is told the job has 3: JAX's initialize times out (the
    # harness bounds it at 20 s), never a hang.
    results = run_job(
        f"{WORKERS}:compile_step", {"cache": str(tmp_path / "cache")}, num_processes=3,
        env={"AOT_TEST_INIT_SECONDS": "5"},
    )
    assert time.monotonic() - started < 45
    for r in results:
        assert r.returncode not in (0, None), r.stderr
        assert "DEADLINE_EXCEEDED" in r.stderr and "RegisterTask" in r.stderr


@pytest.mark.parametrize("processes", [2, 4])
def test_the_jit_backend_compiles_once_for_the_slice_and_every_process_hits_next_run(
    tmp_path, processes: int,
) -> None:
    if release_tuple(jax.__version__) >= (0, 12):
        pytest.skip(
            "JAX 0.12's own binary sharing between hosts (jax_share_binary_between_hosts, which this "
            "backend turns on) hangs on CPU gloo collectives: the executable compiled in process 0 and its "
            "deserialized copy in the others never meet (plain jax.jit with JAX's own cache fails the same "
            "way); aot.Cache serves the stored bytes in every process instead (the tests above)"
        )
    cache = str(tmp_path / "cache")
    first = values(run_job(f"{WORKERS}:jit_step", {"cache": cache}, processes=processes))
    # Process 0 compiled and stored, once for the slice; each other process took its
    # binary (JAX's share: it waited), or, when it looked later than process 0 stored,
    # hit the stored entry. Never a second compile.
    assert [v["counts"]["puts"] for v in first] == [1] + [0] * (processes - 1)
    assert first[0]["counts"]["hits"] == 0 and first[0]["jax_said"] == ["compiled"]
    for v in first[1:]:
        assert (v["counts"]["hits"], v["jax_said"]) in ((0, ["waited"]), (1, [])), first
    second = values(run_job(f"{WORKERS}:jit_step", {"cache": cache}, processes=processes))
    assert [v["counts"]["hits"] for v in second] == [1] * processes, second
    assert [v["counts"]["misses"] for v in second] == [0] * processes
    assert [v["jax_said"] for v in second] == [[]] * processes  # nobody compiled
    assert [v["got"] for v in second] == [v["got"] for v in first]  # the same shards


def test_a_slice_shares_a_postgresql_index_and_object_store_blobs(postgres_url: str, s3_url: str) -> None:
    """The layout docs/accelerators.md gives a slice's hosts: one PostgreSQL index, the
    blobs on an S3-compatible store (moto). One process compiles for the slice, the
    next job compiles nothing, and every process serves the entry strictly, naming only
    the database (the blobs' location is recorded in it)."""
    first = values(run_job(f"{WORKERS}:compile_step", {"cache": postgres_url, "blob_location": s3_url}))
    assert [v["hit"] for v in first] == [False, True]
    assert len({v["key"] for v in first}) == 1 and [v["entries"] for v in first] == [1, 1]
    _digests_equal(first)
    again = values(run_job(f"{WORKERS}:compile_step", {"cache": postgres_url, "blob_location": s3_url}))
    assert [v["hit"] for v in again] == [True, True]
    served = values(run_job(f"{WORKERS}:serve_step", {"cache": postgres_url, "modes": ["eager"]}))
    for i, value in enumerate(served):
        assert value["model_imported"] is False and value["recompiled"] == 0
        assert value["eager"] == first[i]["want"], f"process {i}: not jax.jit's shards"
    with aot.Cache(postgres_url) as cache:
        (entry,) = cache.entries()
        assert cache.blobs.check(entry.exe_digest) is None  # the executable is on the object store
        assert cache.blobs.location.rstrip("/") == s3_url, cache.blobs.location

"""Closed-over constants through the cache: an entry whose function closes over a
200,000-float NumPy array and a JAX array is served strictly by a process that cannot
import the function, bit for bit as ``jax.jit`` runs it; its constants blob is kept and
freed by gc with the entry, checked by verify, and carried by bundles, push/pull and
repair."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.artifact import CONSTANTS, Manifest
from aot.cache.admin.removal import remove
from aot.cache.admin.repair import plan_repair, repair_index
from aot.cache.admin.transfer import pull, push
from aot.cache.warmup.manifest import parse_manifest
from aot.cache.warmup.run import expand, run_warmup

TABLE = (np.arange(200_000, dtype=np.float32) / 7.0).reshape(200, 1000)
OFFSETS = jnp.linspace(-1.0, 1.0, 1000, dtype=jnp.float32)
NAME = "consts.table"


def closes_over(x):  # noqa: ANN001, ANN201
    return jnp.tanh(x @ TABLE) + OFFSETS


def _inputs() -> np.ndarray:
    return np.random.RandomState(0).standard_normal((4, 200)).astype(np.float32)


def _digest(value) -> str:  # noqa: ANN001
    array = np.asarray(value)
    return f"{array.dtype}{list(array.shape)}:" + hashlib.sha256(array.tobytes()).hexdigest()


def _constants_digest(entry) -> str | None:  # noqa: ANN001
    ref = Manifest.from_json(entry.manifest).blobs.get(CONSTANTS)
    assert entry.const_digest == (ref.digest if ref is not None else None)
    return entry.const_digest


# The serving process: the test modules (the model code) cannot be imported there.
_SERVE = textwrap.dedent(
    """
    import hashlib, importlib.abc, json, sys

    class NoModelCode(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "tests" or name.startswith("tests."):
                raise ImportError("the serving process must not import " + name)

    sys.meta_path.insert(0, NoModelCode())
    import numpy as np
    import aot

    fn = aot.load(sys.argv[2], cache=sys.argv[1], strict=True)
    x = np.random.RandomState(0).standard_normal((4, 200)).astype(np.float32)
    outs = [np.asarray(fn(x)) for _ in range(3)]
    print(json.dumps([f"{o.dtype}{list(o.shape)}:" + hashlib.sha256(o.tobytes()).hexdigest() for o in outs]))
    """
)


def _serve_elsewhere(location: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE, location, NAME], capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_served_strictly_by_a_process_without_the_model_code(tmp_path) -> None:  # noqa: ANN001
    expected = _digest(jax.jit(closes_over)(_inputs()))
    with aot.Cache(tmp_path / "cache") as cache:
        executable = cache.compile(closes_over, "f32[4,200]", name=NAME)
        assert _digest(executable(_inputs())) == expected
        hit = cache.compile(closes_over, "f32[4,200]", name=NAME)  # a hit: loaded from the store
        assert _digest(hit(_inputs())) == expected
        location = str(cache.location)
    assert _serve_elsewhere(location) == [expected] * 3


def test_a_warm_up_stores_each_bucket_sharing_one_constants_blob(tmp_path) -> None:  # noqa: ANN001
    manifest = parse_manifest(textwrap.dedent(f"""
        [[function]]
        name = "{NAME}"
        function = "{__name__}:closes_over"
        args = ["f32[{{b}},200]"]
        vary = {{ b = [1, 4] }}
    """))
    report = run_warmup(str(tmp_path / "cache"), expand(manifest))
    assert [r.status for r in report.results] == ["compiled", "compiled"], report.results
    with aot.Cache(tmp_path / "cache") as cache:
        digests = {_constants_digest(e) for e in cache.entries(NAME)}
        assert len(digests) == 1  # the same arrays closed over: stored once
        assert cache.verify().ok
    assert _serve_elsewhere(str(tmp_path / "cache")) == [_digest(jax.jit(closes_over)(_inputs()))] * 3


def test_gc_keeps_the_constants_blob_with_its_entry_and_frees_it_after(cache, set_blob_age) -> None:  # noqa: ANN001
    entry = cache.put(aot.lower(closes_over, aot.spec("f32[4,200]"), name=NAME))
    digest = _constants_digest(entry)
    if digest is None:
        pytest.skip(f"jax {jax.__version__} embeds closed-over constants in the program")
    assert cache.blobs.has(digest)
    set_blob_age(cache.blobs, digest, 10 * 86400)  # old enough to be an orphan's
    plan = cache.gc()
    assert digest not in plan.blobs and cache.blobs.has(digest)
    assert cache.verify().ok
    assert _digest(aot.load(NAME, cache=cache, strict=True)(_inputs())) == _digest(jax.jit(closes_over)(_inputs()))

    # The entry gone (its blobs with it, or as gc's orphans), the constants go too.
    remove(cache, NAME, force=True)
    if cache.blobs.has(digest):
        set_blob_age(cache.blobs, digest, 10 * 86400)
        assert digest in cache.gc().blobs
    assert not cache.blobs.has(digest)


def test_verify_notices_a_damaged_constants_blob(cache, read_raw, write_raw) -> None:  # noqa: ANN001
    entry = cache.put(aot.lower(closes_over, aot.spec("f32[4,200]"), name=NAME))
    digest = _constants_digest(entry)
    if digest is None:
        pytest.skip(f"jax {jax.__version__} embeds closed-over constants in the program")
    stored = bytearray(read_raw(cache.blobs, digest))
    stored[len(stored) // 2] ^= 0x01
    write_raw(cache.blobs, digest, bytes(stored))
    report = cache.verify()
    assert [(p.key, p.what.split(" ")[0]) for p in report.problems] == [(entry.key, "constants")]
    assert report.quarantined == (entry.key,)
    with pytest.raises(aot.AotError):
        aot.load(NAME, cache=cache, strict=True)


def test_bundles_and_push_pull_carry_the_constants(tmp_path) -> None:  # noqa: ANN001
    expected = _digest(jax.jit(closes_over)(_inputs()))
    with aot.Cache(tmp_path / "source") as source:
        entry = source.put(aot.lower(closes_over, aot.spec("f32[4,200]"), name=NAME))
        digest = _constants_digest(entry)
        bundle = tmp_path / "table.aotb"
        source.export_bundle(bundle, NAME)
        push(source, str(tmp_path / "pushed"))
    with aot.Cache(tmp_path / "imported") as imported:
        imported.import_bundle(bundle)
    with aot.Cache(tmp_path / "pulled") as pulled:
        pull(pulled, str(tmp_path / "pushed"))
    for name in ("imported", "pushed", "pulled"):
        with aot.Cache(tmp_path / name) as copy:
            (copied,) = copy.entries(NAME)
            assert copied.key == entry.key and _constants_digest(copied) == digest
            if digest is not None:
                assert copy.blobs.has(digest)
            assert copy.verify().ok
            location = str(copy.location)
        assert _serve_elsewhere(location) == [expected] * 3


def _corrupt_artifacts_pages(index) -> None:  # noqa: ANN001
    """Overwrites every leaf page of the artifacts table (a real damage: SQLite can no
    longer read those rows)."""
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = [p for (p,) in conn.execute("SELECT pageno FROM dbstat WHERE name = 'artifacts' AND pagetype = 'leaf'")]
    finally:
        conn.close()
    with open(index, "r+b") as f:
        for page in pages:
            f.seek((page - 1) * page_size)
            f.write(bytes(range(256)) * (page_size // 256))


def test_repair_rebuilds_the_entry_with_its_constants(tmp_path) -> None:  # noqa: ANN001
    folder = tmp_path / "cache"
    with aot.Cache(folder) as cache:
        entry = cache.put(aot.lower(closes_over, aot.spec("f32[4,200]"), name=NAME))
        digest = _constants_digest(entry)
    _corrupt_artifacts_pages(folder / "index.sqlite")
    plan = repair_index(plan_repair(folder), force=True)  # this process closed the cache; its -shm may stay
    assert plan.done
    with aot.Cache(folder) as cache:
        (rebuilt,) = cache.entries(NAME)
        assert rebuilt.key == entry.key and _constants_digest(rebuilt) == digest
        assert cache.verify().ok
    assert _serve_elsewhere(str(folder)) == [_digest(jax.jit(closes_over)(_inputs()))] * 3

"""What aot.load serves: the ref'd key per signature (not the newest row), releases,
and rows whose identity or signature does not check (docs/serving.md, "What is served")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sqlalchemy as sa

import aot
from aot.cache.index.refs import RefOrigin, ReleaseMember

NAME = "act.layer"
SPEC = "f32[8]"
X = np.linspace(-3.0, 3.0, 8, dtype=np.float32)


def v1(x):  # noqa: ANN001, ANN201
    return jax.nn.gelu(x) * 3.0


def v2(x):  # noqa: ANN001, ANN201
    return jax.nn.relu(x) * 3.0


def _redate(cache: aot.Cache, key: str, when: datetime) -> None:
    with cache.index.engine.begin() as conn:
        conn.execute(sa.text("UPDATE artifacts SET created_at = :t WHERE key = :k"), {"t": when, "k": key})


def _both(cache: aot.Cache) -> tuple[str, str]:
    first = cache.compile_entry(v1, SPEC, name=NAME).entry
    second = cache.compile_entry(v2, SPEC, name=NAME).entry
    assert first.program_fp != second.program_fp and first.signature == second.signature
    return first.key, second.key


_SERVE = """
import json, sys
import numpy as np
import aot
location, blobs = sys.argv[1], (sys.argv[2] or None)
cache = aot.Cache(location, blob_location=blobs, read_only=True)
fn = aot.load(sys.argv[3], cache=cache, strict=True)
x = np.linspace(-3.0, 3.0, 8, dtype=np.float32)
print(json.dumps(np.asarray(fn(x)).tolist()))
"""


def test_refs_back_to_v1_serve_v1_in_a_fresh_process_whatever_the_clocks(open_cache, tmp_path: Path) -> None:  # noqa: ANN001
    cache = open_cache()
    key1, key2 = _both(cache)
    # No ref yet: the legacy rule, the newest row (v2).
    np.testing.assert_array_equal(np.asarray(aot.load(NAME, cache=cache)(X)), np.asarray(jax.jit(v2)(X)))
    cache.set_refs([cache.lookup(key2)], RefOrigin("test v2"))
    cache.set_refs([cache.lookup(key1)], RefOrigin("test rollback to v1"))
    # Re-dating the v2 row into the future changes nothing served: refs order, not clocks.
    _redate(cache, key2, datetime.now(timezone.utc) + timedelta(days=1))
    cache.close()

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE, open_cache.location, open_cache.blob_location or "", NAME],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    served = np.asarray(json.loads(proc.stdout.strip().splitlines()[-1]), dtype=np.float32)
    expected = np.asarray(jax.jit(v1)(X))
    np.testing.assert_array_equal(served, expected)  # bit for bit
    assert not np.array_equal(served, np.asarray(jax.jit(v2)(X)))


def test_a_damaged_served_row_never_falls_back_to_another_program(open_folder_cache) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    key1, key2 = _both(cache)
    cache.set_refs([cache.lookup(key1)], RefOrigin("test"))
    cache.quarantine(cache.lookup(key1), "test: damaged")
    # strict: v1's executable is quarantined and it may not recompile: v2 is not served instead.
    with pytest.raises(aot.AotError):
        aot.load(NAME, cache=cache, strict=True)(X)
    # not strict: v1's own portable HLO is recompiled.
    fn = aot.load(NAME, cache=cache)
    np.testing.assert_array_equal(np.asarray(fn(X)), np.asarray(jax.jit(v1)(X)))


def test_a_release_serves_exactly_its_members_and_fails_at_start_up_otherwise(open_cache, monkeypatch) -> None:  # noqa: ANN001
    cache = open_cache()
    key1, key2 = _both(cache)
    cache.set_refs([cache.lookup(key2)], RefOrigin("test v2"))
    set_id = cache.index.open_release("prod", RefOrigin("test", release="prod"))
    cache.set_refs([cache.lookup(key1)], RefOrigin("test v1", release="prod"), release_id=set_id)
    cache.set_refs([cache.lookup(key2)], RefOrigin("test v2 again"))  # the ref serves v2
    np.testing.assert_array_equal(np.asarray(aot.load(NAME, cache=cache)(X)), np.asarray(jax.jit(v2)(X)))
    np.testing.assert_array_equal(
        np.asarray(aot.load(NAME, cache=cache, release="prod")(X)), np.asarray(jax.jit(v1)(X))
    )
    monkeypatch.setenv("AOT_RELEASE", "prod")
    np.testing.assert_array_equal(np.asarray(aot.load(NAME, cache=cache)(X)), np.asarray(jax.jit(v1)(X)))
    with pytest.raises(aot.ReleaseNotFoundError, match="no release labelled 'canary'"):
        aot.load(NAME, cache=cache, release="canary")
    with pytest.raises(aot.ReleaseNotFoundError, match="no member named 'other'"):
        aot.load("other", cache=cache)
    # A member that cannot be served here (its key is not stored): refused at start-up.
    env = cache.environment.digest
    cache.index.add_release_members(set_id, [ReleaseMember(NAME, "f32[4]", env, "0" * 64)])
    with pytest.raises(aot.ReleaseNotFoundError, match=r"\(f32\[4\]\) 000000000000: its declared key"):
        aot.load(NAME, cache=cache)


def test_a_renamed_signed_row_is_refused_and_reported(open_cache, caplog) -> None:  # noqa: ANN001
    from aot.cache.admin.maintenance import verify_cache

    cache = open_cache(signing_key="k")
    mine = cache.compile_entry(v1, SPEC, name=NAME).entry
    other = cache.compile_entry(lambda x: jnp.sin(x), SPEC, name="other.layer").entry
    with cache.index.engine.begin() as conn:  # an operator with write access to the index
        conn.execute(sa.text("UPDATE artifacts SET name = :n, created_at = :t WHERE key = :k"),
                     {"n": NAME, "t": datetime.now(timezone.utc) + timedelta(days=1), "k": other.key})
    fn = aot.load(NAME, cache=cache, strict=True)
    np.testing.assert_array_equal(np.asarray(fn(X)), np.asarray(jax.jit(v1)(X)))
    refused = {key: reason for key, _, reason in fn.skipped}
    assert "index row's name is 'act.layer' but its manifest says 'other.layer'" in refused[other.key]
    assert mine.key not in refused
    report = verify_cache(cache, quarantine=False)
    assert any(p.key == other.key and "manifest says 'other.layer'" in p.what for p in report.problems)


def test_an_unsigned_row_is_skipped_while_the_signed_one_serves(open_cache) -> None:  # noqa: ANN001
    keyed = open_cache(signing_key="k")
    keyed.compile_entry(v1, SPEC, name=NAME)
    unsigned = open_cache().compile_entry(v2, SPEC, name=NAME).entry  # newer, no key
    fn = aot.load(NAME, cache=keyed, strict=True)
    np.testing.assert_array_equal(np.asarray(fn(X)), np.asarray(jax.jit(v1)(X)))
    assert [key for key, _, reason in fn.skipped if "not signed" in reason] == [unsigned.key]

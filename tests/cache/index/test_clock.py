"""The SQLite index's clock is monotonic over the hosts that write it (issue 22, item
3): a host whose clock is behind stamps its writes after what the index holds, so it
neither loses to an earlier write by a host ahead nor has its fresh entries taken for
old ones by ``gc --older-than``. The writers run under ``faketime`` (Debian's package,
which .ci/run installs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import jax
import numpy as np
import pytest

from aot.cache.index.entry import IndexEntry, utcnow
from aot.cache.index.sql import Index

FAKETIME = shutil.which("faketime")
X = [-2.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 3.0]

MODEL = """
import jax

def forward(x):
    return jax.nn.{act}(x)
"""

MANIFEST = """
[[function]]
name     = "clock.forward"
function = "clockmodel:forward"
args     = ["f32[8]"]
"""

SERVE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import aot

    fn = aot.load("clock.forward", cache=sys.argv[1], strict=True)
    print(json.dumps(np.asarray(fn(np.asarray(json.loads(sys.argv[2]), np.float32))).tolist()))
""")


def _run(args: list[str], *, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


@pytest.mark.slow
@pytest.mark.skipif(FAKETIME is None, reason="faketime is not installed (Debian package faketime; .ci/run installs it)")
def test_writers_with_clocks_2h_off_serve_what_was_warmed_last_and_gc_keeps_it(tmp_path: Path) -> None:
    code, cache, work = tmp_path / "code", tmp_path / "cache", tmp_path / "serve"
    code.mkdir()
    work.mkdir()
    (code / "manifest.toml").write_text(MANIFEST)
    env = {**os.environ, "PYTHONPATH": str(code)}
    warm = [sys.executable, "-m", "aot", "--cache", str(cache), "warmup", str(code / "manifest.toml"), "--relower"]
    rows: list[IndexEntry] = []  # v1 (gelu) by a host 2 h ahead, then v2 (relu) by one 2 h behind
    for offset, act in (("+2h", "gelu"), ("-2h", "relu")):
        (code / "clockmodel.py").write_text(MODEL.format(act=act))
        shutil.rmtree(code / "__pycache__", ignore_errors=True)
        assert FAKETIME is not None
        _run([FAKETIME, "-f", offset, *warm], env=env, cwd=code)
        with Index.for_folder(cache, read_only=True) as index:
            rows += [e for e in index.entries() if e.key not in {r.key for r in rows}]
    assert len(rows) == 2
    v1, v2 = rows
    # The -2h writer's entry is dated after the +2h writer's, not 4 h before it.
    assert v2.created_at > v1.created_at > utcnow() + timedelta(hours=1)

    # At true time: entries an hour "old" by the true clock are still the newest the index knows.
    gc = _run([sys.executable, "-m", "aot", "--cache", str(cache), "gc", "--older-than", "1h", "--yes", "--json"],
              env=os.environ.copy(), cwd=work)
    assert json.loads(gc.stdout)["entries"] == [], gc.stdout
    with Index.for_folder(cache, read_only=True) as index:
        assert {e.key for e in index.entries()} == {r.key for r in rows}  # nothing evicted

    served = _run([sys.executable, "-c", SERVE, str(cache), json.dumps(X)], env=os.environ.copy(), cwd=work)
    got = np.asarray(json.loads(served.stdout.splitlines()[-1]), np.float32)
    want = np.asarray(jax.jit(jax.nn.relu)(np.asarray(X, np.float32)))
    np.testing.assert_array_equal(got, want)  # what was warmed last: relu, bit for bit
    assert not np.array_equal(got, np.asarray(jax.jit(jax.nn.gelu)(np.asarray(X, np.float32))))


def _entry(key: str, when) -> IndexEntry:  # noqa: ANN001
    return IndexEntry(
        key=key, name="clock", program_fp="p" + key, env_fp="e", signature="x: f32[8]", platform="cpu",
        manifest="{}", exe_digest=None, hlo_digest=None, raw_size=0, stored_size=0, compile_seconds=0.0,
        created_at=when, last_used_at=when,
    )


def test_the_sqlite_clock_never_goes_back_behind_what_the_index_holds(tmp_path: Path) -> None:
    with Index.for_folder(tmp_path) as index:
        assert abs(index.now() - utcnow()) < timedelta(minutes=1)  # an empty index: this host's clock
        ahead = utcnow() + timedelta(hours=2)  # written by a host 2 h ahead
        index.bulk_insert([_entry("a" * 64, ahead)])
        now = index.now()
        assert now > ahead and now - ahead < timedelta(seconds=1)
        index.add(_entry("b" * 64, utcnow()), blob_sizes={}, stamp=True)  # a writer on true time
        added = index.get("b" * 64)
        assert added is not None and added.created_at > ahead  # after what the index held
        index.touch("b" * 64)  # a use is not dated before the latest one either
        touched = index.get("b" * 64)
        assert touched is not None and touched.last_used_at >= added.last_used_at

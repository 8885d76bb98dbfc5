"""Building and rehydrating executables: what was run can be stored, and a fresh
process runs programs that call JAX's CPU custom-call targets (LAPACK)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot.artifact import Artifact
from aot.build import build_artifact
from aot.rehydrate import load_executable
from tests.aot.helpers import assert_bitwise_equal

# Runs on every supported JAX release (.ci/version-suite.sh).
pytestmark = pytest.mark.version_suite


def sort_then_scale(x):
    return jnp.sort(x) * 2.0 + jnp.argsort(x)


def test_storing_after_jax_jit_ran_the_same_program(tmp_path):
    """jax.jit ran the program first: Lowered.compile() then hands out JAX's cached
    executable, which XLA CPU cannot serialize after a sort ran ('LessThan' is not
    serializable). A fresh copy is compiled and stored instead."""
    x = np.array([3.0, 1.0, 2.0, 0.5], np.float32)
    expected = jax.jit(sort_then_scale)(x)
    comp = aot.lower(sort_then_scale, x)
    exe = comp.compile()
    assert exe.compiled._executable is comp.lowered._lowering._executable  # JAX's own, already run
    build_artifact(exe, comp.portable_hlo(exe)).save(tmp_path)
    loaded = load_executable(Artifact.open(tmp_path))
    assert_bitwise_equal(loaded(x), expected)
    assert_bitwise_equal(exe(x), expected)  # the caller's executable still works


def test_storing_an_executable_after_it_ran(tmp_path):
    def top(x):
        return jax.lax.top_k(jnp.sort(x)[::-1], 2)

    comp = aot.lower(top, "f32[6]")
    exe = comp.compile()
    x = np.array([4.0, 9.0, 1.0, 7.0, 3.0, 8.0], np.float32)
    first = exe(x)
    build_artifact(exe, comp.portable_hlo(exe)).save(tmp_path)
    assert_bitwise_equal(load_executable(Artifact.open(tmp_path))(x), first)


def test_a_fresh_compile_bypasses_jax_in_memory_cache():
    comp = aot.lower(sort_then_scale, "f32[4]")
    cached, fresh = comp.compile(), comp.compile_fresh()
    assert fresh.compiled._executable.xla_executable is not cached.compiled._executable.xla_executable
    assert fresh.info.signature == cached.info.signature
    x = np.array([2.0, -1.0, 5.0, 0.0], np.float32)
    assert_bitwise_equal(fresh(x), cached(x))


def linalg_program(a, b):
    spd = a @ a.T + 4.0 * jnp.eye(a.shape[0], dtype=a.dtype)
    u, s, vt = jnp.linalg.svd(a)
    q, r = jnp.linalg.qr(a)
    sign, logdet = jnp.linalg.slogdet(spd)
    eigenvalues = jnp.linalg.eig(a)[0]
    return {
        "solve": jnp.linalg.solve(spd, b),
        "cholesky": jnp.linalg.cholesky(spd),
        "eigh": jnp.linalg.eigh(spd)[0],
        "svd": s,
        "qr": jnp.abs(r),
        "inv": jnp.linalg.inv(spd),
        "slogdet": sign * logdet,
        "eig": jnp.sort(jnp.abs(eigenvalues)),
        "lstsq": jnp.linalg.lstsq(a, b)[0],
    }


_LINALG_SERVER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax.monitoring

    work = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: work.append(event) if "/jax/core/compile/" in event else None
    )
    from aot.artifact import Artifact
    from aot.rehydrate import load_executable

    folder = sys.argv[1]
    data = np.load(folder + "/io.npz", allow_pickle=False)
    exe = load_executable(Artifact.open(folder + "/artifact"))
    out = jax.block_until_ready(exe(data["a"], data["b"]))
    same = {k: bool(np.asarray(v).tobytes() == data["ref_" + k].tobytes()) for k, v in out.items()}
    print(json.dumps({"same": same, "jax_work": work}))
    """
)


@pytest.mark.slow
def test_linalg_runs_in_a_fresh_process_that_never_compiled(tmp_path):
    """jnp.linalg on CPU calls LAPACK through custom calls that JAX initialises while
    lowering; a serving process that only deserializes crashed with SIGSEGV."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    comp = aot.lower(linalg_program, a, b)
    exe = comp.compile()
    reference = jax.jit(linalg_program)(a, b)
    assert_bitwise_equal(exe(a, b), reference)
    build_artifact(exe, comp.portable_hlo(exe)).save(tmp_path / "artifact")
    np.savez(tmp_path / "io.npz", a=a, b=b, **{f"ref_{k}": np.asarray(v) for k, v in reference.items()})

    proc = subprocess.run(
        [sys.executable, "-c", _LINALG_SERVER, str(tmp_path)],
        capture_output=True, text=True, env=dict(os.environ), cwd=tmp_path, timeout=240,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["jax_work"] == []  # nothing traced, lowered or compiled before it ran
    assert result["same"] == {k: True for k in reference}


# ---------------------------------------------------------------- cross-checks of narrow types


def keys_and_nibbles(key, q):
    k1, k2 = jax.random.split(key)
    return k2, (q.astype(jnp.float32) * 2).astype(jnp.int4), jax.random.normal(k1, (3,))


@pytest.fixture(scope="module")
def keyed():
    comp = aot.lower(keys_and_nibbles, "key<fry>[]", "i4[4]")
    exe = comp.compile()
    return build_artifact(exe, comp.portable_hlo(exe))


def test_typed_key_and_int4_avals_pass_the_manifest_cross_checks(keyed):
    """XLA shows a key<fry> array as u32[..., 2] and int4 as s4: the checks compare
    the physical layout, so an intact typed-key / int4 program loads and verifies."""
    from aot.rehydrate import stored_artifact_problems

    assert stored_artifact_problems(keyed) == []
    args = (jax.random.key(7), jnp.array([1, -2, 3, 0], jnp.int4))
    expected = jax.jit(keys_and_nibbles)(*args)
    got = load_executable(keyed)(*args)
    assert jax.random.key_data(got[0]).tolist() == jax.random.key_data(expected[0]).tolist()
    assert got[0].dtype == expected[0].dtype and got[1].dtype == jnp.int4
    assert_bitwise_equal(got[1:], expected[1:])


@pytest.mark.parametrize(
    ("index", "field", "value", "physical"),
    [
        (0, "shape", [2], "u32[2,2]"),  # one key -> two keys
        (0, "dtype", "key<rbg>", "u32[4]"),  # another key implementation: 4 words
        (1, "shape", [5], "s4[5]"),
        (1, "dtype", "int8", "s8[4]"),
    ],
)
def test_a_tampered_typed_key_or_int4_output_is_refused(keyed, index, field, value, physical):
    """out_avals are outside the key: a changed key or int4 output aval is corruption,
    caught against the executable's results before anything runs."""
    from dataclasses import replace

    from aot.rehydrate import stored_artifact_problems

    out_avals = [dict(a) for a in keyed.manifest.out_avals]
    out_avals[index][field] = value
    tampered = Artifact(replace(keyed.manifest, out_avals=tuple(out_avals)), dict(keyed.blobs))
    with pytest.raises(aot.CorruptArtifactError, match=rf"out_avals\[{index}\] is {re.escape(physical)} per device"):
        load_executable(tampered)
    # verify: caught by the portable HLO's avals (before deserializing anything)
    assert any(p.startswith("out_avals") for p in stored_artifact_problems(tampered))


@pytest.mark.parametrize("line", [
    "", "(f32[2], /*index=5*/f32[3])", "/*x*/", "a/*", "a*/b/*c*/d/*e", "/*/ a */", "/**/",
    "x/*a*/*/y", "/*a/*b*/c*/", "entry_computation_layout={(f32[8]{0}, /*index=1*/s32[])->f32[8]{0}}",
])
def test_comments_are_removed_from_the_layout_line_as_re_sub_would(line: str) -> None:
    from aot.executable_checks import without_comments

    assert without_comments(line) == re.sub(r"/\*.*?\*/", "", line)

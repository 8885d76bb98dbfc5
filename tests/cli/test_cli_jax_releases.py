"""Entries of two JAX releases in one cache, as the commands show them: ``ls`` (a JAX
column, ``jax`` in --json), ``release show`` (which member is which release's), ``why``
(the release that differs) and ``gc --jax-release`` (a retired release's entries, with
what they unpin). docs/jax-releases.md."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jax
import jaxlib
import pytest

import aot
from aot.artifact import Artifact
from aot.cache.index.refs import RefOrigin
from aot.fingerprint import Fingerprint, combined_key
from tests.cli.helpers import Invoke

pytestmark = pytest.mark.version_suite  # cross-release: on every supported JAX release

OLD = "0.9.2" if jax.__version__ != "0.9.2" else "0.9.1"  # a release other than this one


def _as_old_release(cache_dir: Path) -> tuple[str, str]:
    """Stores ``tiny`` as the JAX release OLD compiled it, and declares label prod with
    both releases' ``tiny`` (as a warm-up on each release does); (old key, this key)."""
    with aot.Cache(cache_dir) as cache:
        here = cache.entries("tiny")[0]
        artifact = cache.artifact(here)
        m = artifact.manifest
        environment = Fingerprint.of("environment", m.environment.as_dict() | {"jax": OLD, "jaxlib": OLD})
        old = replace(m, environment=environment, key=combined_key(m.program, environment),
                      jax_version=OLD, jaxlib_version=OLD)
        stored = cache.put_artifact(Artifact(old, artifact.blobs))
        members = [(e.name, e.signature, e.env_fp, e.key) for e in (stored, here)]
        cache.index.declare_release("prod", members, RefOrigin("warmup", commit="c1"))
        return stored.key, here.key


def _column(lines: list[str], header: str, following: str) -> list[str]:
    start, end = lines[0].index(header), lines[0].index(following)
    return [line[start:end].strip() for line in lines[1:]]


def test_ls_names_each_release_when_there_are_several(invoke: Invoke, warmed) -> None:
    plain = invoke("ls", "tiny").stdout.splitlines()
    assert " JAX " not in plain[0]  # one release: the column would say nothing
    old, here = _as_old_release(warmed)
    lines = invoke("ls", "tiny").stdout.splitlines()[:3]
    assert dict(zip(_column(lines, "KEY", "NAME"), _column(lines, "JAX", "TARGET"))) == {
        old[:12]: OLD, here[:12]: jax.__version__,
    }
    assert _column(lines, "ENV", "JAX") == [f"jaxlib {OLD} +1" if k == old[:12] else "this"
                                           for k in _column(lines, "KEY", "NAME")]
    data = json.loads(invoke("ls", "tiny", "--json").stdout)
    assert {e["key"]: (e["jax"], e["jaxlib"]) for e in data["entries"]} == {
        old: (OLD, OLD), here: (jax.__version__, jaxlib.__version__),
    }


def test_release_show_says_which_member_is_which_release(invoke: Invoke, warmed) -> None:
    old, here = _as_old_release(warmed)
    result = invoke("release", "show", "prod")
    assert result.exit_code == 0, result.output
    width = len(f"jax {jax.__version__}")
    assert sorted(result.stdout.splitlines()[1:]) == sorted([
        f"  {old[:12]}  cpu x8  {f'jax {OLD}'.ljust(width)}  tiny (f32[8], f32[8])",
        f"  {here[:12]}  cpu x8  jax {jax.__version__}  tiny (f32[8], f32[8])",
    ])
    members = json.loads(invoke("release", "show", "prod", "--json").stdout)["members"]
    assert {m["key"]: m["jax"] for m in members} == {old: OLD, here: jax.__version__}


def test_why_names_the_release_that_differs(invoke: Invoke, warmed) -> None:
    old, here = _as_old_release(warmed)
    with aot.Cache(warmed) as cache:
        assert cache.index.delete([here]) == 1  # only the old release's entry is left
    result = invoke("why", "tiny", "--arg", "f32[8]", "--arg", "f32[8]")
    lines = result.stdout.splitlines()
    assert lines[0] == f"tiny (x: f32[8], y: f32[8]): miss; nearest of 1 stored entry is {old[:12]} (x: f32[8], y: f32[8])"
    assert f"  jax {OLD} != {jax.__version__}" in lines
    assert lines[-1] == (
        "  (another JAX release's entry: aot.load recompiles its portable HLO here within jax.export's "
        "compatibility window, never with strict=True; warm this release up to serve it strict: "
        "docs/jax-releases.md)"
    )


def test_gc_jax_release_plans_then_retires(invoke: Invoke, warmed) -> None:
    old, here = _as_old_release(warmed)
    dry = invoke("gc", "--jax-release", OLD, "--dry-run")
    assert dry.exit_code == 0, dry.output
    lines = dry.stdout.splitlines()
    # Its executable and HLO are shared; its manifest (another release's) is its own.
    assert lines[0].startswith("would remove 1 entry and 1 blob, freeing ")
    assert lines[1].startswith(f"  {old[:12]}  tiny (x: f32[8], y: f32[8])  ")
    assert lines[1].endswith(f"  JAX release {OLD} retired; unpins: served ref of tiny, release prod")
    assert lines[2:] == [
        f"JAX release {OLD}: would drop the refs and release members of its 1 environment with its "
        "entries (no host of it serves them)",
    ]
    done = invoke("gc", "--jax-release", OLD, "--yes")
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines()[0].startswith("removed 1 entry and 1 blob,")
    assert done.stdout.splitlines()[-1].startswith(f"JAX release {OLD}: dropped the refs and release members")
    members = json.loads(invoke("release", "show", "prod", "--json").stdout)["members"]
    assert [m["key"] for m in members] == [here]
    again = invoke("gc", "--jax-release", OLD, "--dry-run")
    assert again.stdout.splitlines() == [
        again.stdout.splitlines()[0], f"JAX release {OLD}: no entry in this cache was compiled by it",
    ]
    assert again.stdout.startswith("nothing to collect")

"""Retiring a JAX release (``gc --jax-release``): its entries go with a plan, pinned or
not, with the refs and release members of its environments; the other release's
entries, refs and members stay, and its hosts are served as before. SQLite and
PostgreSQL indexes."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

import aot
from aot.cache.index.refs import RefOrigin
from tests.cache.conftest import Compiled, with_environment

pytestmark = pytest.mark.version_suite  # cross-release: on every supported JAX release

#: Another release than this one (what a host of it records in its environment).
OTHER = "0.9.2" if jax.__version__ != "0.9.2" else "0.9.1"


@pytest.fixture
def cache(index_url: str, tmp_path: Path) -> aot.Cache:
    with aot.Cache(index_url, blob_location=str(tmp_path / "blobs")) as c:
        yield c


def _declare(cache: aot.Cache, label: str, *entries, commit: str) -> None:  # noqa: ANN002
    """As a warm-up of ``entries`` at ``commit`` declares them: a new set keeping the
    members of other environments (a warm-up compiles for its own)."""
    envs = {e.env_fp for e in entries}
    cache.index.declare_release(
        label, [(e.name, e.signature, e.env_fp, e.key) for e in entries], RefOrigin("warmup", commit=commit),
        keep=lambda member: member.env_fp not in envs,
    )


def test_a_retired_release_goes_with_its_refs_and_members(cache: aot.Cache, compiled: Compiled) -> None:
    here = cache.put_artifact(compiled.tiny)
    old = cache.put_artifact(with_environment(compiled.tiny, jax=OTHER, jaxlib=OTHER))
    other = cache.put_artifact(with_environment(compiled.mlp[1], jax=OTHER, jaxlib=OTHER))
    cache.set_refs([here, old], RefOrigin("warmup"))
    _declare(cache, "prod", old, other, commit="c1")  # the fleet on the other release
    _declare(cache, "prod", here, commit="c2")  # this release warmed in before the flip: old ones kept
    assert {m.key for m in cache.release_members("prod", "tiny")} == {here.key, old.key}
    before = cache.blobs.list()

    plan = cache.gc(jax_release=OTHER, dry_run=True)
    assert sorted(v.key for v in plan.entries) == sorted([old.key, other.key])
    reasons = {v.key: v.reason for v in plan.entries}
    assert reasons[old.key] == f"JAX release {OTHER} retired; unpins: served ref of tiny, release prod, release prod (rollback target)"
    assert reasons[other.key] == f"JAX release {OTHER} retired; unpins: served ref of mlp.forward, release prod, release prod (rollback target)"
    assert plan.jax_release == OTHER and plan.retired_environments == tuple(sorted({old.env_fp, other.env_fp}))
    assert len(cache.entries()) == 3 and list(cache.blobs.list()) == list(before)  # a dry run changes nothing

    # Entries of JAX's own cache only (--kind jit): the release's aot entries, refs and
    # members are not touched.
    assert cache.gc(jax_release=OTHER, kind="jit").retired_environments == ()
    assert {m.key for m in cache.release_members("prod", "tiny")} == {here.key, old.key}

    done = cache.gc(jax_release=OTHER)
    assert done.executed and sorted(v.key for v in done.entries) == sorted([old.key, other.key])
    assert {e.key for e in cache.entries()} == {here.key}
    assert [m.key for m in cache.release_members("prod", "tiny")] == [here.key]
    assert [r.key for r in cache.refs_named("tiny")] == [here.key]
    # This release's hosts are served from the label as before, strict.
    fn = aot.load("tiny", cache=cache, release="prod", strict=True)
    np.testing.assert_array_equal(np.asarray(fn(*compiled.tiny_inputs)), compiled.tiny_expected)
    # Nothing of the retired release left to collect; the other release untouched.
    again = cache.gc(jax_release=OTHER, dry_run=True)
    assert again.entries == () and again.retired_environments == ()
    assert cache.gc(jax_release=jax.__version__, dry_run=True).entries[0].key == here.key

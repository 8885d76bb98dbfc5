"""A JAX upgrade without a cold start, with two real releases (this one and
``AOT_TEST_OTHER_JAX_PYTHON``'s) on one cache (docs/jax-releases.md): entries side by
side, each host served its own strict and bit for bit as its own ``jax.jit``; a warm-up
on the new release into the label the fleet serves, gated there; another release's
entry recompiled here through the ladder; the old release retired with a plan; JAX's
persistent cache through ``aot.jax_cache`` across both."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import pytest

import aot
from tests.jax_upgrade.helpers import release_tuple, aot_cli, worker

pytestmark = [pytest.mark.version_suite, pytest.mark.slow]

MANIFEST = '''
[[function]]
name     = "tiny"
function = "fixtures.models:tiny"
args     = ["f32[8]", "f32[8]"]

[[function]]
name     = "mlp.forward"
function = "fixtures.models:mlp_forward"
args     = ["@fixtures.models:mlp_param_specs", "f32[8,784]"]
'''
NAMES = ("tiny", "mlp.forward")


@pytest.fixture
def manifest(tmp_path: Path) -> str:
    path = tmp_path / "serve.toml"
    path.write_text(MANIFEST)
    return str(path)


def _served_own(result: dict[str, object], *, stored: bool = False) -> None:
    """Every name served bit for bit as this process's own jax.jit; with ``stored``
    False, nothing was compiled or stored to serve it."""
    assert result["results"] == {n: {"identical": True, "dtype": "float32"} for n in NAMES}, result
    if not stored:
        assert result["entries_after"] == result["entries_before"]


def _jax_of(location: str) -> dict[str, str]:
    """{key: jax release} of the cache's entries, as `aot ls --json` names them."""
    with aot.Cache(location) as cache:
        from aot.cache.reports.listing import list_entries

        return {r.entry.key: r.environment.jax for r in list_entries(cache, None).rows}


def test_another_releases_entry_is_served_here_through_the_ladder(
    other_python: tuple[str, str], this_python: str, manifest: str, tmp_path: Path,
) -> None:
    python, other = other_python
    if release_tuple(other) > release_tuple(jax.__version__):
        pytest.skip(f"the ladder serves an older release's entry on a newer one: {other} is newer than "
                    f"{jax.__version__}; this test runs on the newer release")
    location = str(tmp_path / "cache")
    aot_cli(python, "--cache", location, "warmup", manifest)
    assert sorted(_jax_of(location).values()) == [other, other]
    # strict: never compiled here, and the refusal names both releases.
    with aot.Cache(location) as cache, pytest.raises(aot.SignatureNotFoundError) as info:
        aot.load("tiny", cache=cache, strict=True)
    assert f"jax {other} != {jax.__version__}" in str(info.value)
    # Within jax.export's window: recompiled from the stored portable HLO, stored for
    # this release beside the other's, bit for bit as jax.jit here.
    result = worker(this_python, "serve", location)
    _served_own(result, stored=True)
    assert sorted(_jax_of(location).values()) == sorted([other, other, jax.__version__, jax.__version__])
    listing = aot_cli(this_python, "--cache", location, "ls", "tiny").stdout.splitlines()
    assert listing[0].split() == ["KEY", "NAME", "SIGNATURE", "ENV", "JAX", "TARGET", "SIZE", "COMPILED",
                                  "LAST", "USED", "HITS", "STATE", "SERVED"]
    start, end = listing[0].index("JAX"), listing[0].index("TARGET")
    assert sorted(line[start:end].strip() for line in listing[1:3]) == sorted([other, jax.__version__]), listing


@pytest.mark.parametrize("index", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_one_cache_through_an_upgrade_of_the_fleet(
    other_python: tuple[str, str], this_python: str, manifest: str, index: str, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The runbook of docs/jax-releases.md, on the embedded default and on PostgreSQL; in
    CI (.ci/run) across Pythons too: the other release is 0.10.2 on Python 3.11, this one
    the newest on Python 3.13."""
    old_python, old = other_python
    new = jax.__version__
    url = str(tmp_path / "cache") if index == "sqlite" else request.getfixturevalue("postgres_url")
    # Before: the fleet runs the other release and serves label prod.
    aot_cli(old_python, "--cache", url, "warmup", manifest, "--release", "prod", "--commit", "c1")
    _served_own(worker(old_python, "serve", url, "--release", "prod", "--strict"))
    # The gate on the new release fails until it is warmed: nothing of its own is stored.
    cold = aot_cli(this_python, "--cache", url, "verify", "--manifest", manifest, "--strict", check=False)
    assert cold.returncode == 1 and "stored for another environment" in cold.stdout, cold.stdout + cold.stderr
    assert f"{old} != {new}" in cold.stdout, cold.stdout
    # Warm before the flip: a CI job on the new release warms the same manifest into
    # prod; the old release's members stay, for the hosts not flipped yet.
    warm = aot_cli(this_python, "--cache", url, "warmup", manifest, "--release", "prod", "--commit", "c2")
    assert (f"release prod: kept 2 members of other JAX releases ({old}), which hosts of those releases "
            "serve") in warm.stdout + warm.stderr
    # The gate, on the new release.
    gate = aot_cli(this_python, "--cache", url, "verify", "--manifest", manifest, "--strict", check=False)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    show = aot_cli(this_python, "--cache", url, "release", "show", "prod", "--json")
    members = json.loads(show.stdout)["members"]
    assert sorted((m["name"], m["jax"]) for m in members) == sorted(
        (name, release) for name in NAMES for release in (old, new)
    )
    # The rolling upgrade: hosts of both releases served from one label, each its own
    # entry (strict: nothing compiled), bit for bit as its own jax.jit.
    _served_own(worker(this_python, "serve", url, "--release", "prod", "--strict"))
    _served_own(worker(old_python, "serve", url, "--release", "prod", "--strict"))  # also a host rolled back
    # JAX's own persistent cache through aot.jax_cache, both releases on the one cache:
    # each release's second process hits its own entries, computing what its first did.
    firsts = {python: worker(python, "jit", url) for python in (old_python, this_python)}
    for python, first in firsts.items():
        again = worker(python, "jit", url)
        assert again["counts"]["hits"] == len(NAMES) and again["counts"]["misses"] == 0, (first, again)
        assert again["results"] == first["results"]
    # Retire the old release once no host runs it: planned, then carried out.
    plan = aot_cli(this_python, "--cache", url, "gc", "--jax-release", old, "--dry-run", "--json")
    planned = json.loads(plan.stdout)
    assert sorted(e["name"] for e in planned["entries"]) == sorted(NAMES)
    assert all(e["reason"].startswith(f"JAX release {old} retired; unpins: ") for e in planned["entries"])
    aot_cli(this_python, "--cache", url, "gc", "--jax-release", old, "--yes")
    with aot.Cache(url) as cache:
        assert {e.name for e in cache.entries()} == set(NAMES)
        assert {m.key for n in NAMES for m in cache.release_members("prod", n)} == {e.key for e in cache.entries()}
    _served_own(worker(this_python, "serve", url, "--release", "prod", "--strict"))

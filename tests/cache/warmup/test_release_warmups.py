"""Warm-ups that declare releases, as a library: several manifests and shards into one
set, the load advice for a release declared for another environment, and the seconds a
warm-up reports per entry."""

from __future__ import annotations

from pathlib import Path

import pytest

import aot
from aot.cache.index.refs import RefOrigin
from aot.cache.warmup.manifest import expand, parse_manifest
from aot.cache.warmup.run import kept_notice, other_releases_notice, run_warmup
from tests.aot.test_targets import needs_libtpu

REPO = Path(__file__).resolve().parents[3]

TINY = """
[[function]]
name   = "tiny"
function = "fixtures.models:tiny"
args   = ["f32[{n}]", "f32[{n}]"]
vary   = { n = [4, 8] }
"""

MATMUL = """
[[function]]
name   = "matmul"
function = "fixtures.models:matmul"
args   = ["f32[2,3]", "f32[3,2]"]
"""


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def _items(text: str) -> list:
    return expand(parse_manifest(text, str(REPO / "m.toml")))


def _names(location: Path, label: str) -> list[tuple[str, str]]:
    with aot.Cache(location) as cache:
        return sorted((m.name, m.signature) for m in cache.release(label).members)


def test_shards_and_manifests_of_one_commit_make_one_set(tmp_path: Path) -> None:
    location = tmp_path / "c"
    origin = RefOrigin("ci", commit="abc")
    for shard in ((1, 2), (2, 2)):  # the shards of one manifest, then another manifest
        assert run_warmup(location, _items(TINY), shard=shard, origin=origin, release="rc").ok
    assert run_warmup(location, _items(MATMUL), origin=origin, release="rc").ok
    assert _names(location, "rc") == [
        ("matmul", "f32[2,3], f32[3,2]"), ("tiny", "f32[4], f32[4]"), ("tiny", "f32[8], f32[8]"),
    ]
    with aot.Cache(location) as cache:
        assert len(cache.release_history("rc")) == 1
    # Another commit warms one of them: a new set, which keeps the other manifest's
    # members (reported) until a warm-up of that run replaces them; --replace starts over.
    report = run_warmup(location, _items(MATMUL), origin=RefOrigin("ci", commit="def"), release="rc")
    assert report.ok and sorted(m.name for m in report.carried) == ["tiny", "tiny"]
    assert "kept" not in report.summary()  # a warning, logged once when declared
    assert kept_notice("rc", report.carried).startswith(
        "release rc: kept 2 members of its previous set that this warm-up does not compile: tiny (f32[")
    assert len(_names(location, "rc")) == 3
    with aot.Cache(location) as cache:
        assert len(cache.release_history("rc")) == 2
    again = run_warmup(location, _items(TINY), origin=RefOrigin("ci", commit="def"), release="rc")
    assert again.ok and not again.carried  # the same run: the set it opened, nothing kept
    with aot.Cache(location) as cache:
        assert len(cache.release_history("rc")) == 2
    assert run_warmup(location, _items(MATMUL), origin=RefOrigin("ci", commit="ghi"), release="rc",
                      replace=True).ok
    assert _names(location, "rc") == [("matmul", "f32[2,3], f32[3,2]")]


@needs_libtpu
def test_a_release_for_a_target_loaded_here_advises_no_warmup_into_it(tmp_path: Path) -> None:
    location = tmp_path / "c"
    items = _items('target = "tpu:v5e:1x1"\n' + MATMUL)
    assert run_warmup(location, items, origin=RefOrigin("ci", commit="abc"), release="prod").ok
    with pytest.raises(aot.ReleaseNotFoundError) as raised:
        aot.load("matmul", cache=str(location), release="prod")
    message = str(raised.value)
    assert "compiled for tpu:v5e:1x1, this process runs cpu x8" in message
    advice = message.splitlines()[-1]
    assert advice == (
        "Serve release 'prod' where its members were compiled (the target or host each reason "
        "names), or warm this environment up under a label of its own (aot warmup MANIFEST "
        "--release prod-cpu) and load that label"
    )
    # What it advises leaves prod's set as it was.
    assert run_warmup(location, _items(MATMUL), origin=RefOrigin("ci", commit="abc"), release="prod-cpu").ok
    assert aot.load("matmul", cache=str(location), release="prod-cpu") is not None
    with aot.Cache(location) as cache:
        (member,) = cache.release("prod").members
        assert member.key == next(r.key for r in cache.refs_named("matmul") if r.env_fp == member.env_fp)
        assert len(cache.release_history("prod")) == 1


@pytest.mark.slow
def test_each_entry_reports_its_own_seconds_once(tmp_path: Path) -> None:
    # A train step of the fixture transformer: a compile long enough that counting it twice
    # (its compile, and the wait for it) would exceed the wall time.
    items = _items("""
[[function]]
name   = "train"
function = "fixtures.models:transformer_train_step"
args   = ["@fixtures.models:transformer_param_specs", "@fixtures.models:transformer_batch_spec"]
""")
    report = run_warmup(tmp_path / "c", items)
    (result,) = report.results
    assert result.status == "compiled", result.error
    assert result.compile_seconds is not None and result.compile_seconds > 0.2
    # Counted twice, the item's seconds were lowering + 2 x compile + store: more than the
    # run's wall time, which holds each once. (A ratio to compile_seconds alone is not a
    # bound: under CI load, tracing this train step's grad took longer than its compile.)
    assert result.compile_seconds <= result.seconds <= report.seconds


def test_a_warm_up_on_a_new_jax_release_keeps_the_old_releases_members(tmp_path: Path) -> None:
    """The rolling upgrade (docs/jax-releases.md): the label holds both releases' members;
    the warm-up says the old release's are kept for its hosts, not stale."""
    from tests.cache.conftest import with_environment

    location = tmp_path / "c"
    assert run_warmup(location, _items(TINY), origin=RefOrigin("ci", commit="c1")).ok
    with aot.Cache(location) as cache:
        old = [cache.put_artifact(with_environment(cache.artifact(e), jax="0.9.2", jaxlib="0.9.2"))
               for e in cache.entries("tiny")]
        cache.index.declare_release("prod", [(e.name, e.signature, e.env_fp, e.key) for e in old], RefOrigin("ci"))
    report = run_warmup(location, _items(TINY), origin=RefOrigin("ci", commit="c2"), release="prod")
    assert report.ok and sorted(m.key for m in report.other_releases) == sorted(e.key for e in old)
    assert report.carried_releases == ("0.9.2",) and "kept" not in report.summary()
    assert other_releases_notice("prod", report.other_releases, report.carried_releases) == (
        "release prod: kept 2 members of other JAX releases (0.9.2), which hosts of those releases serve"
    )
    with aot.Cache(location) as cache:
        assert len(cache.release("prod").members) == 4  # two per release

"""aot.cache.warmup.run as a library: parsing, expansion, parallel runs, coverage.

Run from the repository root, as the CLI tests are: the fixture manifest's targets
(``fixtures.models``) are imported from there, also by worker processes.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

import aot
from aot.cache.warmup.run import (
    WarmupItem,
    coverage,
    expand,
    item_signature,
    load_manifest,
    parse_manifest,
    run_warmup,
)
from tests.cli.helpers import MANIFEST, MANIFEST_LABELS, REPO


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def test_fixture_manifest_expands_to_its_buckets() -> None:
    manifest = load_manifest(MANIFEST)
    assert [(f.name, f.buckets, f.line) for f in manifest.functions] == [
        ("mlp.forward", 3, 17), ("tiny", 1, 23), ("allreduce", 1, 28),
    ]
    items = expand(manifest)
    assert [i.label for i in items] == MANIFEST_LABELS
    assert items[1].args == ("@fixtures.models:mlp_param_specs", "f32[8,784]")
    assert items[1].name == "mlp.forward" and items[1].bucket == (("batch", 8),)
    assert items[4].pmap == "i"
    assert items[0].base_dir == str(MANIFEST.parent)
    # Items are plain data: they cross into spawned worker processes.
    assert pickle.loads(pickle.dumps(items[1])) == items[1]


def test_vary_is_a_cartesian_product_and_keeps_static_types() -> None:
    manifest = parse_manifest("""
[[function]]
name = "f"
function = "m:f"
args = ["f32[{b},{d}]"]
static = { depth = "{d}", tag = "d{d}" }
vary = { b = [1, 2], d = [16, 32, 64] }
""")
    items = expand(manifest)
    assert len(items) == 6
    assert {i.name for i in items} == {"f"}
    assert items[0].args == ("f32[1,16]",) and items[-1].args == ("f32[2,64]",)
    assert dict(items[-1].static) == {"depth": 64, "tag": "d64"}
    assert items[-1].label == "f[b=2,d=64]"


def test_inline_tables_have_no_line_numbers() -> None:
    manifest = parse_manifest('function = [{ name = "f", function = "m:f", args = ["f32[2]"] }]', "x.toml")
    assert manifest.functions[0].line is None
    assert expand(manifest)[0].source == "x.toml"


def test_item_signature_matches_the_compiled_signature(tmp_path: Path) -> None:
    items = expand(load_manifest(MANIFEST))
    report = run_warmup(str(tmp_path / "c"), items[:2] + items[3:])
    by_label = {r.label: r.signature for r in report.results}
    for item in items[:2] + items[3:]:
        assert item_signature(item) == by_label[item.label]


def test_run_warmup_reports_in_item_order(tmp_path: Path) -> None:
    items = expand(load_manifest(MANIFEST))[3:]
    seen: list[str] = []
    report = run_warmup(str(tmp_path / "c"), items, on_result=lambda r: seen.append(r.status))
    assert seen == ["compiled", "compiled"]
    assert (report.compiled, report.hit, report.failed, report.ok) == (2, 0, 0, True)
    assert report.summary().startswith("2 entries: 2 compiled, 0 hit, 0 failed in ")
    again = run_warmup(aot.Cache(tmp_path / "c"), items)
    assert [r.status for r in again.results] == ["hit", "hit"]
    assert [r.key for r in again.results] == [r.key for r in report.results]


def test_one_job_fails_only_the_entry_whose_compile_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # --jobs 1 compiles in a thread while it lowers the next entry and stores the previous
    # one: a compile that fails there is that entry's failure, not the warm-up's.
    from aot.computation import MeshComputation

    compile_for_real = MeshComputation.compile

    def compile(self: MeshComputation):  # type: ignore[no-untyped-def]
        if self.name == "tiny":
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while compiling")
        return compile_for_real(self)

    monkeypatch.setattr(MeshComputation, "compile", compile)
    items = expand(load_manifest(MANIFEST))
    seen: list[str] = []
    report = run_warmup(str(tmp_path / "c"), items, jobs=1, on_result=lambda r: seen.append(r.label))
    assert sorted(seen) == sorted(MANIFEST_LABELS)  # each entry reported once
    assert [r.label for r in report.results] == MANIFEST_LABELS
    statuses = {r.label: r.status for r in report.results}
    assert statuses == {label: "failed" if label == "tiny" else "compiled" for label in MANIFEST_LABELS}
    failure = report.failures[0]
    assert "out of memory while compiling" in (failure.error or "")
    assert sorted(e.name for e in aot.Cache(tmp_path / "c").entries()) == [
        "allreduce", "mlp.forward", "mlp.forward", "mlp.forward",
    ]


@pytest.mark.slow
def test_parallel_warmup_survives_a_dying_worker(tmp_path: Path) -> None:
    """isolate=True: hits are found without a worker, misses compile in spawned
    workers (which open the cache with the caller's signing key), and a worker that
    dies fails only its own entry."""
    location = str(tmp_path / "c")
    run_warmup(
        aot.Cache(location, signing_key="ci-secret"),
        [WarmupItem("tiny", "fixtures.models:tiny", ("f32[8]", "f32[8]"))],
    )
    items = [
        WarmupItem("tiny", "fixtures.models:tiny", ("f32[8]", "f32[8]")),       # hit
        WarmupItem("dies", "tests.cli.models:dies_in_worker", ("f32[4]",)),           # kills its worker
        WarmupItem("tiny", "fixtures.models:tiny", ("f32[2]", "f32[2]")),       # compiles
        WarmupItem("broken", "tests.cli.models:broken", ("f32[4]",)),                 # fails (the error is recorded)
        WarmupItem("tiny64", "fixtures.models:tiny", ("f64[2]", "f64[2]"), x64=True),  # x64 in the worker
    ]
    signed = aot.Cache(location, signing_key="ci-secret")
    report = run_warmup(signed, items, jobs=2, isolate=True)
    statuses = [(r.label, r.status) for r in report.results]
    assert statuses == [
        ("tiny", "hit"), ("dies", "failed"), ("tiny", "compiled"), ("broken", "failed"), ("tiny64", "compiled"),
    ]
    assert report.results[4].signature == "f64[2], f64[2]"
    x64_entry = signed.index.get(report.results[4].key)
    assert '"x64":"true"' in x64_entry.manifest
    assert report.results[1].error == "the worker process died while compiling it (crash or out of memory)"
    # The worker's failure arrives whole: the full message, the user's line, the traceback.
    assert report.results[3].error.splitlines() == [
        "ValueError: this model is broken",
        "second line of the message",
        '  at tests/cli/models.py:39 in broken: raise ValueError("this model is broken\\nsecond line of the message")',
    ]
    assert "Traceback (most recent call last)" in report.results[3].traceback
    assert 'tests/cli/models.py", line 39, in broken' in report.results[3].traceback
    assert report.to_dict()["failed"] == 2
    # The workers opened the cache as the caller did: with its signing key.
    compiled = signed.index.get(report.results[2].key)
    assert json.loads(compiled.manifest)["hmac"]


def test_parallel_warmup_compiles_here_and_in_a_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """jobs=2: this process and a worker process each take the next entry: the first
    entry (traced here) waits until the second one was traced by the worker."""
    import os

    flag = tmp_path / "partner-traced"
    monkeypatch.setenv("AOT_TEST_PARTNER_FLAG", str(flag))
    items = [
        WarmupItem("wait", "tests.cli.models:waits_for_partner", ("f32[4]",)),
        WarmupItem("partner", "tests.cli.models:partner", ("f32[4]",)),
    ]
    report = run_warmup(str(tmp_path / "c"), items, jobs=2)
    assert [(r.label, r.status) for r in report.results] == [("wait", "compiled"), ("partner", "compiled")]
    assert int(flag.read_text()) != os.getpid()
    again = run_warmup(str(tmp_path / "c"), items, jobs=2)
    assert [(r.status, r.lowered) for r in again.results] == [("hit", True), ("hit", True)]


def test_a_spec_callable_is_called_once_per_warmup(tmp_path: Path) -> None:
    import tests.cli.models

    items = expand(parse_manifest(
        '[[function]]\nname = "scaled"\nfunction = "tests.cli.models:add3"\n'
        'args = ["@tests.cli.models:counted_specs", "@tests.cli.models:counted_specs", "f32[{n}]"]\n'
        'vary = { n = [1, 4] }\n'
    ))
    before = len(tests.cli.models.SPEC_CALLS)
    report = run_warmup(str(tmp_path / "c"), items)
    assert [r.status for r in report.results] == ["compiled", "compiled"]
    assert len(tests.cli.models.SPEC_CALLS) - before == 1  # not once per use and bucket
    run_warmup(str(tmp_path / "c"), items)
    assert len(tests.cli.models.SPEC_CALLS) - before == 2  # but again in the next warm-up


def test_parallel_warmup_of_a_cached_manifest_starts_no_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = expand(load_manifest(MANIFEST))
    run_warmup(str(tmp_path / "c"), items)
    from aot.cache.warmup.workers import WorkerPool

    def no_worker(*args, **kwargs):  # pragma: no cover - must not run
        raise AssertionError("a worker was started for a cached entry")

    monkeypatch.setattr(WorkerPool, "add", no_worker)
    report = run_warmup(str(tmp_path / "c"), items, jobs=2, isolate=True)
    assert (report.hit, report.compiled, report.failed) == (5, 0, 0)


def test_coverage_lists_what_is_missing_for_this_environment(tmp_path: Path) -> None:
    items = expand(load_manifest(MANIFEST))
    cache = aot.Cache(tmp_path / "c")
    assert [i.label for i in coverage(cache, items)] == MANIFEST_LABELS
    run_warmup(cache, items[:4])
    assert [i.label for i in coverage(cache, items)] == ["allreduce"]
    run_warmup(cache, items[4:])
    assert coverage(cache, items) == []
    entry = cache.entries("tiny")[0]
    cache.index.quarantine(entry.key, "test")
    assert [i.label for i in coverage(cache, items)] == ["tiny"]


def test_item_validation() -> None:
    with pytest.raises(aot.ManifestError, match="pmap entries take positional args only; remove mesh"):
        WarmupItem("x", "m:f", ("f32[8]",), pmap="i", mesh=(("data", 8),))
    with pytest.raises(aot.ManifestError, match="is not MODULE:ATTRIBUTE"):
        WarmupItem("x", "m.f")


def test_a_64_bit_spec_error_says_how_to_opt_in() -> None:
    from aot.cache.warmup.functions import x64_hint
    from aot.errors import SpecError

    refused = SpecError("spec 'f64[8]' needs 64-bit types, but x64 is disabled")
    plain = WarmupItem("t", "fixtures.models:tiny", ("f64[8]", "f64[8]"))
    hinted = x64_hint(plain, refused)
    assert str(hinted) == (
        "spec 'f64[8]' needs 64-bit types, but x64 is disabled (to compile this entry with "
        "64-bit types, set x64 = true in its [[function]] table, or pass --x64 to aot compile)"
    )
    opted_in = WarmupItem("t", "fixtures.models:tiny", ("f64[8]", "f64[8]"), x64=True)
    assert x64_hint(opted_in, refused) is refused
    narrow = WarmupItem("t", "fixtures.models:tiny", ("f32[8]", "f32[8]"))
    assert x64_hint(narrow, refused) is refused
    aliased = WarmupItem("t", "fixtures.models:tiny", ("float64[8]",), kwargs=(("y", "i64[]"),))
    assert str(x64_hint(aliased, refused)).endswith("or pass --x64 to aot compile)")
    unrelated = SpecError("malformed sharding 'da-ta'")
    assert x64_hint(plain, unrelated) is unrelated

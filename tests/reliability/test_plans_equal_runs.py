"""Every plan equals its run (issue 57): on random small caches -- blobs shared between
entries, refs, release labels, entries of several JAX releases (rows whose environment
says another release, some with that release's own HLO export of a program) -- each
destructive command's plan (``--dry-run``) names exactly the entries, blobs and bytes
its run then removes: gc in every mode, ``gc --jax-release``, ``rm``, ``release rm``
and ``repair``.

The cache is built once per example through the library (real compiled artifacts, their
environments and HLO varied), the plan taken, then the run, and their counts compared.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import aot
from aot.artifact import PORTABLE_HLO, Artifact, BlobRef
from aot.cache.index.refs import RefOrigin
from tests.cache.conftest import Compiled, with_environment

#: JAX-release-like environments: what hosts of each release record.
RELEASES = ("0.9.2", "0.10.2", "0.11.0")
LABELS = ("prod", "canary")


@pytest.fixture(scope="module")
def compiled() -> Compiled:
    return Compiled()


def _variant(artifact: Artifact, release: str, own_hlo: bool) -> Artifact:
    """``artifact`` as a host of ``release`` stores it: its environment says so; with
    ``own_hlo`` its portable HLO is that release's own export (other bytes), as an
    upgrade gives: the program's row keeps the HLO of the entry stored first."""
    changed = with_environment(artifact, jax=release, jaxlib=release)
    if not own_hlo:
        return changed
    blobs = dict(changed.blobs)  # digest -> bytes
    hlo = blobs.pop(changed.manifest.blobs[PORTABLE_HLO].digest) + f"exported by jax {release}".encode()
    digest = hashlib.sha256(hlo).hexdigest()
    blobs[digest] = hlo
    refs = {**changed.manifest.blobs, PORTABLE_HLO: BlobRef(digest, len(hlo))}
    return Artifact(replace(changed.manifest, blobs=refs), blobs)


entry_specs = st.lists(
    st.tuples(st.sampled_from(("tiny", "mlp1", "mlp2")), st.sampled_from(RELEASES), st.booleans()),
    min_size=1, max_size=7, unique_by=lambda t: (t[0], t[1]),
)
#: Each command as likely as the others (gc's modes share gc's share).
operations = st.one_of(
    st.tuples(st.just("gc"), st.one_of(
        st.fixed_dictionaries({"older_than": st.sampled_from(["0s", None])}),
        st.fixed_dictionaries({"max_size": st.sampled_from([0, 20_000, 200_000])}),
        st.fixed_dictionaries({"superseded": st.just(True)}),
        st.fixed_dictionaries({"older_than": st.just("0s"), "kind": st.just("aot")}),
    )),
    st.tuples(st.just("gc"), st.fixed_dictionaries({"jax_release": st.sampled_from(RELEASES)})),
    st.tuples(st.just("rm"), st.fixed_dictionaries({"target": st.sampled_from(["tiny", "mlp*", "*"])})),
    st.tuples(st.just("release rm"), st.fixed_dictionaries({"labels": st.sampled_from([("prod",), LABELS])})),
    st.tuples(st.just("repair"), st.fixed_dictionaries({"keep": st.sampled_from([0.5, 0.0])})),
)


def _build(folder: Path, compiled: Compiled, specs: list[tuple[str, str, bool]], refs: list[bool],
           members: list[tuple[bool, bool]]) -> aot.Cache:
    programs = {"tiny": compiled.tiny, "mlp1": compiled.mlp[1], "mlp2": compiled.mlp[2]}
    cache = aot.Cache(folder)
    entries = [cache.put_artifact(_variant(programs[p], release, own)) for p, release, own in specs]
    with_refs = [e for e, r in zip(entries, refs) if r]
    if with_refs:
        cache.set_refs(with_refs, RefOrigin("warmup"))
    for i, label in enumerate(LABELS):
        chosen = [e for e, m in zip(entries, members) if m[i]]
        if chosen:
            cache.index.declare_release(label, [(e.name, e.signature, e.env_fp, e.key) for e in chosen],
                                        RefOrigin("ci", commit=f"c-{label}"), set_refs=False)
    return cache


def _gc_counts(plan: Any) -> tuple[int, int, int]:
    return (len(plan.entries), len(plan.blobs), plan.bytes_freed)


def _run(cache: aot.Cache, folder: Path, op: str, args: dict[str, Any]) -> tuple[Any, Any]:
    """(the plan's counts, the run's counts) of one command."""
    if op == "gc":
        planned = cache.gc(dry_run=True, **args)
        return _gc_counts(planned), _gc_counts(cache.gc(**args))
    if op == "rm":
        from aot.cache.admin.removal import execute_removal, plan_removal

        try:
            planned = plan_removal(cache, args["target"])
        except aot.ArtifactNotFoundError:
            return None, None
        done = execute_removal(cache, planned, force=True)
        return _gc_counts(planned), _gc_counts(done)
    if op == "release rm":
        labels = [label for label in args["labels"] if label in {r.label for r in cache.releases()}]
        if not labels:
            return None, None
        planned = cache.remove_release(labels, dry_run=True)
        done = cache.remove_release(labels)
        counted = [(len(p.releases), sum(r.sets for r in p.releases), len(p.unpinned), len(p.still_pinned))
                   for p in (planned, done)]
        return counted[0], counted[1]
    from aot.cache.admin.repair import plan_repair, repair_index

    cache.close()
    index = folder / "index.sqlite"
    with open(index, "r+b") as f:
        f.truncate(int(index.stat().st_size * args["keep"]))
    planned = plan_repair(folder)
    done = repair_index(planned)
    keys = ("kept", "entries", "rebuilt", "releases_rebuilt", "targets_rebuilt", "refs_rebuilt", "orphan_blobs")
    return ({k: planned.to_dict()[k] for k in keys}, {k: done.to_dict()[k] for k in keys})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=entry_specs, refs=st.lists(st.booleans(), min_size=7, max_size=7),
    members=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=7, max_size=7), operation=operations,
)
def test_each_plan_equals_its_run(compiled: Compiled, specs, refs, members, operation) -> None:  # noqa: ANN001
    folder = Path(tempfile.mkdtemp(prefix="plans-")) / "cache"
    try:
        cache = _build(folder, compiled, specs, refs, members)
        op, args = operation
        event(f"{op} {sorted(args)}")
        try:
            planned, done = _run(cache, folder, op, args)
        finally:
            cache.close()
        assert planned == done, (op, args, specs)
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)


def test_a_retired_release_with_its_own_hlo_plans_what_it_removes(compiled: Compiled, tmp_path: Path) -> None:
    """The day's case: entries of 0.9.2 and 0.10.2 of the same programs, each release's
    HLO export its own, the 0.9.2 entries stored first (the programs rows name their
    HLO). Retiring 0.9.2 removes its entries and only the blobs nothing else keeps: the
    plan says so, and the run removes exactly that."""
    specs = [(p, "0.9.2", True) for p in ("tiny", "mlp1", "mlp2")] + [(p, "0.10.2", True) for p in ("tiny", "mlp1")]
    with _build(tmp_path / "cache", compiled, specs, [True] * 5, [(True, False)] * 5) as cache:
        planned = cache.gc(jax_release="0.9.2", dry_run=True)
        done = cache.gc(jax_release="0.9.2")
        assert _gc_counts(planned) == _gc_counts(done)
        assert len(done.entries) == 3
        # tiny's and mlp1's programs live on in 0.10.2: their rows keep the 0.9.2 HLO.
        # mlp2's program goes: its HLO and each entry's executable and manifest blobs.
        assert len(done.blobs) == 5  # the three manifests, mlp2's executable and its program's HLO
        assert cache.verify().ok

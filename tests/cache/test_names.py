"""One name rule on every path, checked before any blob is written: SQLite
accepted names over 512 characters and control characters, PostgreSQL refused them at
row insert after the blobs were written (orphans)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import aot
from aot.artifact import Artifact
from aot.cache.names import NAME_MAX, InvalidNameError, check_name, name_problem

BAD = ["", "x" * (NAME_MAX + 1), "line\nbreak", "nul\x00", "esc\x1b[31m", "del\x7f", "c1\x85", "lone\ud800"]
GOOD = ["mlp.forward", "x" * NAME_MAX, "model/v2:forward[batch=8]", "ünïcødé.前向", "a b", "../../etc/passwd"]


@pytest.mark.parametrize("name", GOOD)
def test_names_the_rule_accepts(name: str) -> None:
    assert name_problem(name) is None and check_name(name) == name


@pytest.mark.parametrize("name", BAD)
def test_names_the_rule_refuses(name: str) -> None:
    with pytest.raises(InvalidNameError) as err:
        check_name(name)
    assert isinstance(err.value, aot.CacheError) and isinstance(err.value, ValueError)
    assert "characters" in str(err.value)


@pytest.mark.parametrize("name", ["x" * (NAME_MAX + 1), "tab\there", "nul\x00"])
def test_put_refuses_a_bad_name_before_writing_any_blob(cache: aot.Cache, compiled, name: str) -> None:  # noqa: ANN001
    """On every backend (SQLite and PostgreSQL, folder and database blobs)."""
    artifact = compiled.tiny
    bad = Artifact(replace(artifact.manifest, name=name), dict(artifact.blobs))
    with pytest.raises(InvalidNameError):
        cache.put(bad)
    assert cache.entries() == [] and cache.blobs.digests() == []
    assert cache.index.leased_digests() == set()
    cache.put(_renamed(artifact, "x" * NAME_MAX))
    assert [e.name for e in cache.entries()] == ["x" * NAME_MAX]  # the longest name fits both databases
    assert cache.verify().ok


def _renamed(artifact: Artifact, name: str) -> Artifact:
    """``artifact`` stored under ``name``, its program fingerprint's ``name`` part and
    key agreeing (verify cross-checks the name against the fingerprint)."""
    from aot.fingerprint import combined_key

    manifest = artifact.manifest
    program = replace(manifest.program, parts=tuple((k, name if k == "name" else v) for k, v in manifest.program.parts))
    return Artifact(
        replace(manifest, name=name, program=program, key=combined_key(program, manifest.environment)),
        dict(artifact.blobs),
    )


def test_compile_refuses_a_bad_name_before_compiling(open_folder_cache, compiled, jax_work) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    with jax_work as work, pytest.raises(InvalidNameError):
        cache.compile(compiled.models.tiny, *compiled.models.tiny_specs(), name="bad\nname")
    assert "/jax/core/compile/backend_compile_duration" not in work.events  # no XLA compile
    assert cache.entries() == [] and cache.blobs.digests() == []

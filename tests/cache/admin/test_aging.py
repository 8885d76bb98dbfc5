"""Portable HLO that ages out of jax.export's compatibility window (cache/admin/aging.py):
``aot verify`` and ``aot doctor`` name the entries and say what to do."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path

import jax
import jax.numpy as jnp
from click.testing import CliRunner

import aot
from aot.build import build_artifact
from aot.cache.admin.aging import ADVICE, EXPIRED, EXPIRING, aged_entries
from aot.cache.index.entry import utcnow
from aot.cli.main import cli


def scaled(x: jax.Array) -> jax.Array:
    return jnp.sin(x) * 3.0


def _artifact(n: int, name: str = "age.f", portable: bytes | None = None):  # type: ignore[no-untyped-def]
    comp = aot.lower(scaled, f"f32[{n}]", name=name)
    exe = comp.compile()
    return build_artifact(exe, comp.portable_hlo(exe) if portable is None else portable)


def _cache_with_ages(folder: Path) -> dict[int, str]:
    """Entries compiled 200, 160 and 0 days ago (their compile time, as a copy keeps it)."""
    cache = aot.Cache(folder)
    keys = {}
    for n, days in ((1, 200), (2, 160), (3, 0)):
        entry, _ = cache.store_artifact(_artifact(n), created_at=utcnow() - timedelta(days=days, hours=1))
        keys[days] = entry.key
    cache.close()
    return keys


def test_entries_past_or_near_the_guarantee_are_named(tmp_path: Path) -> None:
    keys = _cache_with_ages(tmp_path / "c")
    cache = aot.Cache(tmp_path / "c")
    report = aged_entries(cache, deep=True)
    cache.close()
    assert report.checked == 3
    assert [(e.key, e.status, e.age_days) for e in report.entries] == [(keys[200], EXPIRED, 200), (keys[160], EXPIRING, 160)]
    assert report.lines() == [
        "portable HLO of 1 entry older than jax.export's 180-day compatibility guarantee:",
        f"  age.f (f32[1]) {keys[200][:12]}: exported 200 days ago by jax {jax.__version__}; "
        "jax.export guarantees 180 days",
        "portable HLO of 1 entry within 30 days of jax.export's 180-day compatibility guarantee:",
        f"  age.f (f32[2]) {keys[160][:12]}: exported 160 days ago by jax {jax.__version__}; "
        "20 days of the guarantee left",
        f"  {ADVICE}",
    ]


def test_verify_and_doctor_say_it_and_still_pass(tmp_path: Path) -> None:
    keys = _cache_with_ages(tmp_path / "c")
    runner = CliRunner()
    verify = runner.invoke(cli, ["--cache", str(tmp_path / "c"), "verify"])
    assert verify.exit_code == 0, verify.output  # a warning: the executables still serve
    assert f"  age.f (f32[1]) {keys[200][:12]}: exported 200 days ago" in verify.output
    assert f"  {ADVICE}" in verify.output
    data = json.loads(runner.invoke(cli, ["--cache", str(tmp_path / "c"), "--json", "verify"]).output)
    assert [e["key"] for e in data["aging"]["expired"]] == [keys[200]]
    assert [e["key"] for e in data["aging"]["expiring"]] == [keys[160]]
    doctor = runner.invoke(cli, ["--cache", str(tmp_path / "c"), "doctor", "--no-verify"])
    assert "portable HLO of 1 entry older than jax.export's 180-day compatibility guarantee:" in doctor.output
    assert f"  age.f (f32[2]) {keys[160][:12]}: exported 160 days ago" in doctor.output


def test_a_calling_convention_older_than_this_jax_compiles_is_expired(tmp_path: Path) -> None:
    fresh = _artifact(4)
    from aot.artifact import PORTABLE_HLO

    exported = jax.export.deserialize(bytearray(fresh.blob(PORTABLE_HLO)))
    old = jax.export.minimum_supported_calling_convention_version - 1
    forged = dataclasses.replace(exported, calling_convention_version=old).serialize()
    cache = aot.Cache(tmp_path / "c")
    entry = cache.put_artifact(_artifact(4, portable=bytes(forged)))
    report = aged_entries(cache, deep=True)
    assert not aged_entries(cache).entries  # by date alone it is new
    cache.close()
    (aged,) = report.entries
    assert (aged.key, aged.status) == (entry.key, EXPIRED)
    assert aged.reason == (
        f"calling convention version {old} is older than this jax ({jax.__version__}) compiles "
        f"(oldest {old + 1})"
    )

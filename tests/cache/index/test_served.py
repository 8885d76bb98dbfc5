"""The one rule of which entry is served per (name, signature, environment)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from aot.cache.index.entry import IndexEntry
from aot.cache.index.served import served_key, superseded_keys

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _entry(key: str, minutes: int, *, signature: str = "x: f32[8]", state: str = "ok") -> IndexEntry:
    return IndexEntry(
        key=key, name="m.f", program_fp=f"p{key}", env_fp="env", signature=signature, platform="cpu",
        manifest='{"in_tree": "t"}', exe_digest="e", hlo_digest="h", raw_size=1, stored_size=1,
        compile_seconds=0.1, created_at=T0 + timedelta(minutes=minutes), state=state,
    )


def test_without_refs_the_newest_intact_entry_is_served() -> None:
    entries = [_entry("a", 0), _entry("b", 5), _entry("c", 9, state="quarantined")]
    assert served_key(entries, {}, ("m.f", "x: f32[8]", "env")) == "b"
    assert superseded_keys(entries) == {"a": "b"}


def test_a_ref_serves_its_key_whatever_the_clock_says() -> None:
    entries = [_entry("v1", 0), _entry("v2", 5), _entry("other", 1, signature="x: f32[4]")]
    refs = {("m.f", "x: f32[8]", "env"): "v1"}
    assert served_key(entries, refs, ("m.f", "x: f32[8]", "env")) == "v1"
    assert superseded_keys(entries, refs) == {"v2": "v1"}
    assert served_key(entries, refs, ("m.f", "x: f32[4]", "env")) == "other"


def test_nothing_intact_serves_nothing() -> None:
    assert served_key([_entry("a", 0, state="quarantined")], {}, ("m.f", "x: f32[8]", "env")) is None

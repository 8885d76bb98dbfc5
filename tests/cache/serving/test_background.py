"""aot.load(name, background=True): returns once the index rows are read, loads every
signature in background threads; a call waits for its own signature only, and a
signature's load error is raised at its first call, as the foreground load raises it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import aot
from aot.cache.reports.stats import read_stats
from aot.errors import CorruptArtifactError

_WAIT = 60.0  # seconds; only a hung loader would take that long


def _check(fn, compiled, batch: int) -> None:  # noqa: ANN001
    out = fn(compiled.params, compiled.inputs[batch])
    np.testing.assert_array_equal(np.asarray(out), compiled.expected[batch])


class _Gate:
    """Wraps ``cache.load``: records each key, holds the loads of ``held`` keys until
    :meth:`open` (all keys when ``held`` is None), counts the loads that entered."""

    def __init__(self, cache, monkeypatch: pytest.MonkeyPatch, held: set[str] | None = None) -> None:  # noqa: ANN001
        self.loaded: list[str] = []
        self.finished: list[str] = []
        self.entered = threading.Semaphore(0)
        self._open = threading.Event()
        self._held = held
        real: Callable[[Any], Any] = cache.load

        def gated(entry, **kwargs):  # noqa: ANN001, ANN003, ANN202
            self.loaded.append(entry.key)
            if self._held is None or entry.key in self._held:
                self.entered.release()
                assert self._open.wait(_WAIT), "the test never opened the gate"
            executable = real(entry, **kwargs)
            self.finished.append(entry.key)
            return executable

        monkeypatch.setattr(cache, "load", gated)

    def open(self) -> None:
        self._open.set()

    def wait_entered(self, n: int) -> None:
        for _ in range(n):
            assert self.entered.acquire(timeout=_WAIT), "a background load never started"


def _corrupt_blob(cache, digest: str, read_raw, write_raw) -> None:  # noqa: ANN001
    stored = bytearray(read_raw(cache.blobs, digest))
    stored[len(stored) // 2] ^= 0xFF
    write_raw(cache.blobs, digest, bytes(stored))
    assert cache.blobs.check(digest) is not None


def test_background_serves_what_the_foreground_serves(served, compiled) -> None:  # noqa: ANN001
    cache = served
    foreground = aot.load(compiled.MLP_NAME, cache=cache)
    fn = aot.load(compiled.MLP_NAME, cache=cache, background=True)
    assert fn.signatures == foreground.signatures
    for batch in compiled.MLP_BATCHES:  # called at once: each first call waits for its load
        out = fn(compiled.params, compiled.inputs[batch])
        np.testing.assert_array_equal(np.asarray(out), np.asarray(foreground(compiled.params, compiled.inputs[batch])))
        _check(fn, compiled, batch)
    assert fn.wait(_WAIT) and not fn.loading
    with pytest.raises(aot.UsageError, match="lazy=True .* background=True"):
        aot.load(compiled.MLP_NAME, cache=cache, lazy=True, background=True)


def test_returns_before_loading_and_a_call_waits_for_its_own_signature_only(
    served, compiled, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    cache = served
    held = compiled.mlp[4].manifest.key
    gate = _Gate(cache, monkeypatch, held={held})
    fn = aot.load(compiled.MLP_NAME, cache=cache, background=True)
    try:
        gate.wait_entered(1)  # returned while the load of batch 4 cannot finish
        assert fn.loading and not fn.wait(0)
        _check(fn, compiled, 1)  # served while batch 4 is still loading
        _check(fn, compiled, 2)
        assert held not in gate.finished and fn.loading
        result: list[Any] = []
        caller = threading.Thread(target=lambda: result.append(fn(compiled.params, compiled.inputs[4])))
        caller.start()
        caller.join(0.2)
        assert result == []  # the call of batch 4 waits for its load
    finally:
        gate.open()
    caller.join(_WAIT)
    np.testing.assert_array_equal(np.asarray(result[0]), compiled.expected[4])
    assert fn.wait(_WAIT) and not fn.loading
    assert sorted(gate.loaded) == sorted(a.manifest.key for a in compiled.mlp.values())  # each once


def test_calls_from_several_threads_while_loading_load_each_signature_once(
    served, compiled, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    cache = served
    gate = _Gate(cache, monkeypatch)
    fn = aot.load(compiled.MLP_NAME, cache=cache, background=True)
    errors: list[BaseException] = []

    def call(batch: int) -> None:
        try:
            _check(fn, compiled, batch)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(b,)) for b in compiled.MLP_BATCHES for _ in range(3)]
    for thread in threads:
        thread.start()
    gate.open()
    for thread in threads:
        thread.join(_WAIT)
    assert errors == []
    assert sorted(gate.loaded) == sorted(a.manifest.key for a in compiled.mlp.values())


def test_strict_a_corrupt_blob_raises_the_foreground_error_at_its_first_call(
    served, compiled, read_raw, write_raw  # noqa: ANN001
) -> None:
    cache = served
    bad = cache.index.get(compiled.mlp[1].manifest.key)
    _corrupt_blob(cache, bad.exe_digest, read_raw, write_raw)
    with pytest.raises(CorruptArtifactError) as foreground:
        aot.load(compiled.MLP_NAME, cache=cache, strict=True)
    fn = aot.load(compiled.MLP_NAME, cache=cache, strict=True, background=True)  # does not raise
    assert fn.wait(_WAIT)
    _check(fn, compiled, 2)  # the other signatures serve
    with pytest.raises(CorruptArtifactError) as first:
        fn(compiled.params, compiled.inputs[1])
    assert str(first.value) == str(foreground.value)
    assert "corrupt" in str(first.value)
    _check(fn, compiled, 4)
    with pytest.raises(CorruptArtifactError, match="strict=True forbids recompiling"):
        fn(compiled.params, compiled.inputs[1])  # later calls try again, as lazy=True does
    assert cache.index.get(bad.key).state == "ok"  # strict never writes, in threads either


def test_strict_a_corrupt_blob_raises_at_the_first_call_even_while_loading(
    served, compiled, read_raw, write_raw, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """The first call comes before the background load of its signature has failed:
    it waits for it and raises its error (not the next call)."""
    cache = served
    bad = cache.index.get(compiled.mlp[1].manifest.key)
    _corrupt_blob(cache, bad.exe_digest, read_raw, write_raw)
    gate = _Gate(cache, monkeypatch)
    fn = aot.load(compiled.MLP_NAME, cache=cache, strict=True, background=True)
    gate.wait_entered(1)
    threading.Timer(0.1, gate.open).start()
    with pytest.raises(CorruptArtifactError, match="corrupt"):
        fn(compiled.params, compiled.inputs[1])
    _check(fn, compiled, 4)


def test_lenient_a_corrupt_blob_is_quarantined_and_recompiled_in_the_background(
    open_cache, compiled, read_raw, write_raw, caplog  # noqa: ANN001
) -> None:
    cache = open_cache()
    entries = {b: cache.put(a) for b, a in compiled.mlp.items()}
    bad = entries[4]
    _corrupt_blob(cache, bad.exe_digest, read_raw, write_raw)
    with caplog.at_level(logging.WARNING):
        fn = aot.load(compiled.MLP_NAME, cache=cache, background=True)
        for batch in compiled.MLP_BATCHES:
            _check(fn, compiled, batch)
        assert fn.wait(_WAIT)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "quarantined" in messages and "recompiled from portable HLO" in messages
    healed = cache.index.get(bad.key)  # as the foreground: the quarantined row replaced
    assert healed.ok and cache.blobs.check(healed.exe_digest) is None
    again = aot.load(compiled.MLP_NAME, cache=open_cache(), strict=True, background=True)
    _check(again, compiled, 4)


def test_background_loads_count_in_the_statistics(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    for artifact in compiled.mlp.values():
        cache.put(artifact)
    fn = aot.load(compiled.MLP_NAME, cache=cache, background=True)
    assert fn.wait(_WAIT)
    _check(fn, compiled, 2)
    _check(fn, compiled, 2)
    rows = {r.signature: r for r in cache.stats.report(compiled.MLP_NAME).rows}
    assert {s: r.loads for s, r in rows.items()} == {a.manifest.signature: 1 for a in compiled.mlp.values()}
    assert rows[compiled.mlp[2].manifest.signature].calls == 2
    cache.close()  # flushes
    stored = {r.signature: r for r in read_stats(open_folder_cache(), compiled.MLP_NAME).rows}
    assert sum(r.loads for r in stored.values()) == 3


def test_closing_the_cache_cancels_pending_loads_and_waits_for_running_ones(
    served, compiled, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    cache = served
    gate = _Gate(cache, monkeypatch)
    fn = aot.load(compiled.MLP_NAME, cache=cache, lazy=True).load_in_background(workers=2)
    gate.wait_entered(2)  # two loads running (held), the third queued
    closer = threading.Thread(target=cache.close)
    closer.start()
    stopped = fn.programs.background._stopped  # noqa: SLF001 - set by close before it waits
    assert stopped.wait(_WAIT)
    closer.join(0.2)
    assert closer.is_alive()  # close waits for the running loads
    gate.open()
    closer.join(_WAIT)
    assert not closer.is_alive()
    assert len(gate.finished) == 2 and len(gate.loaded) == 2  # the third never started
    assert not fn.loading


_EXITING = """
import sys, time
import aot
from aot.cache.cache import Cache

real = Cache.load

def slow(self, entry):
    with open(sys.argv[2], "a") as f:
        f.write(entry.key + "\\n")
    time.sleep(1.0)
    return real(self, entry)

Cache.load = slow
fn = aot.load("mlp.forward", cache=sys.argv[1], lazy=True).load_in_background(workers=1)
print("returned", flush=True)
"""


def test_a_process_exiting_while_loading_skips_the_loads_not_started(
    served, compiled, tmp_path  # noqa: ANN001
) -> None:
    """The interpreter exits cleanly while one load runs, and does not wait to run the
    queued ones (their threads see that the main thread has finished)."""
    import subprocess
    import sys

    served.close()
    started = tmp_path / "started.txt"
    proc = subprocess.run(
        [sys.executable, "-c", _EXITING, served.location, str(started)],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "returned" in proc.stdout and "Traceback" not in proc.stderr
    loads = started.read_text().split() if started.exists() else []
    assert len(loads) <= 1  # of 3 signatures, one thread: the running one at most

"""Host callbacks of libraries, served (aot.callbacks): a failing runtime check of
Equinox (eqx.error_if, lineax's default throw=True) raises in a serving process that
cannot import the model as it does under ``jax.jit``; a callback into the model's own
code is refused naming the primitive and the function; with ``EQX_ON_ERROR=nan`` the
checks are pure operations and the program has no callback at all."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import aot
from tests.conformance import conformance_programs as programs
from tests.conformance.test_conformance import HERE, _environment

pytestmark = pytest.mark.slow

SERVE = """
import hashlib, json, sys
import conformance_harness as h
h.block_model_code()
import aot, numpy as np
cases = json.loads(sys.argv[2])
out = {}
for name, calls in cases.items():
    fn = aot.load(name, cache=sys.argv[1], strict=True)
    results = []
    for args in calls:
        try:
            value = np.asarray(fn(*[np.asarray(a, np.float32) for a in args]))
            results.append({"sha": hashlib.sha256(value.tobytes()).hexdigest(), "value": value.tolist()})
        except Exception as exc:
            results.append({"type": type(exc).__name__, "message": str(exc)})
    out[name] = results
out["model_imported"] = "conformance_programs" in sys.modules
print(json.dumps(out))
"""


def _serve(cache: Path | str, cases: dict[str, list[list[Any]]], env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, str(cache), json.dumps(cases)],
        env=env or _environment(), capture_output=True, text=True, cwd=HERE, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: jax.jit's result per (program, arguments): each is a first call, compiled once.
REFERENCE: dict[tuple[str, str], dict[str, Any]] = {}


def _under_jit(fn: Any, args: list[Any]) -> dict[str, Any]:
    # A first call: jax.jit's C++ fast path (later calls) raises an XLA error as
    # ValueError where its first call raises JaxRuntimeError; served calls raise the latter.
    jax.clear_caches()
    try:
        value = np.asarray(jax.jit(fn)(*[np.asarray(a, np.float32) for a in args]))
    except Exception as exc:  # noqa: BLE001 - what jax.jit raises is the reference
        return {"type": type(exc).__name__, "message": str(exc)}
    return {"sha": hashlib.sha256(value.tobytes()).hexdigest(), "value": value.tolist()}


def _check(result: dict[str, Any]) -> str:
    """What a user reads of a failed check: the library's exception and message, after
    the traceback (whose frames differ between processes)."""
    message = result["message"]
    start = message.find("EquinoxRuntimeError: ")
    assert start >= 0, message
    return message.splitlines()[0] + " ... " + message[message.rfind("\n", 0, start) + 1:]


@pytest.fixture(params=["sqlite", pytest.param("postgresql+s3", marks=pytest.mark.postgres)])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, aot.Cache]:
    """A cache of each kind: a folder (SQLite + blob folder), or a PostgreSQL index with
    its blobs on S3 (the serving process finds them from the index's description)."""
    if request.param == "sqlite":
        return str(tmp_path / "cache"), aot.Cache(tmp_path / "cache")
    url = str(request.getfixturevalue("postgres_url"))
    return url, aot.Cache(url, blob_location=str(request.getfixturevalue("s3_url")))


def test_a_failing_library_check_raises_at_serve_time_as_under_jit(location: tuple[str, aot.Cache]) -> None:
    where, cache = location
    x = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
    a = np.eye(4, dtype=np.float32) + 1.0
    b = np.arange(4, dtype=np.float32)
    cache.compile(programs.equinox_error_if, x, name="check")
    cache.compile(programs.lineax_lu_default, a, b, name="lu")
    cases = {
        "check": [[x.tolist()], [(x * 500.0).tolist()], [x.tolist()], [(x * 500.0).tolist()]],
        "lu": [[a.tolist(), b.tolist()], [np.zeros((4, 4)).tolist(), b.tolist()]],
    }
    served = _serve(where, cases)
    assert served["model_imported"] is False
    fns = {"check": programs.equinox_error_if, "lu": programs.lineax_lu_default}
    for name, calls in cases.items():
        for args, got in zip(calls, served[name]):
            key = (name, json.dumps(args))
            want = REFERENCE[key] = REFERENCE.get(key) or _under_jit(fns[name], args)
            assert ("type" in got) == ("type" in want), (name, args, got, want)
            if "type" in want:
                assert got["type"] == want["type"] == "JaxRuntimeError", (got["type"], want["type"])
                assert _check(got) == _check(want)
            else:
                assert got["sha"] == want["sha"], (name, got["value"], want["value"])
    assert "x must stay below 100" in served["check"][1]["message"]
    assert "non-finite" in served["lu"][1]["message"]


def test_a_callback_into_model_code_is_refused_naming_the_primitive_and_function() -> None:
    with pytest.raises(aot.UnsupportedComputationError) as info:
        aot.lower(programs.host_pure_callback, jax.ShapeDtypeStruct((8,), np.float32))
    message = str(info.value)
    assert "'pure_callback'" in message
    assert "conformance_programs:host_pure_callback.<locals>.<lambda>" in message
    assert "not an allow-listed library" in message


def test_eqx_on_error_nan_has_no_callback_and_is_served_bit_identically(tmp_path: Path) -> None:
    env = {**_environment(), "EQX_ON_ERROR": "nan"}
    compile_code = (
        "import sys, json, numpy as np, jax, aot, conformance_programs as p\n"
        "cache = aot.Cache(sys.argv[1])\n"
        "x = np.linspace(-1.0, 1.0, 8, dtype=np.float32)\n"
        "comp = aot.lower(p.equinox_error_if, x, name='check')\n"
        "cache.put(comp)\n"
        "ref = [np.asarray(jax.jit(p.equinox_error_if)(v)).tolist() for v in (x, x * 500)]\n"
        "print(json.dumps({'callbacks': len(comp.host_callbacks), 'ref': ref}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", compile_code, str(tmp_path / "cache")],
        env=env, capture_output=True, text=True, cwd=HERE, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    compiled = json.loads(proc.stdout.strip().splitlines()[-1])
    assert compiled["callbacks"] == 0
    x = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
    served = _serve(tmp_path / "cache", {"check": [[x.tolist()], [(x * 500).tolist()]]}, env)
    values = [r["value"] for r in served["check"]]
    np.testing.assert_array_equal(np.array(values[0], np.float32), np.array(compiled["ref"][0], np.float32))
    assert np.isnan(values[1]).all() and np.isnan(compiled["ref"][1]).all()


BLOCK_EQUINOX = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "equinox" or name.startswith("equinox."):
            raise ImportError("equinox is not installed here")
sys.meta_path.insert(0, Block())
import aot, numpy as np
try:
    aot.load("check", cache=sys.argv[1])(np.zeros(8, np.float32))
    print("served")
except Exception as exc:
    print(type(exc).__name__ + ": " + str(exc))
"""


def test_without_the_library_the_entry_is_skipped_here_not_quarantined(tmp_path: Path) -> None:
    cache = aot.Cache(tmp_path / "cache")
    cache.compile(programs.equinox_error_if, np.zeros(8, np.float32), name="check")
    report = cache.verify()
    assert report.ok and report.checked_entries == 1, report  # its executable loads to be checked
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_EQUINOX, str(tmp_path / "cache")],
        env=_environment(), capture_output=True, text=True, cwd=HERE, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.strip().splitlines()[-1]
    assert "equinox._errors:_error.<locals>.raises needs equinox._errors" in out, out
    assert "install equinox" in out, out
    assert [e.state for e in aot.Cache(tmp_path / "cache").entries(name="check")] == ["ok"]

"""Quarantine means proven corruption, never a limit of the serving process.

A checkify entry is served in a fresh process that never imported
``jax.experimental.checkify`` (the loader imports JAX's own modules a stored pytree
names), and an entry whose pytree names a module this process cannot import is
skipped for this process, never quarantined for every process."""

from __future__ import annotations

import enum
import json
import subprocess
import sys
import textwrap
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import aot

XS = (np.arange(1, 5, dtype=np.float32), np.array([1.0, -1.0, 2.0, 3.0], np.float32))


def _log_checked(x):  # noqa: ANN001, ANN202
    checkify.check(jnp.all(x > 0), "x must be positive")
    return jnp.log(x) * 2.0


_SERVE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import aot

    before = sorted(m for m in ("jax.experimental.checkify", "jax._src.checkify") if m in sys.modules)
    fn = aot.load("checked", cache=sys.argv[1], strict=True)
    report = {"imported_before": before, "calls": []}
    for x in (np.arange(1, 5, dtype=np.float32), np.array([1.0, -1.0, 2.0, 3.0], np.float32)):
        err, out = fn(x)
        report["calls"].append({"out": np.asarray(out).tobytes().hex(), "error": err.get()})
    report["states"] = [e.state for e in aot.Cache(sys.argv[1]).entries()]
    print(json.dumps(report))
    """
)


def test_a_checkify_entry_is_served_in_a_process_that_never_imported_checkify(tmp_path) -> None:  # noqa: ANN001
    checked = checkify.checkify(_log_checked)
    with aot.Cache(tmp_path / "cache") as cache:
        cache.compile(checked, "f32[4]", name="checked")
        location = cache.location
    expected = []
    for x in XS:
        err, out = jax.jit(checked)(x)
        expected.append({"out": np.asarray(out).tobytes().hex(), "error": err.get()})
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE, str(location)], capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["imported_before"] == []  # the user never imported checkify
    assert report["calls"] == expected  # bit-identical outputs, the same error message
    assert expected[1]["error"] is not None and "x must be positive" in expected[1]["error"]
    assert report["states"] == ["ok"]


class _Part(enum.Enum):
    HEAD = "head"


def _vanishing_module() -> types.ModuleType:
    """A module that exists while compiling and is gone when serving (model code
    not deployed with the server): its enum keys the program's output dict."""
    module = types.ModuleType("aot_test_vanishing_keys")
    _Part.__module__ = module.__name__
    module._Part = _Part  # type: ignore[attr-defined]
    return module


@pytest.mark.parametrize("strict", [False, True])
def test_a_node_module_missing_here_skips_the_entry_without_quarantining_it(
    open_folder_cache, monkeypatch: pytest.MonkeyPatch, strict: bool,  # noqa: ANN001
) -> None:
    module = _vanishing_module()
    monkeypatch.setitem(sys.modules, module.__name__, module)

    def parts(x):  # noqa: ANN001, ANN202
        return {module._Part.HEAD: x * 2.0}

    cache = open_folder_cache()
    cache.compile(parts, "f32[3]", name="parts")
    x = np.arange(3, dtype=np.float32)
    monkeypatch.delitem(sys.modules, module.__name__)  # the serving process lacks it
    with pytest.raises(aot.PytreeNodeError, match="module 'aot_test_vanishing_keys' is not imported"):
        aot.load("parts", cache=cache, strict=strict)(x)
    assert [e.state for e in cache.entries()] == ["ok"]  # never quarantined
    assert cache.verify().ok
    reopened = aot.Cache(cache.location)
    assert [e.state for e in reopened.entries()] == ["ok"]
    monkeypatch.setitem(sys.modules, module.__name__, module)  # a process that has it
    out = aot.load("parts", cache=reopened, strict=True)(x)
    np.testing.assert_array_equal(np.asarray(out[_Part.HEAD]), x * 2.0)

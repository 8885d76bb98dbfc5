"""No pickle on any load path.

In a fresh process (audit hooks cannot be removed), ``reliability_workers.py nopickle``
builds one artifact of every kind (jit, a 4x2 mesh, pmap over 8 devices, a pytree with
a namedtuple, and one "from another environment" that the loader must recompile from
its portable HLO), then installs a guard that fails on:

* the ``pickle.find_class`` audit event (any unpickling of a class or function),
* ``pickle.loads`` / ``pickle.load`` / ``pickle.Unpickler`` (pure-data pickles never
  reach find_class),
* the ``marshal.loads`` audit event outside the import system (code loaded as data),

and then loads and runs everything through ``aot.load`` and ``Cache.get``, exports a
bundle and imports it into a second cache with ``Cache.import_bundle``, and serves
from there. A second run (``guardcheck``) proves the guard catches each of those.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.reliability.helpers import run_worker


def test_the_guard_catches_every_kind_of_unpickling() -> None:
    done = run_worker("guardcheck", timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["caught"] == ["pickle.loads", "_pickle.loads", "marshal.loads"]


@pytest.mark.slow
def test_loading_every_artifact_kind_and_importing_a_bundle_never_unpickles(tmp_path: Path) -> None:
    done = run_worker("nopickle", str(tmp_path), timeout=300)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-6000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["events"] == []
    # 5 names served from the cache, 4 executables by key, 5 names after the import
    assert result["checks"] == 14
    assert result["imported"] == 5

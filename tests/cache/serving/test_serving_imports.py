"""A serving process imports what serving a stored entry needs, and nothing else.

``aot.load`` + ``.warm()`` is measured against JAX's ``deserialize_and_load``
(benchmarks/README.md, "executable ready"), imports included: the fallback ladder's
recompile and artifact builder, host callbacks, JAX's persistent-cache records,
release sets and the local tier's thread pool are imported where first needed, never
by a plain load and call of an entry stored for this environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np

import aot

# Each is imported on its first use (a recompile, a host callback, `aot ls` of JIT
# records, a release removal, a tier fetching several entries): a plain load has none.
LAZY = (
    "aot.recompile",  # the fallback ladder's middle step
    "aot.build",  # building an artifact (the recompile writes one back)
    "aot.jaxcompat.build",
    "aot.callbacks",  # host callbacks only
    "aot.jaxcompat.callbacks",
    "aot.cache.index.jit_records",  # JAX's persistent cache's rows, for aot ls / gc
    "aot.cache.index.releases",  # release sets and their removal: the SQL index's
    "concurrent.futures.thread",  # the tier's fetches of several entries, warm() of several
)

_SERVE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import aot

    fn = aot.load("tiny.affine", cache=sys.argv[1])
    out = fn(np.arange(8, dtype=np.float32))
    print(json.dumps({
        "out": np.asarray(out).tolist(),
        "imported": sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules),
    }))
    """
)


def _affine(x):  # noqa: ANN001, ANN202
    return x * 2.0 + 1.0


def test_a_plain_load_and_call_imports_none_of_the_lazy_modules(tmp_path) -> None:  # noqa: ANN001
    with aot.Cache(tmp_path / "cache") as cache:
        cache.compile(_affine, "f32[8]", name="tiny.affine")
        location = cache.location
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE, str(location), json.dumps(LAZY)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["out"] == (np.arange(8, dtype=np.float32) * 2.0 + 1.0).tolist()
    assert report["imported"] == []

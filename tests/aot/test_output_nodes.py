"""Output nodes of library classes (an Equinox module returned but not passed in):
rebuilt by importing the library's module on demand; any other module is named in
the error, never imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aot
from aot import treedef as treedefs


def make_linear(x: jax.Array) -> eqx.nn.Linear:
    layer = eqx.nn.Linear(2, 3, key=jax.random.key(0))
    return jax.tree_util.tree_map(lambda p: p * x.sum(), layer)


_SERVE = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[2])
    import jax.numpy as jnp
    import aot
    assert "equinox" not in sys.modules
    out = aot.load("eqx.make", cache=aot.Cache(sys.argv[1]))(jnp.ones((4,)))
    print(json.dumps({"type": type(out).__module__ + "." + type(out).__qualname__,
                      "weight": out.weight.tolist(), "imported": "equinox" in sys.modules}))
    """
)


@pytest.mark.slow
def test_an_equinox_output_is_served_without_importing_equinox_first(tmp_path: Path) -> None:
    cache = aot.Cache(tmp_path / "c")
    cache.compile(make_linear, jnp.ones((4,)), name="eqx.make")
    want = jax.jit(make_linear)(jnp.ones((4,)))
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE, str(tmp_path / "c"), str(Path(__file__).resolve().parents[2])],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["type"] == "equinox.nn._linear.Linear" and got["imported"]
    np.testing.assert_array_equal(np.asarray(got["weight"], np.float32), np.asarray(want.weight))


def test_a_model_modules_output_node_is_named_not_imported() -> None:
    data = treedefs.to_json(jax.tree_util.tree_structure(make_linear(jnp.ones((4,)))))
    data["type"] = "my_model.layers:Block"
    with pytest.raises(aot.PytreeNodeError) as caught:
        treedefs.resolve(data, {})
    assert "my_model" not in sys.modules
    assert str(caught.value).startswith(
        "pytree node class my_model.layers:Block cannot be imported in this process (its "
        "module 'my_model.layers' is not imported (the loader imports only the modules of "
        "known libraries, never one a manifest names): `import my_model.layers` before loading); "
    )

"""Symbolic entries on the command line: compile stores them, ls/show/verify/gc
handle an entry that has no executable."""

from __future__ import annotations

import json

import numpy as np

import aot
from tests.cli.helpers import Invoke

MLP_PARAMS = "f32[512], f32[784,512], f32[512], f32[512,512], f32[10], f32[512,10]"
MLP_TREE = (
    "params: [{b: f32[512], w: f32[784,512]}, {b: f32[512], w: f32[512,512]}, "
    "{b: f32[10], w: f32[512,10]}]"
)
ARGS = (
    "compile", "fixtures.models:mlp_forward", "--arg", "@fixtures.models:mlp_param_specs",
    "--arg", "f32[b,784]", "--name", "mlp.any",
)


def test_compile_stores_a_symbolic_entry_that_every_command_handles(invoke: Invoke, cache_dir) -> None:
    first = invoke(*ARGS)
    assert first.exit_code == 0, first.output
    lines = first.stdout.splitlines()
    assert lines[0] == (
        "stored the symbolic program mlp.any (portable HLO; compiled for each concrete shape "
        "when served)"
    )
    assert lines[1] == f"  signature  {MLP_TREE}, x: f32[b,784]"
    assert invoke(*ARGS).stdout.splitlines()[0] == "hit: mlp.any was in the cache (no compile)"

    listing = json.loads(invoke("ls", "--json").stdout)["entries"]
    assert [(e["signature"], e["exe_digest"]) for e in listing] == [(f"{MLP_PARAMS}, f32[b,784]", None)]
    shown = invoke("show", "mlp.any").stdout
    assert "  shapes       symbolic in b (no constraints); no executable: aot.load compiles one per concrete shape" in shown
    assert "format v2" in shown  # the lowest format that carries a symbolic entry
    assert invoke("verify").exit_code == 0
    assert "nothing to collect" in invoke("gc", "--dry-run").stdout

    # Served from the cache: one concrete entry more, which every command lists too.
    sizes = (784, 512, 512, 10)
    params = [
        {"b": np.zeros(n_out, np.float32), "w": np.full((n_in, n_out), 0.01, np.float32)}
        for n_in, n_out in zip(sizes[:-1], sizes[1:])
    ]
    x = np.ones((3, 784), np.float32)
    out = aot.load("mlp.any", cache=str(cache_dir))(params, x)
    assert out.shape == (3, 10)
    signatures = sorted(e["signature"] for e in json.loads(invoke("ls", "--json").stdout)["entries"])
    assert signatures == [f"{MLP_PARAMS}, f32[3,784]", f"{MLP_PARAMS}, f32[b,784]"]
    verified = invoke("verify", "--json")
    assert verified.exit_code == 0, verified.output
    assert "2 entries" in invoke("verify").stdout

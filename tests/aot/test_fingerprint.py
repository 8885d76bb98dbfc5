"""Program and environment fingerprints: stable where they must be, different where it matters."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import jaxlib
import pytest

import aot
from aot.fingerprint import (
    Fingerprint,
    PartDifference,
    combined_key,
    environment_fingerprint,
    environment_parts,
    relevant_xla_flags,
    xla_flags_outside_key,
)

MODEL_SOURCE = """\
import jax
import jax.numpy as jnp


def fn(x, w):
    return jnp.tanh(x @ w) * 2.0


def allreduce(x):
    return jax.lax.psum(x, "i")
"""


def import_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((4, 2), ("data", "model"))


def fn(x, w):
    return jnp.tanh(x @ w) * 2.0


def program(comp):
    return comp.program_fingerprint


# ------------------------------------------------------------------ stability

FRESH_PROCESS = """
import importlib.util, json, sys
import jax
import aot
spec = importlib.util.spec_from_file_location("fp_model", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
mesh = jax.make_mesh((4, 2), ("data", "model"))
comps = {
    "jit": aot.lower(mod.fn, "f32[8,16]", "f32[16,4]"),
    "mesh": aot.lower(mod.fn, "f32[8,16]@data,None", "f32[16,4]@None,model", mesh=mesh),
    "pmap": aot.lower_pmap(mod.allreduce, "f32[8,3]", axis_name="i"),
}
print(json.dumps({
    kind: [c.program_fingerprint.digest, c.environment_fingerprint.digest, c.fingerprint]
    for kind, c in comps.items()
}))
"""


@pytest.mark.slow
def test_same_function_and_specs_same_fingerprint_in_two_fresh_processes(tmp_path, mesh):
    path = tmp_path / "fp_model.py"
    path.write_text(MODEL_SOURCE)
    env = dict(os.environ)  # carries the conftest's XLA_FLAGS (8 CPU devices)
    assert "--xla_force_host_platform_device_count=8" in env["XLA_FLAGS"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FRESH_PROCESS, str(path)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0] == results[1]
    # ... and the same as in this process.
    mod = import_path("fp_model", path)
    here = {
        "jit": aot.lower(mod.fn, "f32[8,16]", "f32[16,4]"),
        "mesh": aot.lower(mod.fn, "f32[8,16]@data,None", "f32[16,4]@None,model", mesh=mesh),
        "pmap": aot.lower_pmap(mod.allreduce, "f32[8,3]", axis_name="i"),
    }
    for kind, comp in here.items():
        assert results[0][kind] == [
            comp.program_fingerprint.digest, comp.environment_fingerprint.digest, comp.fingerprint
        ], kind
    assert len({tuple(v) for v in results[0].values()}) == 3


def test_moving_the_function_to_another_line_keeps_the_fingerprint(tmp_path):
    first = tmp_path / "model_a.py"
    second = tmp_path / "model_b.py"
    first.write_text(MODEL_SOURCE)
    padding = "".join(f"# line {i} moves the functions down\n" for i in range(40))
    second.write_text(padding + MODEL_SOURCE.replace("\n\ndef fn", "\n\n\n\ndef fn"))
    a = import_path("fp_model_a", first)
    b = import_path("fp_model_b", second)
    assert a.fn.__code__.co_firstlineno != b.fn.__code__.co_firstlineno
    comp_a = aot.lower(a.fn, "f32[8,16]", "f32[16,4]", name="model.fn")
    comp_b = aot.lower(b.fn, "f32[8,16]", "f32[16,4]", name="model.fn")
    # Control: the debug locations do see the move ...
    assert comp_a.as_text(debug_info=True) != comp_b.as_text(debug_info=True)
    # ... but the fingerprints do not.
    assert comp_a.program_fingerprint == comp_b.program_fingerprint
    assert comp_a.fingerprint == comp_b.fingerprint
    assert comp_a.compile().key == comp_b.compile().key


def test_same_function_twice_in_one_process():
    assert aot.lower(fn, "f32[8,16]", "f32[16,4]").fingerprint == (
        aot.lower(fn, "f32[8,16]", "f32[16,4]").fingerprint
    )


# ------------------------------------------------------------------ sensitivity


def scaled(x, n):
    return x * n


def other_body(x, w):
    return jnp.tanh(x @ w) * 3.0


def _variants(mesh):
    base = lambda: aot.lower(fn, "f32[8,16]", "f32[16,4]")  # noqa: E731
    return {
        "dtype": (base, lambda: aot.lower(fn, "bf16[8,16]", "bf16[16,4]"), "in_avals"),
        "shape": (base, lambda: aot.lower(fn, "f32[4,16]", "f32[16,4]"), "in_avals"),
        "sharding": (
            lambda: aot.lower(fn, "f32[8,16]@data,None", "f32[16,4]", mesh=mesh),
            lambda: aot.lower(fn, "f32[8,16]@model,None", "f32[16,4]", mesh=mesh),
            "in_shardings",
        ),
        "out_sharding": (
            lambda: aot.lower(fn, "f32[8,16]", "f32[16,4]", mesh=mesh, out_shardings="data,None"),
            lambda: aot.lower(fn, "f32[8,16]", "f32[16,4]", mesh=mesh, out_shardings="None,model"),
            "out_shardings",
        ),
        "donation": (base, lambda: aot.lower(fn, "f32[8,16]", "f32[16,4]", donate_argnums=0), "donated"),
        "static value": (
            lambda: aot.lower(scaled, "f32[3]", 2, static_argnums=1),
            lambda: aot.lower(scaled, "f32[3]", 3, static_argnums=1),
            "stablehlo",
        ),
        "function body": (base, lambda: aot.lower(other_body, "f32[8,16]", "f32[16,4]"), "stablehlo"),
    }


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
@pytest.mark.parametrize(
    "what", ["dtype", "shape", "sharding", "out_sharding", "donation", "static value", "function body"]
)
def test_a_difference_changes_the_program_fingerprint(mesh, what):
    make_a, make_b, part = _variants(mesh)[what]
    a, b = make_a(), make_b()
    assert a.program_fingerprint.digest != b.program_fingerprint.digest
    assert a.fingerprint != b.fingerprint
    assert part in [d.part for d in a.program_fingerprint.diff(b.program_fingerprint)]
    # The environment is the same: only the program differs.
    assert a.environment_fingerprint == b.environment_fingerprint


def test_x64_changes_program_and_environment_fingerprints():
    off = aot.lower(fn, "f32[8,16]", "f32[16,4]")
    jax.config.update("jax_enable_x64", True)
    on = aot.lower(fn, "f32[8,16]", "f32[16,4]")
    assert off.program_fingerprint.digest != on.program_fingerprint.digest
    assert [d.describe() for d in off.program_fingerprint.diff(on.program_fingerprint)] == [
        "x64 false != true"
    ]
    assert [d.describe() for d in off.environment_fingerprint.diff(on.environment_fingerprint)] == [
        "x64 false != true"
    ]
    assert off.fingerprint != on.fingerprint


def test_fingerprint_combines_program_and_environment():
    comp = aot.lower(fn, "f32[8,16]", "f32[16,4]")
    assert comp.fingerprint == combined_key(comp.program_fingerprint, comp.environment_fingerprint)
    exe = comp.compile()
    assert exe.key == comp.fingerprint
    assert exe.program_fingerprint == comp.program_fingerprint
    assert set(comp.program_fingerprint.as_dict()) == {
        "name", "kind", "stablehlo", "in_tree", "out_tree", "in_avals", "in_shardings",
        "out_shardings", "donated", "kept_args", "devices", "compile_options", "x64",
    }
    assert comp.program_fingerprint.as_dict()["in_avals"] == "f32[8,16], f32[16,4]"


# ------------------------------------------------------------------ environment


def test_environment_parts():
    parts = environment_parts()
    assert parts["jaxlib"] == jaxlib.__version__
    assert parts["jax"] == jax.__version__
    assert parts["platform"] == "cpu"
    assert parts["device_count"] == "8"
    assert parts["device_kind"] == jax.devices()[0].device_kind
    assert parts["x64"] == str(jax.config.jax_enable_x64).lower()
    assert parts["xla_flags"] == relevant_xla_flags()
    assert "device_count" not in parts["xla_flags"]  # covered by its own part
    assert parts["topology"] == "0,1,2,3,4,5,6,7"
    isa = parts["cpu_isa"].split()
    assert isa == sorted(set(isa)) and isa
    assert environment_fingerprint().as_dict() == parts


def test_the_read_ahead_digest_is_the_environment_fingerprint_digest(monkeypatch):
    """aot.load's read-ahead looks rows up by environment_digest before the value
    objects are imported: a different digest would never find a row to read ahead."""
    from aot.environment import environment_digest

    assert environment_digest(environment_parts()) == environment_fingerprint().digest
    parts = {"b": "2", "a": "1"}
    assert environment_digest(parts) == Fingerprint.of("environment", parts).digest
    assert environment_digest(parts) != Fingerprint.of("program", parts).digest
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_fast_math=true")
    assert environment_digest(environment_parts()) == environment_fingerprint().digest


def test_relevant_xla_flags_ignore_the_device_count():
    flags = "--xla_force_host_platform_device_count=8 --xla_cpu_enable_fast_math=true --b=1"
    assert relevant_xla_flags(flags) == "--b=1 --xla_cpu_enable_fast_math=true"
    assert relevant_xla_flags("--xla_force_host_platform_device_count=8") == ""


def test_an_xla_flag_changes_the_environment_fingerprint(monkeypatch):
    before = environment_fingerprint()
    monkeypatch.setenv("XLA_FLAGS", os.environ["XLA_FLAGS"] + " --xla_cpu_enable_fast_math=true")
    after = environment_fingerprint()
    assert before.digest != after.digest
    assert [d.part for d in before.diff(after)] == ["xla_flags"]
    assert "--xla_cpu_enable_fast_math=true" in after.as_dict()["xla_flags"].split()


DUMP_FLAGS = (
    "--xla_dump_to=/tmp/aot-dump --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=.* "
    "--xla_dump_hlo_module_re=jit_.* --xla_dump_include_timestamp=false"
)


def test_dump_flags_stay_out_of_the_key_but_are_visible(monkeypatch):
    before = environment_fingerprint()
    monkeypatch.setenv("XLA_FLAGS", f"{os.environ['XLA_FLAGS']} {DUMP_FLAGS}")
    after = environment_fingerprint()
    assert after.digest == before.digest
    assert after.diff(before) == ()
    shown = xla_flags_outside_key().split()
    assert "--xla_dump_to=/tmp/aot-dump" in shown and "--xla_dump_hlo_as_text" in shown
    assert len(shown) == 5  # not the device count: the device_count part covers it


@pytest.mark.parametrize(
    "flag",
    [
        "--xla_cpu_enable_fast_math=true",  # changes the generated code
        "--xla_backend_optimization_level=0",
        "--xla_gpu_cuda_data_dir=/opt/cuda-12",  # JAX leaves it out; another toolkit, other code
        "--xla_dump_tox=/tmp",  # a name that merely starts like a dump flag
    ],
)
def test_flags_that_can_change_the_code_stay_in_the_key(monkeypatch, flag):
    before = environment_fingerprint()
    monkeypatch.setenv("XLA_FLAGS", f"{os.environ['XLA_FLAGS']} {flag}")
    after = environment_fingerprint()
    assert after.digest != before.digest
    assert [d.part for d in before.diff(after)] == ["xla_flags"]
    assert xla_flags_outside_key() == ""


def test_part_difference_describe():
    expected = Fingerprint.of("environment", {"jaxlib": "0.10.2", "device_count": "8", "gone": "x"})
    actual = Fingerprint.of("environment", {"jaxlib": "0.10.1", "device_count": "1", "new": "y"})
    assert [d.describe() for d in expected.diff(actual)] == [
        "device_count 8 != 1",
        "gone x != (absent)",
        "jaxlib 0.10.2 != 0.10.1",
        "new (absent) != y",
    ]
    assert PartDifference("jaxlib", "0.10.2", "0.10.1").describe() == "jaxlib 0.10.2 != 0.10.1"
    assert PartDifference("jaxlib", "0.10.2", "0.10.1").to_dict() == {
        "part": "jaxlib", "expected": "0.10.2", "actual": "0.10.1"
    }


def test_cpu_isa_difference_names_the_missing_features():
    diff = PartDifference("cpu_isa", "avx avx2 avx512f sse", "avx sse sse4_2")
    assert diff.describe() == (
        "cpu_isa: stored artifact needs ['avx2', 'avx512f'], this CPU adds ['sse4_2']"
    )


def test_a_long_or_multi_line_difference_is_one_line_showing_where_it_parts():
    version = "PJRT C API\nTFRT TPU v5 lite\nBuilt on Jun 17 2026"
    assert PartDifference("platform_version", version, "cpu").describe() == (
        "platform_version PJRT C API; TFRT TPU v5 lite; Built on Jun 17 2026 != cpu"
    )
    head = '[{"mesh":{"axis_names":["data"],"axis_types":["Auto"],"devices":'
    stored, requested = head + "[0,1,2,3]" + "x" * 60, head + "[0,1]" + "x" * 60
    shown = PartDifference("in_shardings", stored, requested).describe()
    # 20 characters before the first that differs ("[0,1" is common), 80 at most each.
    assert shown == (
        'in_shardings ...uto"],"devices":[0,1,2,3]' + "x" * 49 + '... != ...uto"],"devices":[0,1]' + "x" * 53 + "..."
    )


def test_fingerprint_digest_is_order_independent_and_round_trips():
    a = Fingerprint.of("program", {"a": "1", "b": "2"})
    b = Fingerprint.of("program", {"b": "2", "a": "1"})
    assert a == b and a.digest == b.digest
    assert Fingerprint.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    assert Fingerprint.of("program", {"a": "1", "b": "3"}).digest != a.digest
    assert Fingerprint.of("environment", {"a": "1", "b": "2"}).digest != a.digest


def test_source_text_is_not_part_of_the_fingerprint():
    # Same computation written differently (a comment, a local name): same fingerprint.
    src = textwrap.dedent(
        """
        def alt(x, w):
            # a comment
            y = x @ w
            return jnp.tanh(y) * 2.0
        """
    )
    scope = {"jnp": jnp}
    exec(compile(src, "<alt>", "exec"), scope)  # noqa: S102 - test-only source
    alt = scope["alt"]
    alt.__name__ = "fn"  # the jit module name (@jit_fn) is in the StableHLO
    assert aot.lower(alt, "f32[8,16]", "f32[16,4]", name="m.fn").program_fingerprint == (
        aot.lower(fn, "f32[8,16]", "f32[16,4]", name="m.fn").program_fingerprint
    )


def test_the_name_is_part_of_the_program_fingerprint():
    a = aot.lower(fn, "f32[8,16]", "f32[16,4]", name="model.a")
    b = aot.lower(fn, "f32[8,16]", "f32[16,4]", name="model.b")
    assert [d.describe() for d in a.program_fingerprint.diff(b.program_fingerprint)] == [
        "name model.a != model.b"
    ]
    assert a.fingerprint != b.fingerprint

"""aot compile and aot why, and how the command line reports errors."""

from __future__ import annotations

import json

import pytest

from aot.cache.warmup.run import TargetError
from tests.cli.helpers import MLP_PARAMS, Invoke, one_line_error

COMPILE_KEYS = {
    "key", "name", "signature", "hit", "seconds", "compile_seconds", "raw_size", "stored_size",
}


def compile_json(invoke: Invoke, *args: str) -> dict:
    result = invoke("compile", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_compile_miss_then_hit(invoke: Invoke, cache_dir) -> None:
    args = ("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--name", "tiny")
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    lines = first.stdout.splitlines()
    assert lines[0] == "miss: compiled and stored tiny"
    assert lines[1] == "  signature  x: f32[8], y: f32[8]"  # named after tiny(x, y)
    key = lines[2].split()[-1]
    assert len(key) == 64
    assert lines[3].startswith("  size       ") and "stored)" in lines[3]
    assert lines[4].startswith("  compile    ")
    assert lines[-1] == f"  cache      {cache_dir}"
    second = invoke(*args)
    assert second.exit_code == 0, second.output
    assert second.stdout.splitlines()[0] == "hit: tiny was in the cache (no compile)"
    assert f"  key        {key}" in second.stdout


def test_compile_json_shape_and_default_name(invoke: Invoke) -> None:
    data = compile_json(invoke, "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]")
    assert set(data) == COMPILE_KEYS
    assert data["name"] == "fixtures.models.tiny"
    assert data["signature"] == "f32[8], f32[8]"
    assert data["hit"] is False
    assert data["stored_size"] > 0 and data["raw_size"] >= data["stored_size"] // 2
    again = compile_json(invoke, "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]")
    assert again["hit"] is True and again["key"] == data["key"]


def test_compile_pytree_of_specs_from_a_callable(invoke: Invoke) -> None:
    data = compile_json(
        invoke, "fixtures.models:mlp_forward", "--name", "mlp.forward",
        "--arg", "@fixtures.models:mlp_param_specs", "--arg", "f32[2,784]",
    )
    assert data["signature"] == f"{MLP_PARAMS}, f32[2,784]"


def test_compile_args_from(invoke: Invoke) -> None:
    data = compile_json(invoke, "fixtures.models:tiny", "--args-from", "fixtures.models:tiny_specs")
    assert data["signature"] == "f32[8], f32[8]"
    # A tuple is several positional arguments, and --arg values follow them.
    data = compile_json(invoke, "tests.cli.models:add3", "--args-from", "tests.cli.models:three_specs")
    assert data["signature"] == "f32[4], f32[4], f32[4]"
    data = compile_json(
        invoke, "fixtures.models:mlp_forward", "--args-from", "fixtures.models:mlp_param_specs",
        "--arg", "f32[3,784]",
    )
    assert data["signature"] == f"{MLP_PARAMS}, f32[3,784]"


def test_compile_pmap(invoke: Invoke) -> None:
    data = compile_json(invoke, "fixtures.models:allreduce", "--pmap", "i", "--arg", "f32[8,1024]", "--name", "allreduce")
    assert data["signature"] == "f32[8,1024]"
    shown = invoke("show", "allreduce", "--json")
    assert json.loads(shown.stdout)["entries"][0]["manifest"]["kind"] == "pmap"


def test_compile_kwargs_and_static(invoke: Invoke) -> None:
    plain = compile_json(invoke, "tests.cli.models:affine", "--arg", "f32[8]", "--kwarg", "bias=f32[8]")
    doubled = compile_json(
        invoke, "tests.cli.models:affine", "--arg", "f32[8]", "--kwarg", "bias=f32[8]", "--static", "double=true",
    )
    assert plain["signature"] == "f32[8], f32[8]"
    assert doubled["signature"] == "f32[8], f32[8], double=True"  # statics are part of a signature
    assert plain["key"] != doubled["key"]  # a static value is part of the program


def test_compile_on_a_mesh(invoke: Invoke) -> None:
    in_specs = compile_json(
        invoke, "tests.cli.models:matmul", "--mesh", "data=4,model=2",
        "--arg", "f32[64,32]@data,None", "--arg", "f32[32,16]@None,model",
    )
    shardings = compile_json(
        invoke, "tests.cli.models:matmul", "--mesh", "data=4,model=2",
        "--arg", "f32[64,32]", "--arg", "f32[32,16]",
        "--in-sharding", "data,None", "--in-sharding", "None,model", "--out-sharding", "data,model",
    )
    assert in_specs["signature"] == shardings["signature"] == "f32[64,32], f32[32,16]"
    manifest = json.loads(invoke("show", shardings["key"], "--json").stdout)["entries"][0]["manifest"]
    assert manifest["out_shardings"][0]["spec"] == ["data", "model"]
    assert len(manifest["device_ids"]) == 8


def test_compile_donate(invoke: Invoke) -> None:
    kept = compile_json(invoke, "tests.cli.models:donating", "--arg", "f32[8]", "--arg", "f32[8]")
    donated = compile_json(invoke, "tests.cli.models:donating", "--arg", "f32[8]", "--arg", "f32[8]", "--donate", "0")
    assert kept["key"] != donated["key"]
    program = json.loads(invoke("show", donated["key"], "--json").stdout)["entries"][0]["manifest"]["program"]
    assert program["parts"]["donated"] == "[0]"


def test_compile_into_a_read_only_cache_stores_nothing(invoke: Invoke, warmed) -> None:
    result = invoke("--read-only", "compile", "tests.cli.models:add3", "--arg", "f32[2]", "--arg", "f32[2]", "--arg", "f32[2]")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("miss: compiled tests.cli.models.add3 (not stored: the cache is read-only)")
    assert "tests.cli.models.add3" not in invoke("ls").stdout


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "args,message",
    [
        (["nosuch.module:f", "--arg", "f32[8]"],
         "Error: cannot import 'nosuch.module' for 'nosuch.module:f': no module named 'nosuch'"),
        (["fixtures.models:nope", "--arg", "f32[8]"],
         "Error: 'fixtures.models:nope': module 'fixtures.models' has no attribute 'nope'"),
        (["tests.cli.models:NOT_A_FUNCTION"], "Error: function 'tests.cli.models:NOT_A_FUNCTION' is a int, not a function"),
        (["fixtures.models:tiny", "--arg", "f32[8", "--arg", "f32[8]"], "Error: malformed spec 'f32[8'"),
        (["fixtures.models:tiny", "--arg", "q32[8]", "--arg", "f32[8]"], "Error: malformed spec 'q32[8]': unknown dtype 'q32'"),
        (["fixtures.models:tiny", "--arg", "@tests.cli.models:not_callable_specs"],
         "Error: calling 'tests.cli.models:not_callable_specs' failed: RuntimeError: spec builder broke"),
        (["tests.cli.models:matmul", "--mesh", "data=64", "--arg", "f32[64,32]@data", "--arg", "f32[32,16]"],
         "Error: mesh data=64 needs 64 devices; this host has 8 (cpu)"),
    ],
)
def test_compile_errors_are_one_line(invoke: Invoke, args: list[str], message: str) -> None:
    line = one_line_error(invoke("compile", *args))
    assert line.startswith(message), line


@pytest.mark.parametrize(
    "args,message",
    [
        (["fixtures.models:tiny", "--static", "x=tru"], "'x=tru': 'tru' is not JSON"),
        (["fixtures.models:tiny", "--kwarg", "nonsense"], "'nonsense' is not NAME=SPEC"),
        (["fixtures.models:tiny", "--mesh", "data:4"], "malformed mesh 'data:4'"),
        (["fixtures.models:tiny", "--pmap", "i", "--kwarg", "y=f32[8]"], "pmap entries take positional args only"),
        (["fixtures.models:tiny", "--in-sharding", "data"], "in_shardings / out_shardings need a mesh"),
        (["fixtures.models:tiny", "--arg", "f32[8]@data"], "names a sharding but no mesh is given"),
        (["fixtures.models:tiny", "--kwarg", "mesh=f32[8]"], "clash with aot.lower()'s own parameters"),
        (["tiny-without-colon"], "is not MODULE:ATTRIBUTE"),
        (["fixtures.models:tiny", "--donate", "-1"], "-1 is not in the range x>=0"),
    ],
)
def test_compile_usage_errors_exit_2(invoke: Invoke, args: list[str], message: str) -> None:
    result = invoke("compile", *args)
    line = one_line_error(result, code=2)
    assert message in line, line
    assert "Try 'aot compile --help' for help." in result.output


def test_a_failure_in_user_code_keeps_the_whole_message_and_the_users_line(invoke: Invoke) -> None:
    result = invoke("compile", "tests.cli.models:broken", "--arg", "f32[8]")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.splitlines() == [
        "Error: ValueError: this model is broken",
        "second line of the message",
        '  at tests/cli/models.py:39 in broken: raise ValueError("this model is broken\\nsecond line of the message")',
        "(run `aot --debug ...` for the traceback)",
    ]


def test_a_trace_error_keeps_jaxs_explanation_and_the_users_line(invoke: Invoke) -> None:
    result = invoke("compile", "tests.cli.models:branches_on_a_value", "--arg", "f32[]")
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == "Error: TracerBoolConversionError: Attempted boolean conversion of traced array with shape bool[]."
    # JAX's second half, which points at the user's function and argument, is kept.
    assert "The error occurred while tracing the function branches_on_a_value at " in lines[1]
    assert "depends on the value of the argument x" in lines[1]
    assert "  at tests/cli/models.py:" in result.stderr
    assert " in branches_on_a_value: if x > 0:" in result.stderr
    assert lines[-1] == "(run `aot --debug ...` for the traceback)"


def test_in_sharding_count_mismatch_is_a_usage_error(invoke: Invoke) -> None:
    result = invoke(
        "compile", "tests.cli.models:matmul", "--mesh", "data=4,model=2", "--arg", "f32[64,32]",
        "--arg", "f32[32,16]", "--in-sharding", "data,None",
    )
    line = one_line_error(result, code=2)
    assert line == (
        "Error: 1 in_shardings for 2 positional arguments (x, w); give one per positional "
        "argument ('' for replicated, 'auto' to let the compiler choose)"
    )


def test_an_unknown_dtype_lists_the_dtypes_once_and_suggests_one(invoke: Invoke) -> None:
    line = one_line_error(invoke("compile", "fixtures.models:tiny", "--arg", "fp32[8]", "--arg", "f32[8]"))
    assert line.startswith("Error: malformed spec 'fp32[8]': unknown dtype 'fp32' (did you mean f32?); expected ")
    assert line.count("c64, c128") == 1


def test_x64_flag_compiles_with_64_bit_types(invoke: Invoke) -> None:
    data = compile_json(invoke, "fixtures.models:tiny", "--arg", "f64[8]", "--arg", "f64[8]", "--x64", "--name", "tiny64")
    assert data["signature"] == "f64[8], f64[8]"  # never narrowed to f32
    manifest = json.loads(invoke("show", "tiny64", "--json").stdout)["entries"][0]["manifest"]
    assert manifest["program"]["parts"]["x64"] == "true"
    assert manifest["environment"]["parts"]["x64"] == "true"
    # An x64 entry is looked up under x64 too: the second compile is a hit.
    again = compile_json(invoke, "fixtures.models:tiny", "--arg", "f64[8]", "--arg", "f64[8]", "--x64", "--name", "tiny64")
    assert again["hit"] is True and again["key"] == data["key"]
    # ls in a process without x64 names the difference.
    row = [line for line in invoke("ls", "tiny64").stdout.splitlines() if "tiny64" in line][0]
    assert " x64 true " in row


def test_debug_shows_the_exception(invoke: Invoke) -> None:
    quiet = invoke("compile", "nosuch.module:f")
    assert quiet.exit_code == 1 and quiet.exception is not None
    assert isinstance(quiet.exception, SystemExit)
    loud = invoke("--debug", "compile", "nosuch.module:f")
    assert loud.exit_code == 1
    assert isinstance(loud.exception, TargetError)


def test_verbose_logs_what_the_library_does(invoke: Invoke) -> None:
    result = invoke("-v", "compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]")
    assert result.exit_code == 0, result.output
    assert "aot: INFO: stored fixtures.models.tiny (f32[8], f32[8])" in result.stderr
    quiet = invoke("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]")
    assert quiet.stderr == ""


def test_environment_variable_names_the_cache(invoke: Invoke, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AOT_CACHE", str(tmp_path / "from-env"))
    result = invoke("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]", cache=None)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "from-env" / "index.sqlite").exists()


# ---------------------------------------------------------------- why

WHY_KEYS = {
    "name", "label", "signature", "hit", "nearest_key", "nearest_signature", "differences", "stored",
    "arguments", "argument_differences", "xla_flags_outside_key", "served_key", "served_by",
    "target",
}


def test_why_explains_a_miss(invoke: Invoke, warmed) -> None:
    result = invoke("why", "mlp.forward", "--arg", "@fixtures.models:mlp_param_specs", "--arg", "f32[4,784]")
    assert result.exit_code == 1, result.output
    first, *rest = result.stdout.splitlines()
    folded = "params: [{2 arrays}, {2 arrays}, {2 arrays}]"
    assert first.startswith(f"mlp.forward ({folded}, x: f32[4,784]): miss; nearest of 3 stored entries is ")
    # The nearest bucket by shape (batch 1 is 3 away from 4, batch 8 is 4 away).
    assert first.endswith(f" ({folded}, x: f32[1,784])")
    # The argument that differs, by name, as the loader says it.
    assert rest == ["  x: stored f32[1,784], got f32[4,784]"]


def test_why_names_a_leaf_deep_in_a_pytree(invoke: Invoke, warmed) -> None:
    result = invoke("why", "mlp.forward", "--arg", "@tests.cli.models:mlp_params_wider", "--arg", "f32[8,784]")
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[1:] == [
        "  params[2]['b']: stored f32[10], got f32[12]",
        "  params[2]['w']: stored f32[512,10], got f32[512,12]",
    ]


def test_why_hit_and_json(invoke: Invoke, warmed) -> None:
    result = invoke("why", "tiny", "--arg", "f32[8]", "--arg", "f32[8]")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("tiny (x: f32[8], y: f32[8]): hit, key ")
    data = json.loads(invoke("why", "tiny", "--arg", "f32[4]", "--arg", "f32[8]", "--json").stdout)
    assert set(data) == WHY_KEYS
    assert data["hit"] is False and data["stored"] == 1
    assert data["differences"] == [
        {"part": "in_avals", "expected": "f32[8], f32[8]", "actual": "f32[4], f32[8]"}
    ]
    assert data["argument_differences"] == [{"path": "x", "stored": "f32[8]", "requested": "f32[4]"}]
    assert data["arguments"] == [{"path": "x", "aval": "f32[4]"}, {"path": "y", "aval": "f32[8]"}]


def test_why_with_function_compares_the_program(invoke: Invoke) -> None:
    invoke("compile", "tests.cli.models:affine", "--name", "affine", "--arg", "f32[8]", "--kwarg", "bias=f32[8]")
    result = invoke(
        "why", "affine", "--function", "tests.cli.models:affine", "--arg", "f32[8]", "--kwarg", "bias=f32[8]",
        "--static", "double=true", "--json",
    )
    assert result.exit_code == 1, result.output
    parts = {d["part"] for d in json.loads(result.stdout)["differences"]}
    assert "stablehlo" in parts and "in_avals" not in parts
    same = invoke("why", "affine", "--function", "tests.cli.models:affine", "--arg", "f32[8]", "--kwarg", "bias=f32[8]")
    assert same.exit_code == 0, same.output
    # Without --function only the flat signature is compared, keyword arguments included.
    assert invoke("why", "affine", "--arg", "f32[8]", "--kwarg", "bias=f32[8]").exit_code == 0


def test_why_places_a_static_between_dynamic_arguments_as_compile_does(invoke: Invoke) -> None:
    """`--static factor=3` of f(x, factor, y) goes in by position (static_argnums) for
    compile; why must lower the same program (by keyword, y would bind to factor)."""
    stored = compile_json(
        invoke, "tests.cli.models:scale_between", "--name", "between", "--arg", "f32[4]", "--arg", "f32[4]",
        "--static", "factor=3",
    )
    same = invoke(
        "why", "between", "--function", "tests.cli.models:scale_between", "--arg", "f32[4]", "--arg", "f32[4]",
        "--static", "factor=3", "--json",
    )
    assert same.exit_code == 0, same.output
    assert json.loads(same.stdout)["nearest_key"] == stored["key"]
    other = invoke(
        "why", "between", "--function", "tests.cli.models:scale_between", "--arg", "f32[4]", "--arg", "f32[4]",
        "--static", "factor=4", "--json",
    )
    assert other.exit_code == 1 and "stablehlo" in {d["part"] for d in json.loads(other.stdout)["differences"]}


def test_why_unknown_name(invoke: Invoke, warmed) -> None:
    result = invoke("why", "nothing.here", "--arg", "f32[8]")
    assert result.exit_code == 1
    assert result.stdout.strip() == "nothing.here: nothing is stored under this name; compile it first"


def test_a_corrupt_stored_executable_is_quarantined_once_and_compiled_again(invoke: Invoke, cache_dir) -> None:  # noqa: ANN001
    """The quarantine is told once (one line on stderr, naming the entry once), then the
    entry is compiled and stored again."""
    import zstandard

    tiny = ("compile", "fixtures.models:tiny", "--name", "tiny", "--arg", "f32[8]", "--arg", "f32[8]", "--json")
    stored = json.loads(invoke(*tiny).stdout)
    digest = json.loads(invoke("show", "tiny", "--json").stdout)["entries"][0]["entry"]["exe_digest"]
    blob = cache_dir / "blobs" / digest[:2] / f"{digest}.zst"
    blob.write_bytes(zstandard.ZstdCompressor().compress(b"not the executable"))
    again = invoke(*tiny)
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["hit"] is False
    # Then the store repairs the blob, writing the same bytes again.
    assert again.stderr.splitlines() == [
        f"aot: WARNING: quarantined tiny ({stored['key'][:12]}): executable blob {digest} at {cache_dir / 'blobs'} "
        "is corrupt (digest mismatch); run `aot verify` to quarantine the entries using it (they are "
        "recompiled on next use) and `aot gc` to remove it",
        f"aot: WARNING: blob {digest} at {cache_dir / 'blobs'} is corrupt (digest mismatch); rewriting it",
    ]

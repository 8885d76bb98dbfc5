"""cache.explain(name, *specs): the nearest stored entry and the fingerprint parts that
differ (what `aot why` prints)."""

from __future__ import annotations

import json

import aot


def _parts(explanation) -> list[str]:  # noqa: ANN001
    return [d.part for d in explanation.differences]


def test_a_stored_signature_is_a_hit(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    for artifact in compiled.mlp.values():
        cache.put(artifact)
    models = compiled.models
    got = cache.explain(compiled.MLP_NAME, compiled.param_specs, models.mlp_input_spec(2))
    assert got.hit and got.differences == ()
    assert got.nearest_key == compiled.mlp[2].manifest.key
    assert got.stored == 3
    assert "hit" in got.describe()


def test_another_shape_names_the_input_avals(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    for artifact in compiled.mlp.values():
        cache.put(artifact)
    got = cache.explain(compiled.MLP_NAME, compiled.param_specs, "f32[8,784]")
    assert not got.hit
    assert _parts(got) == ["in_avals"]
    assert got.differences[0].actual.endswith("f32[8,784]")
    assert got.signature.endswith("f32[8,784]")
    text = got.describe()
    # The argument that differs, by name (not two whole signatures); the nearest
    # bucket by shape (4 is nearer 8 than 2 is).
    assert "miss" in text and text.splitlines()[1:] == ["  x: stored f32[4,784], got f32[8,784]"]
    assert got.nearest_key == compiled.mlp[4].manifest.key
    data = json.loads(json.dumps(got.to_dict()))
    assert data["argument_differences"] == [{"path": "x", "stored": "f32[4,784]", "requested": "f32[8,784]"}]


def test_a_different_pytree_names_missing_and_unexpected_leaves(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.mlp[4])
    params = list(compiled.param_specs[:2]) + [{"w": compiled.param_specs[2]["w"]}]
    got = cache.explain(compiled.MLP_NAME, params, "f32[4,784]")
    assert [d.describe() for d in got.argument_differences] == [
        "params[2]['b']: stored f32[10], missing from the request",
    ]


def test_another_environment_names_the_differing_part(
    open_folder_cache, compiled, foreign  # noqa: ANN001
) -> None:
    cache = open_folder_cache()
    cache.put(foreign(compiled.mlp[4], jaxlib="0.0.1"))
    got = cache.explain(compiled.MLP_NAME, compiled.param_specs, "f32[4,784]")
    assert not got.hit
    assert _parts(got) == ["jaxlib"]
    difference = got.differences[0]
    assert (difference.expected, difference.actual) == ("0.0.1", cache.environment.as_dict()["jaxlib"])
    assert f"jaxlib 0.0.1 != {difference.actual}" in got.describe()


def test_with_the_function_the_program_parts_are_compared(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.tiny)
    models = compiled.models
    same = cache.explain(compiled.TINY_NAME, *models.tiny_specs(), fn=models.tiny)
    assert same.hit

    def tiny_changed(x, y):  # noqa: ANN001, ANN202
        return x * y + 2

    got = cache.explain(compiled.TINY_NAME, *models.tiny_specs(), fn=tiny_changed)
    assert not got.hit
    assert "stablehlo" in _parts(got)
    assert "in_avals" not in _parts(got)


def test_a_quarantined_entry_says_so(open_folder_cache, compiled) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    entry = cache.put(compiled.tiny)
    cache.quarantine(entry, "test")
    got = cache.explain(compiled.TINY_NAME, *compiled.models.tiny_specs())
    assert not got.hit and _parts(got) == ["state"]


def test_nothing_stored_under_the_name(open_folder_cache, compiled) -> None:  # noqa: ANN001
    got = open_folder_cache().explain("no.such.model", "f32[8]")
    assert not got.hit and got.stored == 0 and got.nearest_key is None
    assert "nothing is stored" in got.describe()


def test_the_nearest_of_several_entries(open_folder_cache, compiled, foreign) -> None:  # noqa: ANN001
    cache = open_folder_cache()
    cache.put(compiled.mlp[1])  # differs in in_avals
    cache.put(foreign(compiled.mlp[2], jaxlib="0.0.1", device_kind="tpu"))  # two env parts
    got = cache.explain(compiled.MLP_NAME, compiled.param_specs, "f32[2,784]")
    assert got.nearest_key == compiled.mlp[1].manifest.key
    assert _parts(got) == ["in_avals"]
    assert aot.load(compiled.MLP_NAME, cache=cache, lazy=True).signatures  # both listed


def test_dump_flags_still_hit_and_why_names_them(open_folder_cache, compiled, monkeypatch) -> None:  # noqa: ANN001
    """XLA_FLAGS=--xla_dump_to=... (debugging) does not make stored entries miss; a flag
    that changes the generated code does, and `aot why` says which."""
    import os

    models = compiled.models
    open_folder_cache().compile(models.tiny, *models.tiny_specs(), name="tiny")
    base = os.environ["XLA_FLAGS"]

    monkeypatch.setenv("XLA_FLAGS", f"{base} --xla_dump_to=/tmp/aot-dump --xla_dump_hlo_as_text")
    debugging = open_folder_cache()  # a new Cache reads the environment afresh
    result = debugging.compile_entry(models.tiny, *models.tiny_specs(), name="tiny")
    assert result.hit
    got = debugging.explain("tiny", *models.tiny_specs())
    assert got.hit
    assert "--xla_dump_to=/tmp/aot-dump" in got.xla_flags_outside_key
    assert got.to_dict()["xla_flags_outside_key"] == got.xla_flags_outside_key

    monkeypatch.setenv("XLA_FLAGS", f"{base} --xla_cpu_enable_fast_math=true")
    fast_math = open_folder_cache()
    got = fast_math.explain("tiny", *models.tiny_specs())
    assert not got.hit and _parts(got) == ["xla_flags"]
    assert "--xla_cpu_enable_fast_math=true" in got.describe()
    assert not fast_math.compile_entry(models.tiny, *models.tiny_specs(), name="tiny").hit

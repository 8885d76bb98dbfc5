"""The environment key is at least as exact as JAX's persistent-cache key: the TPU
compiler flags of ``LIBTPU_INIT_ARGS`` are a part (``libtpu_init_args``) of TPU entries,
present only when set, so entries stored before the part existed keep their keys."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import aot
from aot.artifact import check_environment
from aot.environment import environment_parts, relevant_libtpu_init_args
from aot.errors import IncompatibleEnvironmentError
from aot.fingerprint import environment_fingerprint

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu not installed: compiling for a TPU target needs pip install 'jax-aot[tpu]' (.ci/run installs it)",
)

# The parts a TPU entry had before LIBTPU_INIT_ARGS entered the key: with the variable
# unset, exactly these, so its key did not change.
PARTS_BEFORE = {
    "jax", "jaxlib", "platform", "platform_version", "device_kind", "device_count",
    "process_count", "topology", "x64", "xla_flags",
}
FLAGS = "--xla_tpu_enable_latency_hiding_scheduler=false --xla_enable_async_all_gather=true"


def test_libtpu_flags_are_sorted_and_the_ones_that_cannot_change_the_code_left_out() -> None:
    args = (
        " --xla_tpu_use_enhanced_launch_barrier=true --xla_dump_to=/tmp/d "
        "--xla_tpu_enable_latency_hiding_scheduler=false --xla_enable_async_all_gather=true"
    )
    assert relevant_libtpu_init_args(args) == (
        "--xla_enable_async_all_gather=true --xla_tpu_enable_latency_hiding_scheduler=false"
    )
    # What `import jax` appends on every TPU VM alone is no flag at all: the chip's
    # environment equals a deviceless compile's.
    assert relevant_libtpu_init_args(" --xla_tpu_use_enhanced_launch_barrier=true") == ""
    # The same flags in another order are the same key.
    assert relevant_libtpu_init_args(FLAGS) == relevant_libtpu_init_args(" ".join(reversed(FLAGS.split())))


def test_a_cpu_entry_does_not_read_libtpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    before = environment_fingerprint().digest
    monkeypatch.setenv("LIBTPU_INIT_ARGS", FLAGS)
    parts = environment_parts()
    assert "libtpu_init_args" not in parts  # libtpu compiles nothing for the CPU
    assert environment_fingerprint().digest == before


@needs_libtpu
def test_unset_libtpu_flags_keep_a_target_entry_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    devices = aot.parse_target("tpu:v5e:1x1").devices()
    assert set(environment_parts(devices=devices)) == PARTS_BEFORE
    monkeypatch.setenv("LIBTPU_INIT_ARGS", " --xla_tpu_use_enhanced_launch_barrier=true")
    assert set(environment_parts(devices=devices)) == PARTS_BEFORE  # as on a TPU VM


@needs_libtpu
def test_other_libtpu_flags_are_another_environment_and_the_error_names_the_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    devices = aot.parse_target("tpu:v5e:1x1").devices()
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    plain = environment_fingerprint(devices=devices)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", FLAGS)
    flagged = environment_fingerprint(devices=devices)
    assert flagged.digest != plain.digest
    assert flagged.as_dict()["libtpu_init_args"] == relevant_libtpu_init_args(FLAGS)
    (difference,) = plain.diff(flagged)
    assert difference.part == "libtpu_init_args"
    assert difference.describe() == (
        "libtpu_init_args (absent) != --xla_enable_async_all_gather=true --xla_tpu_enable_latency_hiding_scheduler=..."
    )


COMPILE_FOR_TARGET = textwrap.dedent("""
    import json, sys
    import jax.numpy as jnp
    import aot

    def f(x):
        return jnp.tanh(x) * 2.0

    cache = aot.Cache(sys.argv[1])
    entry = cache.compile(f, "f32[8,128]", name="libtpu.f", target="tpu:v5e:1x1")
    print(json.dumps({"key": entry.key}))
""")


@needs_libtpu
def test_an_entry_compiled_with_flags_is_refused_where_they_are_not_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes: one compiles for the chip with LIBTPU_INIT_ARGS set (libtpu
    compiles with the compiling process's flags), the other, without them, computes the
    chip's environment as a serving process there would and is refused, naming the part."""
    script = tmp_path / "compile_for_target.py"
    script.write_text(COMPILE_FOR_TARGET)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "LIBTPU_INIT_ARGS": FLAGS}
    env.pop("AOT_CACHE", None)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "cache")], env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    key = json.loads(done.stdout.strip().splitlines()[-1])["key"]

    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    cache = aot.Cache(tmp_path / "cache")
    try:
        manifest = cache.artifact(key).manifest
        assert manifest.environment.as_dict()["libtpu_init_args"] == relevant_libtpu_init_args(FLAGS)
        here = environment_fingerprint(devices=aot.parse_target("tpu:v5e:1x1").devices())
        with pytest.raises(IncompatibleEnvironmentError, match=r"libtpu_init_args .* != \(absent\)"):
            check_environment(manifest, here)
        monkeypatch.setenv("LIBTPU_INIT_ARGS", " ".join(reversed(FLAGS.split())))  # same flags, other order
        check_environment(manifest, environment_fingerprint(devices=aot.parse_target("tpu:v5e:1x1").devices()))
    finally:
        cache.close()


def test_aot_why_names_the_libtpu_part(tmp_path: Path) -> None:
    """An entry stored under flags this process lacks (its environment as a TPU host
    with LIBTPU_INIT_ARGS records it; here on this host's other parts): `aot why` says
    the libtpu_init_args part differs, stored value first."""
    from dataclasses import replace

    from click.testing import CliRunner

    from aot.artifact import Artifact
    from aot.build import build_artifact
    from aot.cli.main import cli
    from aot.fingerprint import Fingerprint, combined_key

    comp = aot.lower(lambda x: x * 2.0, "f32[8]", name="libtpu.why")
    artifact = build_artifact(comp.compile(), comp.portable_hlo(comp.compile()))
    parts = dict(artifact.manifest.environment.as_dict(), libtpu_init_args=relevant_libtpu_init_args(FLAGS))
    environment = Fingerprint.of("environment", parts)
    manifest = replace(artifact.manifest, environment=environment,
                       key=combined_key(artifact.manifest.program, environment))
    cache = aot.Cache(tmp_path / "c")
    cache.put_artifact(Artifact(manifest, artifact.blobs))
    cache.close()
    out = CliRunner().invoke(cli, ["--cache", str(tmp_path / "c"), "why", "libtpu.why", "--arg", "f32[8]"])
    assert (
        "  libtpu_init_args --xla_enable_async_all_gather=true --xla_tpu_enable_latency_hiding_scheduler=... "
        "!= (absent)"
    ) in out.output.splitlines(), out.output

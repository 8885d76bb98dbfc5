"""Helpers of the CLI tests, imported by name (tests/cli is on sys.path; a test module
importing ``conftest`` could get tests/conftest.py or another folder's instead)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from click.testing import Result

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "fixtures" / "warmup.toml"
# The manifest's entries: (label, name), in file order.
MANIFEST_LABELS = [
    "mlp.forward[batch=1]", "mlp.forward[batch=8]", "mlp.forward[batch=32]", "tiny", "allreduce",
]
MLP_PARAMS = "f32[512], f32[784,512], f32[512], f32[512,512], f32[10], f32[512,10]"
# `aot ...` in a process where JAX's topology API fails as it does without libtpu
# (python -c WITHOUT_LIBTPU ARGS...).
WITHOUT_LIBTPU = (
    "import sys\n"
    "from jax.experimental import topologies\n"
    "def missing(*args, **kwargs):\n"
    "    raise RuntimeError('JAX TPU support not installed; cannot generate TPU topology.')\n"
    "topologies.get_topology_desc = missing\n"
    "from aot.cli.main import main\n"
    "sys.argv = ['aot', *sys.argv[1:]]\n"
    "main()\n"
)
MLP_TREE = "params: [{b: f32[512], w: f32[784,512]}, {b: f32[512], w: f32[512,512]}, {b: f32[10], w: f32[512,10]}]"

Invoke = Callable[..., Result]


def one_line_error(result: Result, *, code: int = 1) -> str:
    """Asserts a failure reported as a single ``Error:`` line without a traceback."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    if code == 1:
        assert lines == errors, result.output
    return errors[0]


def store_for_another_environment(cache_dir: Path, name: str, **parts: str) -> str:
    """Stores a copy of ``name``'s first entry as if compiled where the environment
    ``parts`` differ (e.g. ``device_count="4"``); returns its key."""
    from dataclasses import replace

    import aot
    from aot.artifact import Artifact
    from aot.fingerprint import Fingerprint, combined_key

    cache = aot.Cache(cache_dir)
    try:
        artifact = cache.artifact(cache.entries(name)[0])
        manifest = artifact.manifest
        environment = Fingerprint.of("environment", manifest.environment.as_dict() | parts)
        foreign = replace(manifest, environment=environment, key=combined_key(manifest.program, environment))
        cache.put_artifact(Artifact(foreign, artifact.blobs))
        return foreign.key
    finally:
        cache.close()

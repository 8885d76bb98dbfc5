"""Commands that need no device never import JAX (issue 25, goal 2).

Each command runs in a fresh process through a wrapper that reports, at exit, whether
``jax`` (and ``sqlalchemy``) were imported. ``--env this`` and the ENV column read this
host's environment record (:mod:`aot.env_record`): the first listing without one
imports JAX and writes it, the next one does not; a record written under other
variables is not read; the loader never reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from aot import env_record
from tests.cli.helpers import REPO

# Runs the CLI like the console script, then says which heavy modules it imported.
WRAPPER = (
    "import atexit, sys\n"
    "atexit.register(lambda: sys.stderr.write('IMPORTED=' + ','.join(sorted("
    "m for m in ('jax', 'jaxlib', 'sqlalchemy', 'numpy') if m in sys.modules)) + '\\n'))\n"
    "from aot.cli.main import main\n"
    "main(sys.argv[1:])\n"
)


def _env(records: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AOT_", "_AOT_COMP", "COMP_"))}
    env.update({env_record.RECORD_ENV: str(records)}, **extra)
    return env


def run_aot(records: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, set[str]]:
    """``aot ARGS`` in a fresh process: its stdout and the heavy modules it imported."""
    out, _, imported = run_aot_logged(records, *args, env=env)
    return out, imported


def run_aot_logged(records: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, list[str], set[str]]:
    """:func:`run_aot`, with the other lines of its stderr (the log)."""
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, *args], cwd=REPO, env=env or _env(records),
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    imported = [line for line in lines if line.startswith("IMPORTED=")]
    assert imported, done.stderr
    log = [line for line in lines if not line.startswith("IMPORTED=")]
    return done.stdout, log, set(filter(None, imported[-1].removeprefix("IMPORTED=").split(",")))


def write_record(records: Path, env: dict[str, str]) -> None:
    """What any process with JAX does: compute the environment fingerprint."""
    subprocess.run(
        [sys.executable, "-c", "from aot.fingerprint import environment_fingerprint; environment_fingerprint()"],
        cwd=REPO, env=env, check=True, timeout=120,
    )


@pytest.fixture
def records(tmp_path: Path) -> Path:
    """An empty folder of environment records."""
    return tmp_path / "records"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding this host's record, written once by a process with JAX."""
    folder = tmp_path_factory.mktemp("recorded")
    write_record(folder, _env(folder))
    return folder


def test_listing_without_a_record_imports_jax_once_then_reads_the_record(warmed: Path, records: Path) -> None:
    if env_record.record_key() is None:
        pytest.skip("no boot id on this host: no environment record")
    first, imported = run_aot(records, "--cache", str(warmed), "ls", "--env", "this", "--json")
    assert "jax" in imported  # no record yet: the real fingerprint, written down
    assert len(list(records.glob("*.json"))) == 1
    second, imported = run_aot(records, "--cache", str(warmed), "ls", "--env", "this", "--json")
    assert "jax" not in imported and "sqlalchemy" not in imported
    assert json.loads(second) == json.loads(first)
    assert json.loads(second)["count"] == 5  # every entry of fixtures/warmup.toml is for this environment


@pytest.mark.parametrize("command", [
    ("ls",), ("ls", "mlp*", "--env", "this"), ("show", "tiny"), ("show", "mlp.forward", "--json"),
    ("stats",), ("gc", "--dry-run"), ("gc", "--dry-run", "--older-than", "1d", "--superseded", "--json"),
    ("gc",), ("rm", "tiny", "--dry-run"), ("history", "tiny"), ("release", "ls"),
])
def test_read_commands_do_not_import_jax(warmed: Path, recorded: Path, command: tuple[str, ...]) -> None:
    out, imported = run_aot(recorded, "--cache", str(warmed), *command)
    assert "jax" not in imported and "jaxlib" not in imported, (command, imported)
    if command[0] in ("ls", "show", "stats", "rm", "gc"):
        # a folder cache: the stdlib reader (gc: plans with it, and deletes nothing here)
        assert "sqlalchemy" not in imported
    if command[0] == "gc":
        assert "nothing to collect" in out or json.loads(out)["entries"] == []
    if command[0] == "ls":
        assert " this " in out  # ENV from the record
        assert "another" not in out


def test_a_gc_that_only_drops_expired_leases_imports_no_sqlalchemy(warmed: Path, recorded: Path) -> None:
    """A killed writer's expired lease is a folder cache's only garbage: the executed gc
    (no terminal: nothing asks) drops it through the standard library, keeps a live one,
    and says what it said when it went through the SQL index."""
    import aot

    killed, alive = hashlib.sha256(b"killed").hexdigest(), hashlib.sha256(b"alive").hexdigest()
    with aot.Cache(str(warmed)) as cache:
        cache.index.lease([killed], seconds=0.0)
        cache.index.lease([alive])
    planned, _ = run_aot(recorded, "--cache", str(warmed), "gc", "--dry-run")
    out, log, imported = run_aot_logged(recorded, "-v", "--cache", str(warmed), "gc")
    assert "sqlalchemy" not in imported and "jax" not in imported, imported
    assert out == planned and out.startswith("nothing to collect (cache ")
    assert log == [
        "aot: INFO: gc: dropped 1 expired leases of writers that died",
        "aot: INFO: gc: removed 0 entries and 0 blobs, freed 0 B",
    ]
    with sqlite3.connect(warmed / "index.sqlite") as conn:
        assert [d for (d,) in conn.execute("SELECT digest FROM blob_leases")] == [alive]
    out, log, imported = run_aot_logged(recorded, "-v", "--cache", str(warmed), "gc", "--json")
    assert "sqlalchemy" not in imported and json.loads(out)["executed"] is True
    assert log == ["aot: INFO: gc: removed 0 entries and 0 blobs, freed 0 B"]  # nothing left to drop


def test_copy_commands_do_not_import_jax(warmed: Path, recorded: Path, tmp_path: Path) -> None:
    other, bundle = tmp_path / "other", tmp_path / "entries.aot"
    for command in (
        ("push", str(other)), ("pull", str(other)), ("bundle", "export", str(bundle)),
        ("bundle", "import", str(bundle)),
    ):
        _, imported = run_aot(recorded, "--cache", str(warmed), *command)
        assert "jax" not in imported, (command, imported)
        if command[:2] == ("bundle", "export"):
            assert "sqlalchemy" not in imported  # reads a folder cache with the stdlib reader
    out, _ = run_aot(recorded, "--cache", str(other), "ls", "--env", "all")
    assert out.count("mlp.forward") == 3


def test_postgresql_commands_do_not_import_jax(warmed: Path, recorded: Path, postgres_url: str) -> None:
    _, imported = run_aot(recorded, "--cache", str(warmed), "push", postgres_url)
    assert "jax" not in imported
    for command in (("ls", "--env", "this"), ("show", "tiny"), ("stats",), ("gc", "--dry-run")):
        out, imported = run_aot(recorded, "--cache", postgres_url, *command)
        assert "jax" not in imported, (command, imported)
        if command[0] == "ls":
            assert out.count(" this ") == 5


def test_completion_of_entry_names_does_not_import_jax(warmed: Path, recorded: Path) -> None:
    env = _env(recorded, _AOT_COMPLETE="bash_complete", COMP_WORDS=f"aot --cache {warmed} show ml", COMP_CWORD="4")
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER], cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert "plain,mlp.forward" in done.stdout.splitlines()
    assert "IMPORTED=" in done.stderr and "jax" not in done.stderr.split("IMPORTED=")[-1]


def test_a_record_under_other_variables_is_not_read(monkeypatch: pytest.MonkeyPatch, records: Path) -> None:
    key = env_record.record_key()
    if key is None:
        pytest.skip("no boot id on this host: no environment record")
    monkeypatch.setenv(env_record.RECORD_ENV, str(records))
    path = env_record.record_path(key)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": key, "parts": {"platform": "cpu", "device_count": "3"}}))
    assert env_record.read_parts() == {"platform": "cpu", "device_count": "3"}
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_fast_math=true")
    assert env_record.read_parts() is None  # the flags changed: another key
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "").replace(" --xla_cpu_enable_fast_math=true", ""))
    path.write_text(json.dumps({"key": {**key, "boot_id": "another boot"}, "parts": {"platform": "cpu"}}))
    assert env_record.read_parts() is None  # written under another key (a collision, a copy)
    path.write_text("{not json")
    assert env_record.read_parts() is None
    monkeypatch.setenv(env_record.RECORD_ENV, "off")
    assert env_record.record_folder() is None


def test_a_process_that_changed_its_configuration_writes_no_record(records: Path) -> None:
    if env_record.record_key() is None:
        pytest.skip("no boot id on this host: no environment record")
    code = (
        "import jax; jax.config.update('jax_enable_x64', True)\n"
        "from aot.fingerprint import environment_fingerprint; environment_fingerprint()\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(records), check=True, timeout=120)
    assert not records.exists() or not list(records.glob("*.json"))


@pytest.mark.slow
def test_the_loader_never_reads_the_record(warmed: Path, records: Path) -> None:
    """A wrong record (another device count) makes the listing wrong, never the loader:
    aot.load computes the real fingerprint and serves this environment's entry."""
    env = _env(records)
    write_record(records, env)
    (path,) = records.glob("*.json")
    data = json.loads(path.read_text())
    data["parts"]["device_count"] = "1"
    path.write_text(json.dumps(data))
    out, imported = run_aot(records, "--cache", str(warmed), "ls", "tiny", env=env)
    assert "jax" not in imported and "device_count" in out  # the listing trusts the record
    code = (
        "import numpy as np, aot\n"
        f"f = aot.load('tiny', cache={str(warmed)!r}, strict=True)\n"
        "print(np.asarray(f(np.ones(8, np.float32), np.ones(8, np.float32))).tolist())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    from fixtures.models import tiny

    import numpy as np

    expected = np.asarray(tiny(np.ones(8, np.float32), np.ones(8, np.float32))).tolist()
    assert json.loads(done.stdout.strip()) == expected


def test_records_folder_defaults_to_the_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(env_record.RECORD_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert env_record.record_folder() == tmp_path / "jax-aot" / "environment"


def test_library_modules_of_these_commands_import_no_jax_or_numpy() -> None:
    """Importing them is free of JAX (and NumPy); only what needs a device imports it."""
    modules = (
        "aot", "aot.cli.main", "aot.cache.cache", "aot.cache.reports.listing", "aot.cache.reports.details",
        "aot.cache.reports.stats", "aot.cache.admin.bundle", "aot.cache.admin.transfer",
        "aot.cache.admin.removal", "aot.cache.admin.maintenance", "aot.artifact", "aot.signing", "aot.fingerprint",
        "aot.device",
    )
    code = (
        f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in ('jax', 'jaxlib', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_up_to_date_push_or_pull_imports_no_sqlalchemy(warmed: Path, recorded: Path, tmp_path: Path) -> None:
    """Nothing to copy between two folder caches: decided read-only through the stdlib
    reader (cache/admin/up_to_date.py), the SQL index of neither side opened."""
    other = tmp_path / "other"
    first, _ = run_aot(recorded, "--cache", str(warmed), "push", str(other))  # creates and copies: SQLAlchemy
    assert first.startswith("pushed 5 entries")
    for command in (
        ("push", str(other)), ("push", str(other), "mlp*", "--json"), ("pull", str(other)),
        ("pull", str(other), "tiny", "--refs"),
    ):
        out, imported = run_aot(recorded, "--cache", str(warmed), *command)
        assert "sqlalchemy" not in imported and "jax" not in imported, (command, imported)
        assert "0 entries (0 B)" in out or json.loads(out)["copied"] == 0, out


def _every_dtype(params, x, key, c, b, small, u):  # noqa: ANN001, ANN202
    return x.sum() + sum(v.sum() for v in params.values()).astype(x.dtype)


@pytest.fixture(scope="module")
def dtypes_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One entry whose signature holds bf16, f16, int4, uint4, complex, bool and a typed
    key (each once imported JAX in `aot ls`: issue 43), in a release."""
    import jax
    import jax.numpy as jnp

    import aot
    from aot.cache.index.refs import RefOrigin

    folder = tmp_path_factory.mktemp("dtypes") / "cache"
    params = {f"w{i:02d}": jax.ShapeDtypeStruct((4, 4), jnp.bfloat16) for i in range(41)}
    specs = ("f16[8]", "key<fry>[2]", "c64[4]", "bool[4]", "i4[8]", "u4[8]")
    with aot.Cache(str(folder)) as cache:
        cache.compile(_every_dtype, params, *map(aot.spec, specs), name="dtypes")
        (entry,) = cache.entries()
        set_id = cache.index.open_release("prod", RefOrigin("test"))
        cache.index.set_refs([(entry.name, entry.signature, entry.env_fp, entry.key)], RefOrigin("test"), release_id=set_id)
    return folder


@pytest.mark.parametrize("command", [
    ("ls",), ("ls", "--json"), ("show", "dtypes"), ("show", "dtypes", "--json"), ("stats",), ("release", "show", "prod"),
])
def test_listings_of_every_dtype_do_not_import_jax(dtypes_cache: Path, recorded: Path, command: tuple[str, ...]) -> None:
    out, imported = run_aot(recorded, "--cache", str(dtypes_cache), *command)
    assert "jax" not in imported and "jaxlib" not in imported, (command, imported)
    if command == ("ls",):
        (row,) = out.splitlines()[1:-1]
        assert "  ..., key: key<fry>[2], c: c64[4], b: bool[4], small: i4[8], u: u4[8]  this  " in row
    if command == ("ls", "--json"):
        (entry,) = json.loads(out)["entries"]
        avals = [a["aval"] for a in entry["arguments"]]
        assert avals[0] == "bf16[4,4]" and avals[41:] == ["f16[8]", "key<fry>[2]", "c64[4]", "bool[4]", "i4[8]", "u4[8]"]
    if command == ("show", "dtypes"):
        lines = [line.split() for line in out.splitlines()]
        assert ["key", "key<fry>[2]"] in lines and ["small", "i4[8]"] in lines and ["params['w40']", "bf16[4,4]"] in lines
    if command[:2] == ("release", "show"):
        assert out.splitlines()[1].endswith(", f16[8], key<fry>[2], c64[4], bool[4], i4[8], u4[8])")

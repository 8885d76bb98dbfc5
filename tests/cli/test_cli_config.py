"""Settings: flags > environment > [tool.aot] in pyproject.toml > defaults; global
options before or after the subcommand; aot doctor says where each setting came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import aot
from tests.cli.helpers import Invoke, one_line_error


def _project(folder: Path, table: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(f'[project]\nname = "x"\n\n[tool.aot]\n{table}\n')
    return folder


def _settings(invoke: Invoke, *args: str) -> dict:
    result = invoke(*args, "doctor", "--no-verify", "--json", cache=None)
    return json.loads(result.stdout)["settings"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with [tool.aot] cache = "./from-config", as the working directory
    (a subfolder of it, to check that the file is found upwards)."""
    root = _project(tmp_path / "project", 'cache = "from-config"\nmanifest = "warmup.toml"')
    (root / "src").mkdir()
    monkeypatch.chdir(root / "src")
    return root


def test_precedence_flag_environment_config_default(
    invoke: Invoke, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = f"{project / 'pyproject.toml'} [tool.aot]"
    settings = _settings(invoke)
    assert settings["config_file"] == str(project / "pyproject.toml")
    # Relative to the file's folder, not to the working directory.
    assert settings["cache"] == {"value": str(project / "from-config"), "source": config}
    assert settings["manifest"] == {"value": str(project / "warmup.toml"), "source": config}
    assert settings["blobs"] == {"value": None, "source": "default"}
    monkeypatch.setenv("AOT_CACHE", str(tmp_path / "from-env"))
    assert _settings(invoke)["cache"] == {"value": str(tmp_path / "from-env"), "source": "environment AOT_CACHE"}
    flagged = _settings(invoke, "--cache", str(tmp_path / "from-flag"))
    assert flagged["cache"] == {"value": str(tmp_path / "from-flag"), "source": "flag --cache"}


def test_default_without_a_config_file(invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = _settings(invoke)
    assert settings["config_file"] is None
    assert settings["cache"]["source"] == "default" and settings["cache"]["value"].endswith("jax-aot")


def test_a_pyproject_without_tool_aot_is_skipped(invoke: Invoke, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inner = project / "src" / "pkg"
    inner.mkdir()
    (inner / "pyproject.toml").write_text('[project]\nname = "pkg"\n')
    monkeypatch.chdir(inner)
    assert _settings(invoke)["config_file"] == str(project / "pyproject.toml")


def test_the_configured_cache_is_used(invoke: Invoke, project: Path) -> None:
    result = invoke("compile", "tests.cli.models:matmul", "--arg", "f32[2,2]", "--arg", "f32[2,2]", cache=None)
    assert result.exit_code == 0, result.output
    assert (project / "from-config" / "index.sqlite").exists()
    assert result.stdout.splitlines()[-1] == f"  cache      {project / 'from-config'}"


def test_a_missing_cache_names_where_its_location_came_from(invoke: Invoke, project: Path) -> None:
    line = one_line_error(invoke("ls", cache=None))
    assert line.endswith(f"(the location came from {project / 'pyproject.toml'} [tool.aot])")


def test_unknown_keys_in_the_config_are_errors(invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _project(tmp_path / "p", 'cahce = "x"')
    monkeypatch.chdir(folder)
    line = one_line_error(invoke("ls", cache=None))
    assert line == (
        f"Error: {folder / 'pyproject.toml'}: unknown key(s) ['cahce'] in [tool.aot]; expected "
        "some of ['blob_connect_timeout', 'blob_read_timeout', 'blob_retries', 'blobs', 'cache', "
        "'db_connect_timeout', 'db_statement_timeout', 'local', 'manifest', 'signing_key_file', "
        "'stats_exit_timeout', 'worker_stopped_timeout']"
    )


def test_warmup_uses_the_configured_manifest(invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = one_line_error(invoke("warmup"), code=2)  # from the repository: no config
    assert line == (
        "Error: no manifest: give MANIFEST.toml, or set AOT_MANIFEST or manifest in [tool.aot] "
        "of pyproject.toml"
    )
    (tmp_path / "warmup.toml").write_text(
        '[[function]]\nname = "mm"\nfunction = "tests.cli.models:matmul"\nargs = ["f32[2,2]", "f32[2,2]"]\n'
    )
    monkeypatch.chdir(_project(tmp_path, 'manifest = "warmup.toml"'))
    result = invoke("warmup")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2
    assert result.stdout.startswith("compiled  mm (x: f32[2,2], w: f32[2,2]) ")
    assert result.stdout.splitlines()[1].startswith("1 entry: 1 compiled, 0 hit, 0 failed in ")


def test_blob_location_from_the_environment(invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AOT_BLOBS", str(tmp_path / "blobs"))
    result = invoke("compile", "fixtures.models:tiny", "--arg", "f32[8]", "--arg", "f32[8]")
    assert result.exit_code == 0, result.output
    stored = sorted(p.name for p in (tmp_path / "blobs").rglob("*.zst"))
    assert len(stored) == 3  # executable, portable HLO, manifest
    assert not (tmp_path / "cache" / "blobs").exists()
    # --blobs after the subcommand wins over the environment.
    other = invoke("compile", "fixtures.models:tiny", "--arg", "f32[4]", "--arg", "f32[4]", "--blobs", tmp_path / "b2")
    assert other.exit_code == 0, other.output
    assert len(list((tmp_path / "b2").rglob("*.zst"))) == 3


def test_signing_key_file_from_the_config(invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "aot.key").write_text("s3cret\n")
    folder = _project(tmp_path, 'signing_key_file = "aot.key"')
    monkeypatch.chdir(folder)
    signed = invoke("compile", "tests.cli.models:matmul", "--arg", "f32[4,4]", "--arg", "f32[4,4]", "--json")
    assert signed.exit_code == 0, signed.output
    key = json.loads(signed.stdout)["key"]
    cache = aot.Cache(tmp_path / "cache", signing_key="s3cret")  # the file's key, newline stripped
    try:
        assert cache.artifact(key).manifest.hmac is not None  # verifies with the key
    finally:
        cache.close()
    settings = _settings(invoke, "--cache", str(tmp_path / "cache"))
    assert settings["signing_key_file"] == {
        "value": str(tmp_path / "aot.key"), "source": f"{folder / 'pyproject.toml'} [tool.aot]",
    }
    monkeypatch.setenv("AOT_SIGNING_KEY", "from-env")  # the environment wins
    settings = _settings(invoke, "--cache", str(tmp_path / "cache"))
    assert settings["signing_key_file"] == {"value": "(a key, not a file)", "source": "environment AOT_SIGNING_KEY"}
    (tmp_path / "aot.key").write_text("")
    monkeypatch.delenv("AOT_SIGNING_KEY")
    line = one_line_error(invoke("ls"))
    assert line == f"Error: the signing key file {tmp_path / 'aot.key'} (from {folder / 'pyproject.toml'} [tool.aot]) is empty"


def test_doctor_shows_where_each_setting_came_from(invoke: Invoke, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AOT_BLOBS", "/srv/blobs")
    result = invoke("doctor", "--no-verify", cache=None)
    text = result.stdout
    assert f"settings (config: {project / 'pyproject.toml'})\n" in text
    assert f"  cache        {project / 'from-config'}  ({project / 'pyproject.toml'} [tool.aot])\n" in text
    assert "  blobs        /srv/blobs  (environment AOT_BLOBS)\n" in text
    assert "  signing key  -  (default)\n" in text
    assert f"  manifest     {project / 'warmup.toml'}  ({project / 'pyproject.toml'} [tool.aot])\n" in text


def test_doctor_shows_each_network_bound_and_where_it_came_from(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _project(tmp_path / "p", "blob_read_timeout = 2.5\ndb_statement_timeout = 0")
    monkeypatch.chdir(folder)
    monkeypatch.setenv("AOT_BLOB_RETRIES", "1")
    config = f"{folder / 'pyproject.toml'} [tool.aot]"
    text = invoke("doctor", "--no-verify").stdout
    section = text.split("timeouts (seconds; blob_retries: attempts)\n", 1)[1].split("\ncache\n", 1)[0]
    assert section.splitlines() == [
        "  db_connect_timeout      5  (default)",
        f"  db_statement_timeout    0  ({config})",
        "  blob_connect_timeout    5  (default)",
        f"  blob_read_timeout       2.5  ({config})",
        "  blob_retries            1  (environment AOT_BLOB_RETRIES)",
        "  stats_exit_timeout      5  (default)",
        "  worker_stopped_timeout  10  (default)",
    ]
    bounds = _settings(invoke)["timeouts"]
    assert bounds["blob_read_timeout"] == {"value": 2.5, "source": config}
    assert bounds["blob_retries"] == {"value": 1, "source": "environment AOT_BLOB_RETRIES"}


def test_commands_open_the_cache_with_the_configured_bounds(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aot.cache.cache import Cache

    aot.Cache(tmp_path / "cache").close()
    opened: list = []
    real = Cache.__init__

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(kwargs.get("timeouts"))
        real(self, *args, **kwargs)

    monkeypatch.setattr(Cache, "__init__", spy)
    monkeypatch.chdir(_project(tmp_path / "p", "blob_read_timeout = 2.5\nstats_exit_timeout = 1"))
    monkeypatch.setenv("AOT_BLOB_READ_TIMEOUT", "4")  # the environment beats the file
    assert invoke("ls").exit_code == 0
    assert opened == [aot.Timeouts(blob_read_s=4, stats_exit_s=1)]
    monkeypatch.setenv("AOT_BLOB_READ_TIMEOUT", "soon")
    line = one_line_error(invoke("ls"))
    assert line.startswith("Error: AOT_BLOB_READ_TIMEOUT='soon' is not a timeout: expected seconds")


def test_a_malformed_bound_in_the_config_is_one_error_line(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _project(tmp_path / "p", 'blob_read_timeout = "10s"')
    monkeypatch.chdir(folder)
    assert one_line_error(invoke("ls")) == (
        f"Error: {folder / 'pyproject.toml'}: [tool.aot] blob_read_timeout = \"10s\" is not a timeout: "
        "expected seconds, more than 0, e.g. blob_read_timeout = 10"
    )


# ---------------------------------------------------------------- options anywhere


def test_global_options_after_the_subcommand(invoke: Invoke, warmed, cache_dir: Path) -> None:
    before = invoke("--json", "ls", cache=None, env={"AOT_CACHE": str(cache_dir)})
    after = invoke("ls", "--cache", cache_dir, "--json", cache=None)
    assert before.exit_code == after.exit_code == 0, (before.output, after.output)
    assert json.loads(before.stdout) == json.loads(after.stdout)
    assert json.loads(after.stdout)["count"] == 5
    line = one_line_error(invoke("gc", "--max-size", "1", "--read-only", cache=None, env={"AOT_CACHE": str(cache_dir)}))
    assert line.startswith(f"Error: cannot collect garbage: the cache at {cache_dir} is read-only")
    nested = invoke("bundle", "export", cache_dir.parent / "b.aotb", "--json", "--cache", cache_dir, cache=None)
    assert nested.exit_code == 0, nested.output
    assert len(json.loads(nested.stdout)["entries"]) == 5


def test_the_flag_after_the_subcommand_wins(invoke: Invoke, warmed, cache_dir: Path, tmp_path: Path) -> None:
    result = invoke("--cache", tmp_path / "nothing", "ls", "--cache", cache_dir, cache=None)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].startswith("5 entries, ")


def test_debug_after_the_subcommand(invoke: Invoke) -> None:
    result = invoke("compile", "nosuch.module:f", "--debug")
    assert result.exit_code == 1
    assert isinstance(result.exception, aot.TargetError)

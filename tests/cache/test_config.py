"""Command-line settings (aot.cache.config): flags > environment > [tool.aot] > defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from aot.errors import CacheError
from aot.cache.config import find_config, read_config, resolve_settings


def _write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pyproject.toml"
    path.write_text(text)
    return path


def test_the_nearest_pyproject_with_tool_aot_upwards(tmp_path: Path) -> None:
    outer = _write(tmp_path, '[tool.aot]\ncache = "c"\n')
    _write(tmp_path / "a", '[project]\nname = "a"\n')  # no [tool.aot]: skipped
    _write(tmp_path / "a" / "b", "this is [not toml")  # unreadable: skipped
    (tmp_path / "a" / "b" / "c").mkdir()
    assert find_config(tmp_path / "a" / "b" / "c") == outer
    inner = _write(tmp_path / "a" / "b" / "c", '[tool.aot]\nblobs = "s3://bucket/x"\n')
    assert find_config(tmp_path / "a" / "b" / "c") == inner


def test_paths_are_relative_to_the_file_and_urls_stay(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "p",
        '[tool.aot]\ncache = "postgresql+psycopg://u@h/db"\nblobs = "../blobs"\nmanifest = "ci/warmup.toml"\n',
    )
    assert read_config(path) == {
        "cache": "postgresql+psycopg://u@h/db",
        "blobs": str(tmp_path / "blobs"),
        "manifest": str(tmp_path / "p" / "ci" / "warmup.toml"),
    }


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('cache = 3', "[tool.aot] cache must be a non-empty string, got 3"),
        ('cache = ""', "[tool.aot] cache must be a non-empty string, got ''"),
        ('signing_key = "x"', "unknown key(s) ['signing_key'] in [tool.aot]"),
    ],
)
def test_bad_values_are_refused(tmp_path: Path, table: str, message: str) -> None:
    path = _write(tmp_path, f"[tool.aot]\n{table}\n")
    with pytest.raises(CacheError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        read_config(path)


def test_precedence(tmp_path: Path) -> None:
    config = _write(tmp_path, '[tool.aot]\ncache = "from-config"\nblobs = "config-blobs"\n')
    where = f"{config} [tool.aot]"
    settings = resolve_settings({}, {}, tmp_path)
    assert (settings.cache.value, settings.cache.source) == (str(tmp_path / "from-config"), where)
    settings = resolve_settings({}, {"AOT_CACHE": "/env"}, tmp_path)
    assert (settings.cache.value, settings.cache.source) == ("/env", "environment AOT_CACHE")
    assert settings.blobs.source == where
    settings = resolve_settings({"cache": "/flag", "blobs": "/b"}, {"AOT_CACHE": "/env"}, tmp_path)
    assert (settings.cache.value, settings.cache.source) == ("/flag", "flag --cache")
    assert (settings.blobs.value, settings.blobs.source) == ("/b", "flag --blobs")
    assert (settings.manifest.value, settings.manifest.source) == (None, "default")


def test_signing_key_sources(tmp_path: Path) -> None:
    (tmp_path / "k").write_bytes(b"file-key\n")
    _write(tmp_path, '[tool.aot]\nsigning_key_file = "k"\n')
    assert resolve_settings({}, {}, tmp_path).signing_key() == b"file-key"
    other = tmp_path / "other"
    other.write_bytes(b"other-key")
    assert resolve_settings({}, {"AOT_SIGNING_KEY_FILE": str(other)}, tmp_path).signing_key() == b"other-key"
    env = resolve_settings({}, {"AOT_SIGNING_KEY": "env-key", "AOT_SIGNING_KEY_FILE": str(other)}, tmp_path)
    assert env.signing_key() == b"env-key"
    assert env.signing_key_file.shown() == "(a key, not a file)"  # a key is never printed
    missing = resolve_settings({}, {"AOT_SIGNING_KEY_FILE": str(tmp_path / "nope")}, tmp_path)
    with pytest.raises(CacheError, match="cannot read the signing key file .*nope \\(from environment AOT_SIGNING_KEY_FILE\\)"):
        missing.signing_key()


def test_a_database_password_is_masked(tmp_path: Path) -> None:
    settings = resolve_settings({"cache": "postgresql+psycopg://me:secret@db/aot"}, {}, tmp_path)
    assert settings.cache.shown() == "postgresql+psycopg://me:***@db/aot"
    assert "secret" not in str(settings.to_dict())


# ---------------------------------------------------------------- network bounds


def test_bounds_environment_beats_config_beats_default(tmp_path: Path) -> None:
    from aot.cache.timeouts import Timeouts

    config = _write(tmp_path, "[tool.aot]\nblob_read_timeout = 2.5\nblob_retries = 2\ndb_statement_timeout = 0\n")
    where = f"{config} [tool.aot]"
    settings = resolve_settings({}, {"AOT_BLOB_RETRIES": "4"}, tmp_path)
    sources = {s.name: (s.value, s.source) for s in settings.bounds}
    assert sources == {
        "db_connect_timeout": ("5", "default"),
        "db_statement_timeout": ("0", where),
        "blob_connect_timeout": ("5", "default"),
        "blob_read_timeout": ("2.5", where),
        "blob_retries": ("4", "environment AOT_BLOB_RETRIES"),
        "stats_exit_timeout": ("5", "default"),
        "worker_stopped_timeout": ("10", "default"),
    }
    assert settings.timeouts() == Timeouts(blob_read_s=2.5, blob_retries=4, db_statement_s=0)
    assert settings.to_dict()["timeouts"]["blob_read_timeout"] == {"value": 2.5, "source": where}


def test_bounds_default_without_a_file_or_the_environment(tmp_path: Path) -> None:
    from aot.cache.timeouts import Timeouts

    settings = resolve_settings({}, {}, tmp_path)
    assert settings.config_file is None
    assert {s.source for s in settings.bounds} == {"default"} and len(settings.bounds) == 7
    assert settings.timeouts() == Timeouts()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('blob_read_timeout = "10"', 'blob_read_timeout = "10" is not a timeout: expected seconds, more than 0, '
                                     "e.g. blob_read_timeout = 10"),
        ("db_connect_timeout = 0", "db_connect_timeout = 0 is not a timeout: expected seconds, more than 0, "
                                   "e.g. db_connect_timeout = 5"),
        ("blob_retries = 2.5", "blob_retries = 2.5 is not a count: expected a whole number of attempts, 1 or "
                               "more, e.g. blob_retries = 3"),
        ("stats_exit_timeout = true", "stats_exit_timeout = true is not a timeout: expected seconds, 0 or more "
                                      "(0: drop at once), e.g. stats_exit_timeout = 5"),
    ],
)
def test_a_malformed_bound_names_the_file_the_key_the_value_and_an_example(
    tmp_path: Path, line: str, message: str
) -> None:
    path = _write(tmp_path, f"[tool.aot]\n{line}\n")
    with pytest.raises(CacheError) as info:
        resolve_settings({}, {}, tmp_path)
    assert str(info.value) == f"{path}: [tool.aot] {message}"


def test_a_malformed_bound_in_the_environment_names_the_variable(tmp_path: Path) -> None:
    _write(tmp_path, "[tool.aot]\nblob_read_timeout = 2\n")
    settings = resolve_settings({}, {"AOT_BLOB_READ_TIMEOUT": "soon"}, tmp_path)
    with pytest.raises(CacheError, match=r"^AOT_BLOB_READ_TIMEOUT='soon' is not a timeout: expected seconds"):
        settings.timeouts()

"""Reading never creates (issue 38, item 5): the commands that only read open an
existing cache, and a mistyped path, an empty database or a foreign one is an error
saying what was found; nothing is created, nothing migrated."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.cli.helpers import one_line_error

READ_COMMANDS = [
    ("ls",), ("verify",), ("gc", "--dry-run"), ("release", "ls"), ("history", "mlp.forward"),
    ("doctor", "--no-verify"), ("show", "mlp.forward"), ("stats",),
]


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
def test_a_mistyped_sqlite_url_creates_nothing(invoke, tmp_path: Path, command) -> None:
    url = f"sqlite:///{tmp_path}/typo/index.sqlite"
    result = invoke(*command, cache=url)
    assert result.exit_code != 0, result.output
    assert "no jax-aot cache index" in result.output
    assert "typo" in result.output
    assert _files(tmp_path) == []


@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
def test_a_foreign_index_file_is_named_and_left_as_it_was(invoke, tmp_path: Path, command) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    with sqlite3.connect(folder / "index.sqlite") as conn:
        conn.execute("CREATE TABLE users (id INTEGER)")
    result = invoke(*command, cache=folder)
    assert result.exit_code != 0, result.output
    assert "not a jax-aot cache index" in result.output and "users" in result.output
    if command[0] != "doctor":  # doctor reports on several lines; the others one
        one_line_error(result)
    with sqlite3.connect(folder / "index.sqlite") as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert tables == ["users"]
    assert _files(folder) == ["index.sqlite"]


@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
def test_an_empty_postgres_database_stays_empty(invoke, postgres_url: str, command) -> None:
    result = invoke(*command, cache=postgres_url)
    assert result.exit_code != 0, result.output
    assert "is empty (no tables)" in result.output
    engine = sa.create_engine(postgres_url)
    try:
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_a_foreign_postgres_database_is_named(invoke, postgres_url: str) -> None:
    engine = sa.create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE orders (id integer)")
        result = invoke("ls", cache=postgres_url)
        assert result.exit_code != 0
        assert "not a jax-aot cache index" in one_line_error(result) and "orders" in result.output
        assert sa.inspect(engine).get_table_names() == ["orders"]
    finally:
        engine.dispose()


def test_an_older_schema_is_not_migrated_by_a_read(invoke, tmp_path: Path) -> None:
    import aot
    from aot.cache.index.schema import OutdatedSchemaError

    folder = tmp_path / "cache"
    aot.Cache(folder).close()  # a cache of this schema...
    with sqlite3.connect(folder / "index.sqlite") as conn:  # ...recorded as an older one
        conn.execute("UPDATE schema_version SET version = version - 1")
    with pytest.raises(OutdatedSchemaError, match="does not migrate"):
        aot.Cache(folder, create=False)
    with sqlite3.connect(folder / "index.sqlite") as conn:
        (version,) = conn.execute("SELECT version FROM schema_version").fetchone()
    from aot.cache.index.entry import SCHEMA_VERSION

    assert version == SCHEMA_VERSION - 1


def test_compile_and_warmup_still_create(invoke, tmp_path: Path) -> None:
    import aot

    folder = tmp_path / "new"
    aot.Cache(folder).close()
    assert (folder / "index.sqlite").is_file()

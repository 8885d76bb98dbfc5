"""The created schema is the one schema 7 always created (the schema is SQLAlchemy Core).

``schema_ddl_v7.json`` was written from a database created by the ORM-declared schema
(commit e38ac51, before it became ``sa.Table`` definitions): SQLite's own DDL text
(``sqlite_master``) and PostgreSQL's catalogue as ``sa.inspect`` reads it, for a fresh
index and for one migrated from schema 1. A later migration may add tables and indexes;
every table, column, constraint and index of the file must stay exactly as it is, but
for the ``artifacts`` table, to which schema 10 added ``manifest_digest`` and schema 12
``const_digest`` (and their indexes): ``schema_ddl_v12.json`` (written at schema 10 by this
code, in the same way, with schema 12's column and index added) pins it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aot.cache.index import schema as index_schema
from aot.cache.index.entry import SCHEMA_VERSION
from aot.cache.index.sql import Index

GOLDEN = Path(__file__).with_name("schema_ddl_v7.json")
GOLDEN_V12 = Path(__file__).with_name("schema_ddl_v12.json")
T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def describe(url: str) -> dict[str, Any]:
    """The schema of the database at ``url``: per table, what a migration must keep."""
    engine = sa.create_engine(url)
    try:
        if engine.dialect.name == "sqlite":
            with engine.connect() as conn:
                rows = conn.exec_driver_sql(
                    "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
                ).all()
            tables: dict[str, Any] = {}
            for kind, name, table, sql in rows:
                entry = tables.setdefault(table, {"table": None, "indexes": {}})
                if kind == "table":
                    entry["table"] = sql
                else:
                    entry["indexes"][name] = sql
            return tables
        inspector = sa.inspect(engine)
        out: dict[str, Any] = {}
        for table in inspector.get_table_names():
            out[table] = {
                "table": {
                    "columns": [
                        [c["name"], str(c["type"]), c["nullable"], c.get("default"), c.get("autoincrement")]
                        for c in inspector.get_columns(table)
                    ],
                    "pk": inspector.get_pk_constraint(table),
                    "fks": sorted(json.dumps(fk, sort_keys=True) for fk in inspector.get_foreign_keys(table)),
                    "checks": sorted(json.dumps(c, sort_keys=True) for c in inspector.get_check_constraints(table)),
                    "uniques": sorted(json.dumps(u, sort_keys=True) for u in inspector.get_unique_constraints(table)),
                },
                "indexes": {
                    ix["name"]: [ix["column_names"], bool(ix["unique"])] for ix in inspector.get_indexes(table)
                },
            }
        return out
    finally:
        engine.dispose()


def migrated_from_schema_1(url: str) -> None:
    """A database as schema version 1 created it (``exe_digest`` NOT NULL), then opened."""
    metadata = sa.MetaData()
    for table in index_schema.METADATA.sorted_tables:
        if table.name in ("programs", "artifacts", "blobs", "blobs_data", "schema_version"):
            table.to_metadata(metadata)
    metadata.tables["artifacts"].c.exe_digest.nullable = False
    for table in ("artifacts", "programs"):
        for index in list(metadata.tables[table].indexes):
            if index.name in ("ix_artifacts_exe_digest", "ix_artifacts_hlo_digest", "ix_programs_hlo_digest"):
                metadata.tables[table].indexes.discard(index)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        metadata.create_all(conn)
        conn.execute(sa.insert(metadata.tables["schema_version"]).values(id=1, version=1, updated_at=T0))
    engine.dispose()
    Index(url).close()


def _dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def _constraints_in_any_order(ddl: Any) -> Any:
    """SQLite's DDL text of a table with its column and constraint clauses sorted.

    Migration 2 rebuilds ``artifacts`` from ``Table.to_metadata``, which copies the
    constraints in the order of a set: the clauses' order of the rebuilt table's DDL
    varies from process to process (it did with the ORM too), their text does not.
    """
    if not isinstance(ddl, str):
        return ddl
    head, _, body = ddl.partition("(\n\t")
    return head, sorted(body.removesuffix("\n)").split(", \n\t"))


def _assert_keeps(found: dict[str, Any], golden: dict[str, Any], *, any_order: bool = False) -> None:
    same = _constraints_in_any_order if any_order else (lambda ddl: ddl)
    for table, expected in golden.items():
        assert table in found, f"table {table} is missing"
        assert same(found[table]["table"]) == same(expected["table"]), f"table {table} differs"
        for name, index in expected["indexes"].items():
            assert found[table]["indexes"].get(name) == index, f"index {name} of {table} differs"


@pytest.mark.parametrize("how", ["fresh", "migrated_from_1"])
def test_the_created_schema_is_schema_7_as_the_orm_created_it(index_url: str, how: str) -> None:
    if how == "fresh":
        Index(index_url).close()
    else:
        migrated_from_schema_1(index_url)
    golden = json.loads(GOLDEN.read_text())[_dialect(index_url)][how]
    found = describe(index_url)
    _assert_keeps(found, {t: v for t, v in golden.items() if t != "artifacts"}, any_order=how != "fresh")
    for name, index in golden["artifacts"]["indexes"].items():  # schemas 10 and 11 added one each
        assert found["artifacts"]["indexes"].get(name) == index, f"index {name} of artifacts differs"
    _assert_keeps(found, json.loads(GOLDEN_V12.read_text())[_dialect(index_url)][how], any_order=how != "fresh")


def test_schema_10_backfills_the_manifest_digest_of_older_rows(index_url: str) -> None:
    """An index of schema 8 (no ``manifest_digest``) gets the column, and each row the
    sha256 of its manifest text: gc keeps the blob the next store writes."""
    import hashlib

    Index(index_url).close()
    engine = sa.create_engine(index_url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP INDEX ix_artifacts_manifest_digest"))
        conn.execute(sa.text("ALTER TABLE artifacts DROP COLUMN manifest_digest"))
        conn.execute(sa.text(
            "INSERT INTO programs (program_fp, name, signature, hlo_digest, created_at) VALUES ('p', 'f', 's', NULL, :t)"
        ), {"t": T0})
        for i in range(3):
            conn.execute(sa.text(
                "INSERT INTO artifacts (key, name, program_fp, env_fp, signature, platform, manifest, exe_digest, "
                "hlo_digest, raw_size, stored_size, compile_seconds, created_at, last_used_at, hits, state) "
                "VALUES (:k, 'f', 'p', 'e', 's', 'cpu', :m, NULL, NULL, 1, 1, 0.5, :t, :t, 0, 'ok')"
            ), {"k": f"k{i}", "m": f'{{"manifest": {i}}}', "t": T0})
        conn.execute(sa.text("UPDATE schema_version SET version = 8"))
    engine.dispose()
    Index(index_url).close()  # migrates
    engine = sa.create_engine(index_url)
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.text("SELECT key, manifest_digest FROM artifacts")).all())
        version = conn.execute(sa.text("SELECT version FROM schema_version")).scalar_one()
    engine.dispose()
    assert version == SCHEMA_VERSION
    assert rows == {f"k{i}": hashlib.sha256(f'{{"manifest": {i}}}'.encode()).hexdigest() for i in range(3)}


def test_schema_11_adds_the_constants_digest_to_older_rows(index_url: str) -> None:
    """An index of schema 11 (no ``const_digest``) gets the column and its index; its
    rows keep NULL there (no entry written before it has hoisted constants)."""
    Index(index_url).close()
    engine = sa.create_engine(index_url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP INDEX ix_artifacts_const_digest"))
        conn.execute(sa.text("ALTER TABLE artifacts DROP COLUMN const_digest"))
        conn.execute(sa.text(
            "INSERT INTO programs (program_fp, name, signature, hlo_digest, created_at) VALUES ('p', 'f', 's', NULL, :t)"
        ), {"t": T0})
        conn.execute(sa.text(
            "INSERT INTO artifacts (key, name, program_fp, env_fp, signature, platform, manifest, exe_digest, "
            "hlo_digest, raw_size, stored_size, compile_seconds, created_at, last_used_at, hits, state) "
            "VALUES ('k', 'f', 'p', 'e', 's', 'cpu', '{}', 'x', NULL, 1, 1, 0.5, :t, :t, 0, 'ok')"
        ), {"t": T0})
        conn.execute(sa.text("UPDATE schema_version SET version = 11"))
    engine.dispose()
    Index(index_url).close()  # migrates
    engine = sa.create_engine(index_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT key, const_digest FROM artifacts")).all()
        version = conn.execute(sa.text("SELECT version FROM schema_version")).scalar_one()
    engine.dispose()
    assert version == SCHEMA_VERSION == 12
    assert [tuple(r) for r in rows] == [("k", None)]
    assert "ix_artifacts_const_digest" in describe(index_url)["artifacts"]["indexes"]


def test_opening_and_writing_an_index_imports_no_orm(tmp_path: Path) -> None:
    """The SQL index and the database blob store are SQLAlchemy Core: ``sqlalchemy.orm``
    (about 0.1 s of CPU per process) is no part of a warm-up's or a server's imports."""
    code = (
        "import sys\n"
        "from aot.cache.index.sql import Index\n"
        "import aot.cache.storage.database, aot.cache.stats_recorder\n"
        f"Index('sqlite:///{tmp_path / 'index.sqlite'}').close()\n"
        "print(sorted(m for m in sys.modules if m.startswith('sqlalchemy.orm')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout

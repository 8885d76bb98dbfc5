"""Reading what a damaged SQLite file still holds, row by row (``aot repair``'s reads)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from aot.cache.index.salvage import damage_of, salvage, write_index


def _database(path: Path, rows: int) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE refs (key TEXT PRIMARY KEY, name TEXT, padding TEXT)")
    conn.executemany("INSERT INTO refs VALUES (?, ?, ?)",
                     [(f"k{i:04d}", f"n{i}", "x" * 300) for i in range(rows)])
    conn.commit()
    conn.close()


def _leaves(path: Path) -> tuple[int, list[int]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = [p for (p,) in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = 'refs' AND pagetype = 'leaf' ORDER BY pageno")]
    finally:
        conn.close()
    return size, pages


def test_rows_past_an_unreadable_page_are_read_and_the_lost_ones_named(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    _database(path, 200)
    size, leaves = _leaves(path)
    assert len(leaves) > 5
    with open(path, "r+b") as f:  # a leaf in the middle: rows before and after it survive
        f.seek((leaves[len(leaves) // 2] - 1) * size)
        f.write(b"\xa5" * size)
    assert damage_of(path) is not None and damage_of(path).startswith("corrupt (")
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    unreadable = []
    for i in range(200):
        try:
            conn.execute("SELECT padding FROM refs WHERE key = ?", (f"k{i:04d}",)).fetchall()
        except sqlite3.DatabaseError:
            unreadable.append(f"k{i:04d}")
    conn.close()
    assert 0 < len(unreadable) < 50

    version, tables, error = salvage(path, ["refs"])
    assert error is None and version is None  # no schema_version table here
    (refs,) = tables
    assert refs.error == "database disk image is malformed"
    assert sorted(r[0] for r in refs.rows) == sorted({f"k{i:04d}" for i in range(200)} - set(unreadable))
    assert sorted(lost["key"] for lost in refs.lost) == unreadable  # named by the key's index

    copy = tmp_path / "new.sqlite"
    _database(copy, 0)
    assert write_index(copy, [(refs.name, refs.columns, refs.rows)]) == {"refs": 200 - len(unreadable)}
    assert damage_of(copy) is None


def test_damage_is_named_from_sqlite_alone(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    _database(path, 50)
    assert damage_of(path) is None
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1000)
    assert damage_of(path).startswith("truncated (")
    path.write_bytes(b"not a database" * 512)
    assert damage_of(path) == "corrupt (file is not a database)"
    path.write_bytes(b"")
    assert damage_of(path) == "empty (0 bytes)"


def test_a_table_added_to_the_schema_is_salvaged_and_written_by_repair(tmp_path: Path) -> None:
    """The tables salvaged are the schema's (not a list typed out beside it): a table a
    later schema adds is carried over by `aot repair` with no change to the repair code,
    and so is every table of today's schema but those named as not salvaged."""
    import sqlalchemy as sa
    from sqlalchemy.engine import URL

    from aot.cache.admin.repair import plan_repair, repair_index
    from aot.cache.index.schema import METADATA, NOT_SALVAGED, salvaged_tables
    from aot.cache.index.sql import Index

    assert set(salvaged_tables()) == {t.name for t in METADATA.sorted_tables} - NOT_SALVAGED
    assert "captured_targets" in salvaged_tables()
    added = sa.Table("later_table", METADATA, sa.Column("id", sa.Integer, primary_key=True),
                     sa.Column("note", sa.Text, nullable=False))
    try:
        folder = tmp_path / "cache"
        folder.mkdir()
        (folder / "blobs").mkdir()
        path = folder / "index.sqlite"
        Index(URL.create("sqlite", database=str(path))).close()
        conn = sqlite3.connect(path)
        conn.executemany("INSERT INTO later_table VALUES (?, ?)", [(1, "kept"), (2, "also kept")])
        conn.commit()
        conn.close()
        with open(path, "ab") as f:  # a torn write at the end: damaged, every page readable
            f.write(b"\0" * 100)
        assert "later_table" in salvaged_tables()
        plan = plan_repair(folder)
        assert dict(plan.kept)["later_table"] == 2
        repair_index(plan)
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT id, note FROM later_table ORDER BY id").fetchall() == [(1, "kept"), (2, "also kept")]
        conn.close()
    finally:
        METADATA.remove(added)
    assert "later_table" not in salvaged_tables()

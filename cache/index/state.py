"""Whether the index was emptied by its own deletions (gc's evictions, ``aot rm``).

gc refuses to collect blobs when the index is empty but blobs remain: the index was
lost, truncated or replaced, and every blob would otherwise go. An index that gc itself
emptied (or emptied while losing a race to another gc) must not be taken for a lost
one, so a deletion that leaves the index empty marks it in the same transaction, and
the next row added clears the mark.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from aot.cache.index.engine import insert_ignore, server_now
from aot.cache.index.schema import ARTIFACTS, INDEX_STATE, JIT_ENTRIES, PROGRAMS

__all__ = ["clear_emptied", "emptiness_query", "has_no_rows", "mark_emptied"]


def has_no_rows(conn: Connection) -> bool:
    """No artifact, program or jit entry row, as this transaction sees it."""
    return all(
        conn.execute(sa.select(sa.literal(1)).select_from(t).limit(1)).first() is None
        for t in (ARTIFACTS, PROGRAMS, JIT_ENTRIES)
    )


def mark_emptied(conn: Connection) -> None:
    """Records, in the deleting transaction, that this deletion emptied the index."""
    now = server_now(conn)
    upsert = insert_ignore(conn, INDEX_STATE).values(id=1, emptied_at=now)
    conn.execute(upsert.on_conflict_do_update(index_elements=[INDEX_STATE.c.id], set_={"emptied_at": now}))


def clear_emptied(conn: Connection) -> None:
    """A row was added: an empty index from now on would not be one we emptied."""
    conn.execute(
        sa.update(INDEX_STATE)
        .where(INDEX_STATE.c.id == 1, INDEX_STATE.c.emptied_at.is_not(None))
        .values(emptied_at=None)
    )


def emptiness_query() -> sa.Select:
    """One statement, so that both answers come from one snapshot while writers and gc
    run: ``empty`` (no artifact, program or jit entry row) and ``emptied_at`` (the mark)."""
    empty = sa.and_(
        ~sa.select(sa.literal(1)).select_from(ARTIFACTS).exists(),
        ~sa.select(sa.literal(1)).select_from(PROGRAMS).exists(),
        ~sa.select(sa.literal(1)).select_from(JIT_ENTRIES).exists(),
    )
    marked = sa.select(INDEX_STATE.c.emptied_at).where(INDEX_STATE.c.id == 1).scalar_subquery()
    return sa.select(empty.label("empty"), marked.label("emptied_at"))

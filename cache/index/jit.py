"""The index's rows of KIND ``jit``: entries of JAX's persistent compilation cache
stored through jax-aot (:mod:`aot.cache.jax_cache`), as a part of
:class:`~aot.cache.index.sql.Index`.

They live in their own table (``jit_entries``, schema 7) beside the ``aot``
artifacts: a jit entry has JAX's key, no manifest, no portable HLO, no signature of
arguments and no ref, so the served-identity machinery (refs, releases, statics,
``aot.load``) never sees one, while gc (its blob is referenced), verify (its digest),
``aot ls`` (KIND ``jit``), ``aot rm`` and push/pull do.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from aot.cache.index.engine import IndexEngine, insert_ignore, server_now
from aot.cache.index.jit_records import AOT, JIT, JitEntry, JitStats, function_name, sign_entry, signature_problem
from aot.cache.index.leases import Lease, LeaseLostError
from aot.cache.index.schema import BLOBS, JIT_CLAIMS, JIT_ENTRIES, JIT_STATS, LEASES
from aot.cache.index.state import clear_emptied, has_no_rows, mark_emptied
from aot.errors import CacheError

logger = logging.getLogger(__name__)

__all__ = ["JIT", "AOT", "IndexJit", "JitEntry", "JitStats", "function_name", "sign_entry", "signature_problem"]

def _entry(row: sa.Row[Any]) -> JitEntry:
    return JitEntry(**row._mapping)


class IndexJit(IndexEngine):
    """Reads and writes of ``jit_entries`` and ``jit_stats``."""

    def jit_get(self, key: str) -> JitEntry | None:
        with self._read(f"look up jit entry {key[:40]}") as conn:
            row = conn.execute(sa.select(JIT_ENTRIES).where(JIT_ENTRIES.c.key == key)).first()
        return _entry(row) if row is not None else None

    def jit_entries(self, name_glob: str | None = None) -> list[JitEntry]:
        """Every jit entry, or those whose function name matches ``name_glob``."""
        with self._read("list jit entries") as conn:
            rows = conn.execute(sa.select(JIT_ENTRIES).order_by(JIT_ENTRIES.c.name, JIT_ENTRIES.c.key)).all()
        entries = [_entry(r) for r in rows]
        if name_glob is None:
            return entries
        return [e for e in entries if fnmatch.fnmatchcase(e.name, name_glob) or e.key.startswith(name_glob)]

    def jit_add(self, entry: JitEntry, *, lease: Lease | None = None) -> None:
        """Records ``entry`` (its blob durable already), replacing a row of its key (a
        repair); releases ``lease`` in the same transaction (gc protocol)."""
        row = {f: getattr(entry, f) for f in JitEntry.__slots__}
        with self._write(f"add jit entry {entry.key[:40]}") as conn:
            if lease is not None and lease.digests:
                kept = set(
                    conn.execute(sa.delete(LEASES).where(LEASES.c.token == lease.token).returning(LEASES.c.digest)).scalars()
                )
                if kept != lease.digests:
                    raise LeaseLostError(f"the lease on the blob of jit entry {entry.key[:40]} expired; store it again")
            now = server_now(conn)
            row["created_at"] = row["last_used_at"] = now
            conn.execute(
                insert_ignore(conn, BLOBS).on_conflict_do_nothing(),
                [{"digest": entry.digest, "size": entry.size, "stored_size": entry.stored_size, "created_at": now}],
            )
            conn.execute(sa.delete(JIT_ENTRIES).where(JIT_ENTRIES.c.key == entry.key))
            conn.execute(sa.insert(JIT_ENTRIES).values(**row))
            clear_emptied(conn)

    def jit_delete(self, keys: Iterable[str]) -> int:
        """Deletes the rows of ``keys`` (their blobs are gc's); the number deleted."""
        wanted = sorted(set(keys))
        if not wanted:
            return 0
        with self._write("delete jit entries") as conn:
            deleted = len(conn.execute(sa.delete(JIT_ENTRIES).where(JIT_ENTRIES.c.key.in_(wanted)).returning(JIT_ENTRIES.c.key)).all())
            if deleted and has_no_rows(conn):  # gc must not take this for a lost index
                mark_emptied(conn)
            return deleted

    def jit_delete_unchanged(self, planned: Mapping[str, datetime]) -> list[str]:
        """gc's eviction of jit rows: deletes each row whose last use is still the
        planned one (key -> last_used_at); a row hit or stored again since the plan is
        kept. The keys deleted (their blobs are gc's)."""
        keys = sorted(planned)
        if not keys:
            return []
        deleted: list[str] = []
        with self._write("evict jit entries") as conn:
            for key in keys:
                if conn.execute(
                    sa.delete(JIT_ENTRIES).where(JIT_ENTRIES.c.key == key, JIT_ENTRIES.c.last_used_at == planned[key])
                ).rowcount:
                    deleted.append(key)
            if deleted and has_no_rows(conn):  # gc must not take this for a lost index
                mark_emptied(conn)
        return deleted

    def jit_touch(self, key: str, *, when: datetime) -> None:
        """Sets the last use of ``key``'s row to ``when`` (as :meth:`touch` does for
        an aot entry's; tests and imports of old entries)."""
        with self._write(f"touch jit entry {key[:40]}") as conn:
            conn.execute(sa.update(JIT_ENTRIES).where(JIT_ENTRIES.c.key == key).values(last_used_at=when))

    def jit_record(self, name: str, *, key: str | None = None, hit: bool, saved_seconds: float = 0.0) -> None:
        """Counts a hit (``key``'s row is touched too) or a miss of ``name``. Never
        raises: statistics must not fail a compile."""
        if self.read_only:
            return
        try:
            with self._write("record a jit cache use") as conn:
                now = server_now(conn)
                if hit and key is not None:
                    conn.execute(
                        sa.update(JIT_ENTRIES).where(JIT_ENTRIES.c.key == key)
                        .values(last_used_at=now, hits=JIT_ENTRIES.c.hits + 1)
                    )
                added = {"hits": int(hit), "misses": int(not hit), "saved_seconds": float(saved_seconds)}
                stmt = insert_ignore(conn, JIT_STATS).values(name=name, updated_at=now, **added)
                conn.execute(
                    stmt.on_conflict_do_update(
                        index_elements=[JIT_STATS.c.name],
                        set_={
                            "hits": JIT_STATS.c.hits + added["hits"],
                            "misses": JIT_STATS.c.misses + added["misses"],
                            "saved_seconds": JIT_STATS.c.saved_seconds + added["saved_seconds"],
                            "updated_at": now,
                        },
                    )
                )
        except CacheError as e:
            logger.warning("index: could not record a use of jit entry %s: %s", name, e)

    def jit_stats(self, name_glob: str | None = None) -> list[JitStats]:
        with self._read("read jit statistics") as conn:
            rows = conn.execute(sa.select(JIT_STATS).order_by(JIT_STATS.c.name)).all()
        stats = [JitStats(r.name, int(r.hits), int(r.misses), float(r.saved_seconds)) for r in rows]
        return [s for s in stats if name_glob is None or fnmatch.fnmatchcase(s.name, name_glob)]

    # -- compile once per fleet -------------------------------------------------------

    def jit_claim(self, key: str, holder: str, seconds: float) -> str | None:
        """Claims the compile of ``key`` for ``holder`` for ``seconds`` (the database
        server's clock). None: claimed (no claim, or an expired one, was there); else
        the live holder's name (wait for its entry). One statement per attempt."""
        with self._write(f"claim the compile of {key[:40]}") as conn:
            now = server_now(conn)
            expires = now + timedelta(seconds=seconds)
            conn.execute(sa.delete(JIT_CLAIMS).where(JIT_CLAIMS.c.key == key, JIT_CLAIMS.c.expires_at <= now))
            inserted = conn.execute(
                insert_ignore(conn, JIT_CLAIMS)
                .values(key=key, holder=holder, expires_at=expires)
                .on_conflict_do_nothing()
                .returning(JIT_CLAIMS.c.key)
            ).scalar_one_or_none()
            if inserted is not None:
                return None
            other = conn.execute(sa.select(JIT_CLAIMS.c.holder).where(JIT_CLAIMS.c.key == key)).scalar_one_or_none()
            return other if other is not None else holder

    def jit_claim_holder(self, key: str) -> str | None:
        """The live holder of ``key``'s claim (None: none, or expired)."""
        with self._read(f"read the claim of {key[:40]}") as conn:
            now = server_now(conn)
            return conn.execute(
                sa.select(JIT_CLAIMS.c.holder).where(JIT_CLAIMS.c.key == key, JIT_CLAIMS.c.expires_at > now)
            ).scalar_one_or_none()

    def jit_unclaim(self, keys: Iterable[str], holder: str) -> None:
        """Gives up ``holder``'s claims on ``keys``. Never raises (a claim left behind
        expires)."""
        wanted = sorted(set(keys))
        if not wanted or self.read_only:
            return
        try:
            with self._write("release compile claims") as conn:
                conn.execute(sa.delete(JIT_CLAIMS).where(JIT_CLAIMS.c.key.in_(wanted), JIT_CLAIMS.c.holder == holder))
        except CacheError as e:
            logger.warning("index: could not release compile claims: %s", e)

    def jit_claim_extend(self, keys: Iterable[str], holder: str, seconds: float) -> set[str]:
        """Extends ``holder``'s live claims on ``keys`` to ``seconds`` from now (the
        database server's clock): the keys still held (a claim that expired, or was
        taken over, is not). Never raises (the holder's compile goes on regardless)."""
        wanted = sorted(set(keys))
        if not wanted or self.read_only:
            return set()
        try:
            with self._write("extend compile claims") as conn:
                now = server_now(conn)
                return set(
                    conn.execute(
                        sa.update(JIT_CLAIMS)
                        .where(JIT_CLAIMS.c.key.in_(wanted), JIT_CLAIMS.c.holder == holder, JIT_CLAIMS.c.expires_at > now)
                        .values(expires_at=now + timedelta(seconds=seconds))
                        .returning(JIT_CLAIMS.c.key)
                    ).scalars()
                )
        except CacheError as e:
            logger.warning("index: could not extend compile claims: %s", e)
            return set()


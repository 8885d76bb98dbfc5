"""Refs, releases and the cache's description in the SQL index (:class:`IndexRefs`).

The order of ref changes and of release sets is the index's own: autoincremented ids
handed out in commit order. Two writers setting one ref at once both append to the
history; the ref keeps the higher ``seq`` whichever commits last, so the history and
the ref never disagree. Times are the index's clock and only displayed.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from aot.cache.index.engine import insert_ignore, server_now
from aot.cache.index.journal import RELEASE, IndexJournal
from aot.cache.index.globs import glob_to_like
from aot.cache.index.refs import Ref, RefOrigin, ReleaseMember, pin_reasons, signature_digest
from aot.cache.index.releases import (
    CacheDescription, Release, ReleaseRemoval, RemovedRelease, credit_source, label_hint, promote_source,
    rollback_source,
)
from aot.cache.pauses import reached
from aot.cache.index.schema import ARTIFACTS, CACHE_META, REF_HISTORY, REFS, RELEASE_MEMBERS, RELEASES
from aot.errors import CacheError

logger = logging.getLogger(__name__)

__all__ = ["IndexDescription", "IndexRefs", "RefTarget"]

#: (name, signature, env_fp, key): what a ref update names.
RefTarget = tuple[str, str, str, str]

#: The PostgreSQL advisory lock that serializes ref writers and label moves
#: (:meth:`IndexRefs.set_refs`, :meth:`IndexRefs.declare_release`, promote, rollback, rm).
_PG_REFS_LOCK_KEY = 0x616F7472  # "aotr"

_REF_COLUMNS = ("name", "signature", "env_fp", "key", "seq", "set_at", "host", "user", "source", "release", "commit")


def _ref(row: Any) -> Ref:
    m = row._mapping
    return Ref(**{c: m[c] for c in _REF_COLUMNS})


class IndexDescription(IndexJournal):
    """What a shared cache records about itself (apart from the refs: one class stays
    under the size every class keeps)."""

    def description(self) -> CacheDescription | None:
        """What the cache recorded about itself when created (None: nothing yet)."""
        with self._read("read the cache's description") as conn:
            row = conn.execute(sa.select(CACHE_META).where(CACHE_META.c.id == 1)).first()
        if row is None:
            return None
        m = row._mapping
        return CacheDescription(m["blob_location"], m["compression"], int(m["format_version"]), m["created_at"])

    def describe(self, blob_location: str | None, compression: str, format_version: int) -> CacheDescription:
        """Records the description unless one exists; returns the one recorded."""
        with self._write("record the cache's description") as conn:
            conn.execute(insert_ignore(conn, CACHE_META).values(
                id=1, blob_location=blob_location, compression=compression, format_version=format_version,
                created_at=server_now(conn),
            ).on_conflict_do_nothing())
        found = self.description()
        assert found is not None
        return found


class IndexRefs(IndexDescription):
    """Which key is served, per (name, signature, environment), and release labels."""

    # ------------------------------------------------------------------ refs

    def set_refs(
        self, targets: Iterable[RefTarget], origin: RefOrigin, *, release_id: int | None = None,
        keep_existing: bool = False,
    ) -> list[Ref]:
        """Points each (name, signature, environment) at its key, in one transaction, and
        adds them to the release set ``release_id`` when given. A ref that already names
        its key is left as it is (no history record); with ``keep_existing`` so is any
        ref that exists (a copy fills only the slots without one). Returns the refs changed.
        A labelled declaration uses :meth:`declare_release` (the set and its members in
        one transaction)."""
        with self._write("set refs") as conn:
            self._lock_refs(conn)
            changed = self._set_refs_in(conn, targets, origin, release_id=release_id, keep_existing=keep_existing)
            if release_id is not None:
                self.forget_journal(conn, RELEASE, [release_id])
        _log_refs(changed, origin)
        if release_id is not None:
            self.journal_pending()
        return changed

    def declare_release(
        self, label: str, targets: Iterable[RefTarget], origin: RefOrigin, *, run: str | None = None,
        set_refs: bool = True, keep: Callable[[ReleaseMember], bool] | None = None,
        carried: list[ReleaseMember] | None = None,
    ) -> tuple[int, list[Ref]]:
        """Records ``targets`` as a set of ``label`` and points their refs at them (unless
        ``set_refs`` is false), in one transaction under the lock of every label move:
        a writer that fails or is killed leaves the label on its previous set, with its
        members. The set is new (its ``previous`` the label's current one) unless ``run``
        is given and the current set was opened by the same run (the shards of one CI
        job add to one set). ``keep``: the members of the current set carried into a
        new one (the local tier replaces one name's members; a warm-up of another run
        keeps those it does not compile); they are appended to ``carried`` when given.
        Returns (set id, refs changed)."""
        check_label(label)
        with self._write(f"declare release {label}") as conn:
            self._lock_refs(conn)
            current = self._current_set(conn, label)
            if run is not None and current is not None and current["run"] == run:
                set_id = int(current["id"])
                targets = list(targets)
                _credit(conn, current, targets, origin)
                self.forget_journal(conn, RELEASE, [set_id])
            else:
                set_id = self._new_set(conn, label, origin, previous=None if current is None else current["id"],
                                       run=run)
                if keep is not None and current is not None:
                    for member in self._members(conn, int(current["id"])):
                        if keep(member):
                            self._add_member(conn, set_id, member)
                            if carried is not None:
                                carried.append(member)
            if set_refs:
                changed = self._set_refs_in(conn, targets, origin, release_id=set_id)
            else:
                changed = []
                for name, signature, env_fp, key in targets:
                    self._add_member(conn, set_id, ReleaseMember(name, signature, env_fp, key))
        _log_refs(changed, origin)
        self.journal_pending()
        return set_id, changed

    def _lock_refs(self, conn: Connection) -> None:
        """One ref or label writer at a time (SQLite: BEGIN IMMEDIATE already), before
        any seq is taken or any current ref or set read: each writer's refs land whole
        and in commit order, a slot filled meanwhile is seen, and label moves (declare,
        promote, rollback, rm) run in one of their serial orders."""
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_REFS_LOCK_KEY})

    def _set_refs_in(
        self, conn: Connection, targets: Iterable[RefTarget], origin: RefOrigin, *, release_id: int | None,
        keep_existing: bool = False,
    ) -> list[Ref]:
        # One order for every writer (stable: of one slot, the last target wins), so
        # that concurrent transactions lock the rows of the same slots in the same
        # order and cannot deadlock on PostgreSQL.
        targets = sorted(dict.fromkeys(targets), key=lambda t: (t[2], t[0], signature_digest(t[1])))
        changed: list[Ref] = []
        now = server_now(conn)
        for name, signature, env_fp, key in targets:
            digest = signature_digest(signature)
            current = conn.execute(
                sa.select(REFS.c.key).where(
                    REFS.c.env_fp == env_fp, REFS.c.name == name, REFS.c.signature_digest == digest
                )
            ).scalar_one_or_none()
            if current != key and not (keep_existing and current is not None):
                changed.append(_append_ref(conn, name, signature, env_fp, key, origin, now))
            if release_id is not None:
                self._add_member(conn, release_id, ReleaseMember(name, signature, env_fp, key))
        return changed

    def refs_named(self, name: str, env_fp: str | None = None) -> list[Ref]:
        """The current refs of ``name`` (of one environment), by signature."""
        q = sa.select(*(REFS.c[c] for c in _REF_COLUMNS)).where(REFS.c.name == name)
        if env_fp is not None:
            q = q.where(REFS.c.env_fp == env_fp)
        with self._read(f"read the refs of {name}") as conn:
            return [_ref(r) for r in conn.execute(q.order_by(REFS.c.signature, REFS.c.env_fp)).all()]

    def refs(self, name_glob: str | None = None) -> list[Ref]:
        """Every current ref, or those whose name matches an fnmatch glob."""
        q = sa.select(*(REFS.c[c] for c in _REF_COLUMNS))
        if name_glob not in (None, "*"):
            q = q.where(REFS.c.name.like(glob_to_like(name_glob), escape="\\"))
        with self._read("read refs") as conn:
            out = [_ref(r) for r in conn.execute(q.order_by(REFS.c.name, REFS.c.signature)).all()]
        if name_glob not in (None, "*"):
            out = [r for r in out if fnmatch.fnmatchcase(r.name, name_glob)]
        return out

    def ref_history(self, name: str, *, signature: str | None = None, env_fp: str | None = None,
                    limit: int | None = None) -> list[Ref]:
        """Every change of the refs of ``name``, newest first."""
        q = sa.select(*(REF_HISTORY.c[c] for c in _REF_COLUMNS)).where(REF_HISTORY.c.name == name)
        if signature is not None:
            q = q.where(REF_HISTORY.c.signature_digest == signature_digest(signature))
        if env_fp is not None:
            q = q.where(REF_HISTORY.c.env_fp == env_fp)
        q = q.order_by(REF_HISTORY.c.seq.desc())
        if limit is not None:
            q = q.limit(limit)
        with self._read(f"read the history of {name}") as conn:
            return [_ref(r) for r in conn.execute(q).all()]

    def drop_refs(self, slots: Iterable[tuple[str, str, str]]) -> int:
        """Removes the current refs of (name, signature, env_fp) slots (their history
        stays); returns how many existed. What they named becomes collectable."""
        n = 0
        with self._write("drop refs") as conn:
            for name, signature, env_fp in set(slots):
                n += conn.execute(sa.delete(REFS).where(
                    REFS.c.env_fp == env_fp, REFS.c.name == name,
                    REFS.c.signature_digest == signature_digest(signature),
                )).rowcount
        return n

    def retire_environments(self, env_fps: Iterable[str]) -> tuple[int, int]:
        """Drops the current refs of the environments ``env_fps`` and their members of
        every release set (a retired JAX release's: no host serves them any more), in one
        transaction under the lock of every label move; the refs' history stays.
        Returns (refs dropped, members dropped)."""
        envs = sorted(set(env_fps))
        refs = members = 0
        with self._write("retire environments") as conn:
            self._lock_refs(conn)
            for i in range(0, len(envs), 500):  # SQLite's variable limit
                chunk = envs[i:i + 500]
                touched = conn.execute(sa.select(RELEASE_MEMBERS.c.release_id).distinct()
                                       .where(RELEASE_MEMBERS.c.env_fp.in_(chunk))).scalars()
                self.forget_journal(conn, RELEASE, list(touched))
                refs += conn.execute(sa.delete(REFS).where(REFS.c.env_fp.in_(chunk))).rowcount
                members += conn.execute(
                    sa.delete(RELEASE_MEMBERS).where(RELEASE_MEMBERS.c.env_fp.in_(chunk))
                ).rowcount
        self.journal_pending()
        return refs, members

    # -------------------------------------------------------------- releases

    def open_release(self, label: str, origin: RefOrigin, *, run: str | None = None) -> int:
        """The id of the set a labelled warm-up adds its refs to: a new set for
        ``label`` (its ``previous`` the current one), or, when ``run`` is given and the
        label's current set was opened by the same run (shards of one CI job), that set.
        The set is committed empty: a declaration uses :meth:`declare_release`, which
        opens it in the transaction of its members."""
        check_label(label)
        with self._write(f"open release {label}") as conn:
            self._lock_refs(conn)
            current = self._current_set(conn, label)
            if run is not None and current is not None and current["run"] == run:
                return int(current["id"])
            set_id = self._new_set(conn, label, origin, previous=None if current is None else current["id"], run=run)
        self.journal_pending()
        return set_id

    def promote(self, source: str, target: str, origin: RefOrigin) -> Release:
        """Points label ``target`` at the set ``source`` points to now (a new set of
        ``target`` with the same members)."""
        check_label(target)
        with self._write(f"promote {source} to {target}") as conn:
            self._lock_refs(conn)
            current = self._current_set(conn, source)
            if current is None:
                raise CacheError(f"no release labelled {source!r}{_hint(conn, source)}; `aot release ls` lists the labels")
            before = self._current_set(conn, target)
            # The new set keeps the promoted set's provenance: which set it was, and the
            # commit its members were built from (the promoter's only when it has none).
            origin = replace(origin, source=promote_source(source, int(current["id"])),
                             commit=current["commit"] or origin.commit)
            new = self._new_set(conn, target, origin, previous=None if before is None else before["id"])
            self._copy_members(conn, int(current["id"]), new)
        self.journal_pending()
        release = self.release_set(target)
        assert release is not None
        return release

    def rollback(self, label: str, origin: RefOrigin, *, require_stored: bool = True) -> Release:
        """Points ``label`` back at the set it pointed to before its current one. Done
        again, it goes one further step back; refuses a set naming an entry not stored
        or not intact (``require_stored``), checked under the move's lock."""
        with self._write(f"roll back {label}") as conn:
            self._lock_refs(conn)
            current = self._current_set(conn, label)
            if current is None:
                raise CacheError(f"no release labelled {label!r}{_hint(conn, label)}; `aot release ls` lists the labels")
            if current["previous"] is None:
                raise CacheError(_no_earlier_set(label, _release(current, ())))
            target = conn.execute(sa.select(RELEASES).where(RELEASES.c.id == current["previous"])).first()
            if target is None:
                raise CacheError(f"release {label!r}: its previous set {current['previous']} is gone")
            if require_stored:
                _check_members_stored(conn, label, int(current["id"]), int(target._mapping["id"]))
            # The set restored and the one left: history and the command name both.
            origin = replace(origin, source=rollback_source(int(target._mapping["id"]), int(current["id"])),
                             commit=target._mapping["commit"] or origin.commit)
            new = self._new_set(conn, label, origin, previous=target._mapping["previous"])
            self._copy_members(conn, int(target._mapping["id"]), new)
        self.journal_pending()
        release = self.release_set(label)
        assert release is not None
        return release

    def release_set(self, label: str, *, set_id: int | None = None, name: str | None = None) -> Release | None:
        """The current set of ``label`` (or set ``set_id``) with its members (of
        ``name`` only, when given); None when there is no such label."""
        with self._read(f"read release {label}") as conn:
            if set_id is None:
                row = self._current_set(conn, label)
            else:
                found = conn.execute(sa.select(RELEASES).where(RELEASES.c.id == set_id)).first()
                row = None if found is None else dict(found._mapping)
            if row is None:
                return None
            q = sa.select(RELEASE_MEMBERS).where(RELEASE_MEMBERS.c.release_id == row["id"])
            if name is not None:
                q = q.where(RELEASE_MEMBERS.c.name == name)
            members = tuple(
                ReleaseMember(m.name, m.signature, m.env_fp, m.key)
                for m in conn.execute(q.order_by(RELEASE_MEMBERS.c.name, RELEASE_MEMBERS.c.signature)).all()
            )
        return _release(row, members)

    def release_members(self, label: str, name: str) -> tuple[ReleaseMember, ...] | None:
        """The members of ``name`` in ``label``'s current set (None: no such label)."""
        release = self.release_set(label, name=name)
        return None if release is None else release.members

    def releases(self) -> list[Release]:
        """The current set of every label (members not read), by label."""
        latest = sa.select(sa.func.max(RELEASES.c.id)).group_by(RELEASES.c.label)
        with self._read("list releases") as conn:
            rows = conn.execute(sa.select(RELEASES).where(RELEASES.c.id.in_(latest)).order_by(RELEASES.c.label))
            return [_release(dict(r._mapping), ()) for r in rows.all()]

    def release_history(self, label: str) -> list[Release]:
        """Every set ``label`` pointed to, newest first (members not read)."""
        with self._read(f"read the history of release {label}") as conn:
            rows = conn.execute(sa.select(RELEASES).where(RELEASES.c.label == label).order_by(RELEASES.c.id.desc()))
            return [_release(dict(r._mapping), ()) for r in rows.all()]

    def pinned_keys(self, *, excluding: Collection[str] = ()) -> dict[str, str]:
        """``{key: why}`` for every key gc must keep: named by a current ref, or by a
        member of a set a label serves or a rollback could reach (every set down its
        ``previous`` chain). ``excluding``: as if those labels were gone (what ``aot
        release rm`` unpins)."""
        return {key: whys[0] for key, whys in self.pin_reasons(excluding=excluding).items()}

    def pin_reasons(self, *, excluding: Collection[str] = ()) -> dict[str, list[str]]:
        """Every reason :meth:`pinned_keys` has for each key (``aot rm`` names them all)."""
        with self._read("read what refs and releases pin") as conn:
            return pin_reasons(
                conn.execute(sa.select(REFS.c.key, REFS.c.name)).all(),
                conn.execute(sa.select(RELEASES.c.label, RELEASES.c.id, RELEASES.c.previous)).all(),
                lambda ids: conn.execute(
                    sa.select(RELEASE_MEMBERS.c.key, RELEASE_MEMBERS.c.release_id)
                    .where(RELEASE_MEMBERS.c.release_id.in_(ids))
                ).all(),
                excluding,
            )

    def plan_release_removal(self, labels: Sequence[str]) -> ReleaseRemoval:
        """What removing ``labels`` (every set of each) changes: their current and
        rollback sets, the stored entries only they pin, and the members something else
        keeps pinned. Raises CacheError naming the labels that exist when one is unknown."""
        labels = tuple(dict.fromkeys(labels))
        if not labels:
            raise CacheError("no release label given; `aot release ls` lists them")
        known = [r.label for r in self.releases()]
        unknown = [label for label in labels if label not in known]
        if unknown:
            raise CacheError(
                f"no release labelled {', '.join(repr(u) for u in unknown)}"
                f"{label_hint(unknown[0], known) if len(unknown) == 1 else ''}; the labels are "
                f"{', '.join(known) if known else '(none)'} (`aot release ls` lists them)"
            )
        removed = []
        for label in labels:
            current = self.release_set(label)
            if current is None:  # removed since it was listed
                raise CacheError(f"no release labelled {label!r} any more; `aot release ls` lists the labels")
            back = None if current.previous is None else self.release_set(label, set_id=current.previous)
            removed.append(RemovedRelease(label, current, back, len(self.release_history(label))))
        members = {m.key: m for r in removed for s in (r.current, r.rollback) if s is not None for m in s.members}
        for r in removed:  # and every set further down the chain a rollback could reach
            seen = {r.current.id}
            deeper = r.rollback
            while deeper is not None and deeper.id not in seen:
                seen.add(deeper.id)
                for m in deeper.members:
                    members.setdefault(m.key, m)
                deeper = None if deeper.previous is None else self.release_set(r.label, set_id=deeper.previous)
        after = self.pinned_keys(excluding=labels)
        stored = self._stored_keys(list(members))
        unpinned = tuple(members[k] for k in sorted(stored) if k not in after)
        still = tuple((members[k], after[k]) for k in sorted(members) if k in after)
        return ReleaseRemoval(tuple(removed), unpinned, still)

    def _stored_keys(self, keys: list[str]) -> set[str]:
        found: set[str] = set()
        with self._read("read which entries are stored") as conn:
            for i in range(0, len(keys), 500):
                chunk = keys[i:i + 500]
                found.update(conn.execute(sa.select(ARTIFACTS.c.key).where(ARTIFACTS.c.key.in_(chunk))).scalars())
        return found

    def remove_releases(self, plan: ReleaseRemoval) -> ReleaseRemoval:
        """Deletes every set of each planned label up to the one planned as current, in
        one transaction (the refs' history keeps the label names). A set added to a
        label after the plan (a warm-up or promotion meanwhile) is kept, with a warning."""
        with self._write(f"remove releases {', '.join(plan.labels)}") as conn:
            self._lock_refs(conn)
            for release in plan.releases:
                sets = sa.select(RELEASES.c.id).where(
                    RELEASES.c.label == release.label, RELEASES.c.id <= release.current.id
                )
                self.forget_journal(conn, RELEASE, list(conn.execute(sets).scalars()))
                conn.execute(sa.delete(RELEASE_MEMBERS).where(RELEASE_MEMBERS.c.release_id.in_(sets)))
                conn.execute(sa.delete(RELEASES).where(
                    RELEASES.c.label == release.label, RELEASES.c.id <= release.current.id
                ))
                newer = self._current_set(conn, release.label)
                if newer is not None:
                    logger.warning("release %s: set %s was recorded after the plan and is kept",
                                   release.label, newer["id"])
        logger.info("removed releases %s; %d entries unpinned", ", ".join(plan.labels), len(plan.unpinned))
        self.journal_pending()  # their journal blobs go now: a repair never brings a removed label back
        return replace(plan, executed=True)

    def _current_set(self, conn: Connection, label: str) -> dict[str, Any] | None:
        row = conn.execute(
            sa.select(RELEASES).where(RELEASES.c.label == label).order_by(RELEASES.c.id.desc()).limit(1)
        ).first()
        return None if row is None else dict(row._mapping)

    def _new_set(self, conn: Connection, label: str, origin: RefOrigin, *, previous: int | None,
                 run: str | None = None) -> int:
        return int(conn.execute(sa.insert(RELEASES).values(
            label=label, previous=previous, created_at=server_now(conn), host=origin.host, user=origin.user,
            source=origin.source, commit=origin.commit, run=run,
        ).returning(RELEASES.c.id)).scalar_one())

    def _members(self, conn: Connection, set_id: int) -> list[ReleaseMember]:
        rows = conn.execute(sa.select(RELEASE_MEMBERS).where(RELEASE_MEMBERS.c.release_id == set_id))
        return [ReleaseMember(m.name, m.signature, m.env_fp, m.key) for m in rows.all()]

    def _add_member(self, conn: Connection, set_id: int, member: ReleaseMember) -> None:
        upsert = insert_ignore(conn, RELEASE_MEMBERS).values(
            release_id=set_id, env_fp=member.env_fp, name=member.name,
            signature_digest=signature_digest(member.signature), signature=member.signature, key=member.key,
        )
        conn.execute(upsert.on_conflict_do_update(
            index_elements=[RELEASE_MEMBERS.c.release_id, RELEASE_MEMBERS.c.env_fp, RELEASE_MEMBERS.c.name,
                            RELEASE_MEMBERS.c.signature_digest],
            set_={"key": upsert.excluded.key},
        ))

    def _copy_members(self, conn: Connection, source_id: int, target_id: int) -> None:
        cols = [c for c in RELEASE_MEMBERS.c if c.name != "release_id"]
        conn.execute(RELEASE_MEMBERS.insert().from_select(
            ["release_id", *(c.name for c in cols)],
            sa.select(sa.literal(target_id), *cols).where(RELEASE_MEMBERS.c.release_id == source_id),
        ))

    def add_release_members(self, set_id: int, members: Sequence[ReleaseMember]) -> None:
        """Adds members to a release set (a copy's ``--release``)."""
        with self._write("record release members") as conn:
            self._lock_refs(conn)
            for member in members:
                self._add_member(conn, set_id, member)
            self.forget_journal(conn, RELEASE, [set_id])
        self.journal_pending()


def _append_ref(
    conn: Connection, name: str, signature: str, env_fp: str, key: str, origin: RefOrigin, now: Any,
) -> Ref:
    values = {
        "env_fp": env_fp, "name": name, "signature_digest": signature_digest(signature),
        "signature": signature, "key": key, "set_at": now, "host": origin.host, "user": origin.user,
        "source": origin.source, "release": origin.release, "commit": origin.commit,
    }
    seq = int(conn.execute(sa.insert(REF_HISTORY).values(**values).returning(REF_HISTORY.c.seq)).scalar_one())
    reached("refs.recorded")
    upsert = insert_ignore(conn, REFS).values(**values, seq=seq)
    update = {c: upsert.excluded[c] for c in ("signature", "key", "seq", "set_at", "host", "user",
                                              "source", "release", "commit")}
    conn.execute(upsert.on_conflict_do_update(
        index_elements=[REFS.c.env_fp, REFS.c.name, REFS.c.signature_digest],
        set_=update, where=REFS.c.seq < upsert.excluded.seq,
    ))
    return Ref(name=name, signature=signature, env_fp=env_fp, key=key, seq=seq, set_at=now,
               host=origin.host, user=origin.user, source=origin.source, release=origin.release,
               commit=origin.commit)


def _log_refs(changed: list[Ref], origin: RefOrigin) -> None:
    for ref in changed:
        logger.info("ref %s (%s) -> %s (%s)", ref.name, ref.signature, ref.key[:12], origin.source)


def _credit(conn: Connection, joined: dict[str, Any], targets: list[RefTarget], origin: RefOrigin) -> None:
    """Credits ``origin``'s source in the run's set ``joined`` when it declares
    members (another manifest of the run, or its warm-up that hits members carried
    from the previous set): ``release history`` names each manifest that declared
    the set, not only the first."""
    credited = credit_source(joined["source"], origin.source)
    if targets and credited != joined["source"]:
        conn.execute(sa.update(RELEASES).where(RELEASES.c.id == joined["id"]).values(source=credited))


def _hint(conn: Connection, label: str) -> str:
    """:func:`label_hint` over the labels stored (read in the move's transaction)."""
    return label_hint(label, conn.execute(sa.select(RELEASES.c.label).distinct()).scalars())


def check_label(label: str) -> None:
    """A release label is a short printable word (it appears in commands and logs)."""
    if not label or len(label) > 128 or any(c.isspace() for c in label) or not label.isprintable():
        raise CacheError(f"invalid release label {label!r}: use a short word without spaces (e.g. prod, canary)")


def _release(row: dict[str, Any], members: tuple[ReleaseMember, ...]) -> Release:
    return Release(
        id=int(row["id"]), label=row["label"], previous=row["previous"], created_at=row["created_at"],
        host=row["host"], user=row["user"], source=row["source"], commit=row["commit"], members=members,
    )


def _check_members_stored(conn: Connection, label: str, current_id: int, target_id: int) -> None:
    """Raises :class:`CacheError` naming the members of set ``target_id`` whose key
    is not stored, or stored but not intact (quarantined)."""
    rows = conn.execute(
        sa.select(RELEASE_MEMBERS.c.name, RELEASE_MEMBERS.c.signature, RELEASE_MEMBERS.c.key, ARTIFACTS.c.state)
        .select_from(RELEASE_MEMBERS.outerjoin(ARTIFACTS, ARTIFACTS.c.key == RELEASE_MEMBERS.c.key))
        .where(RELEASE_MEMBERS.c.release_id == target_id)
        .order_by(RELEASE_MEMBERS.c.name, RELEASE_MEMBERS.c.signature)
    ).all()
    missing = [
        f"{r.name} ({r.signature}) {r.key[:12]}: {'not stored' if r.state is None else r.state}"
        for r in rows if r.state != "ok"
    ]
    if missing:
        shown = "; ".join(missing[:5]) + (f"; and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CacheError(
            f"release {label!r} cannot roll back to set {target_id}: {len(missing)} of its entries "
            f"cannot be served ({shown}); the label stays on set {current_id}"
        )


def _no_earlier_set(label: str, current: Release) -> str:
    back = current.rolled_back
    if back is not None:  # a rollback's copy of the first set: not itself the first
        what = f"set {current.id}, the rollback to set {back[0]}, the first set it was given"
    else:
        what = f"set {current.id}, is the first set it was given"
    return (
        f"cannot roll back release {label!r}: it has no earlier set to go back to (what it "
        f"serves now, {what}); to serve other entries, warm "
        f"them up or promote a label with them (`aot release promote OTHER {label}`), and "
        "`aot release ls` shows the labels"
    )

"""What ``aot repair`` could not recover, one typed item each (:class:`Lost`): the plan
prints each as one line (:meth:`Lost.line`) and ``--json`` gives its fields."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["Lost", "LostKind"]


class LostKind(str, Enum):
    """What kind of thing was lost."""

    #: SQLite cannot read the file's schema: no row could be read.
    WHOLE_INDEX = "whole_index"
    #: A table read in part (rows on unreadable pages that no index names are not counted).
    TABLE_READ_IN_PART = "table_read_in_part"
    #: A row an index of the table names but that could not be read.
    UNREADABLE_ROW = "unreadable_row"
    #: An entry's row was read but is damaged (its manifest, key or times).
    DAMAGED_ENTRY = "damaged_entry"
    #: An entry's row was read but blobs it references are not stored.
    MISSING_BLOBS = "missing_blobs"
    #: A manifest (or journal) blob was found but refused (signature, blobs).
    REFUSED = "refused"
    #: Rows read but dropped: what they name was not recovered.
    DROPPED_ROWS = "dropped_rows"
    #: Stored blobs no recovered row references.
    ORPHAN_BLOBS = "orphan_blobs"
    #: A table of the lost index that nothing in the blob store journals.
    NOT_JOURNALED = "not_journaled"


@dataclass(frozen=True, slots=True, kw_only=True)
class Lost:
    """One thing ``aot repair`` could not recover, and what to run instead."""

    kind: LostKind
    #: The table it was a row of (None: the whole index, or blobs).
    table: str | None = None
    #: What: an entry's ``name (key12)``, a row's indexed values, a blob's digest.
    subject: str | None = None
    #: Why it was lost, in a few words.
    reason: str | None = None
    #: How many (rows, blobs).
    count: int = 1
    #: What to run instead, when something can be.
    advice: str | None = None

    def line(self) -> str:
        """The plan's line for it."""
        kind = self.kind
        if kind is LostKind.WHOLE_INDEX:
            return f"the whole index: SQLite cannot read its schema ({self.reason})"
        if kind is LostKind.TABLE_READ_IN_PART:
            return f"{self.table}: {self.reason} (rows on unreadable pages that no index names are not counted)"
        if kind is LostKind.UNREADABLE_ROW:
            return f"{self.table}: a row that could not be read ({self.subject or 'no readable index names it'})"
        if kind in (LostKind.DAMAGED_ENTRY, LostKind.MISSING_BLOBS, LostKind.REFUSED):
            return f"{self.table}: the entry {self.subject}: {self.reason}"
        if kind is LostKind.DROPPED_ROWS:
            return f"{self.table}: {self.count} row(s) dropped: {self.reason}"
        if kind is LostKind.ORPHAN_BLOBS:
            return f"{self.count} stored blob(s) belong to no recovered entry ({self.reason}; {self.advice})"
        return f"{self.table}: {self.reason}; {self.advice}"

    __str__ = line

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value, "table": self.table, "subject": self.subject, "reason": self.reason,
            "count": self.count, "advice": self.advice, "line": self.line(),
        }

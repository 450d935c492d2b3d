"""The embedded mode's strict tags: a take is one transaction on the ledger row.

The embedded mode (one SQLite file) has no Redis: the row's ``max_id`` is the
counter, moved up under the file's write lock (``SqliteStrict``). The guarantee
it keeps is ``pool/strict.py``'s.
"""

from __future__ import annotations

import sqlite3
import time

from .errors import TagExhausted
from .sqlite_file import SqliteFile
from .sqlite_ledger import _select
from .tag_rules import check_kind
from .values import next_range


class SqliteStrict:
    """The embedded mode's strict take: one transaction on the ledger row.

    ``max_id`` is the counter: a take of ``n`` moves it up by ``n`` under the
    file's write lock, fsynced before it returns, so takes are ordered by the
    lock and every later one starts where the last ended.
    """

    name = "sqlite"

    def __init__(self, file: SqliteFile, kind: str) -> None:
        self.file = file
        self.kind = kind  # its tags' kind: a take from a row of another is refused

    async def take(self, tag: str, n: int) -> int:
        """Raises UnknownTag, KindChanged, TagDisabled, TagExhausted (the batch does not fit
        under the tag's max: nothing is taken), StoreUnavailable."""
        def op(conn: sqlite3.Connection) -> int:
            # BEGIN IMMEDIATE: the write lock from the read to the COMMIT.
            row = _select(conn, tag)
            check_kind(tag, self.kind, row.kind)  # see Ledger.claim
            fresh = next_range(tag, row.max_id, n, row.end_id, row.disabled)
            if len(fresh) < n:
                raise TagExhausted(
                    f"tag {tag!r} has {len(fresh)} IDs left below its max, fewer than the {n} asked"
                )
            conn.execute(
                "UPDATE idpool_tags SET max_id = ?, updated_at = ? WHERE tag = ?",
                (fresh.end, time.time(), tag),
            )
            return fresh.start

        return await self.file.write(op)

    async def close(self) -> None:
        """The file belongs to the ledger, which closes it."""

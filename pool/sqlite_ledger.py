"""The embedded ledger: the MySQL ledger's rows and claims, in a SQLite file.

Same row semantics as ``pool/ledger.py``: ``max_id`` is the first ID not yet
claimed and only ever grows; a claim is one transaction that moves it up by
``step * n``; ``raise_floor`` never lowers it; ``adapt_step`` stays within the
tag's ``[min_step, max_step]``. Chosen only by a ``sqlite:`` IDPOOL_MYSQL_URL
(``idpool serve --embedded`` sets one); see ``pool/stores.py``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from .errors import TagExists, UnknownTag
from .kind_rules import DEFAULT_KIND, DEFAULT_RULES, KindRules
from .ranges import MAX_ID, IdRange
from .settings import Settings
from .sqlite_file import SqliteFile
from .tag_rules import NEW_ROW_COLUMNS, TOMBSTONE_COLUMNS, NewRow, check_kind
from .tokens import TokenRow
from .values import TagRow, next_range, period_rows_between

_COLUMNS = (
    "tag, max_id, step, start_id, description, updated_at, min_step, max_step, end_id, disabled, "
    "kind, layout, options, secret"
)


def _row(values: Any) -> TagRow:
    return TagRow.from_columns(values, datetime.fromtimestamp(values[5], UTC))


def _select(conn: sqlite3.Connection, tag: str) -> TagRow:
    found = conn.execute(f"SELECT {_COLUMNS} FROM idpool_tags WHERE tag = ?", (tag,)).fetchone()
    if found is None:
        raise UnknownTag(tag)
    return _row(found)


class SqliteLedger:
    name = "sqlite"  # in /status, /metrics and 503 messages

    def __init__(self, file: SqliteFile) -> None:
        self.file = file

    @classmethod
    async def connect(cls, settings: Settings) -> SqliteLedger:
        return cls(await SqliteFile.from_settings(settings, cls.name))

    async def close(self) -> None:
        await self.file.close()

    async def claim(self, tag: str, ranges: int = 1, kind: str = DEFAULT_KIND) -> IdRange:
        """Claim ``ranges * step`` fresh IDs for ``tag``, a tag of ``kind``, in one
        transaction.

        The last range of a bounded tag is cut short at its bound. Raises
        UnknownTag, KindChanged, TagDisabled, TagExhausted, or StoreUnavailable
        when the outcome is unknown.
        """

        def op(conn: sqlite3.Connection) -> IdRange:
            # BEGIN IMMEDIATE holds the file's write lock from the read to the
            # COMMIT, so two claims (from any process) can never overlap.
            row = _select(conn, tag)
            check_kind(tag, kind, row.kind)  # see Ledger.claim
            fresh = next_range(tag, row.max_id, row.step * ranges, row.end_id, row.disabled)
            conn.execute(
                "UPDATE idpool_tags SET max_id = ?, updated_at = ? WHERE tag = ?",
                (fresh.end, time.time(), tag),
            )
            return fresh

        return await self.file.write(op)

    async def raise_floor(self, tag: str, floor: int, *, start: bool = False) -> int:
        """Move ``max_id`` up to at least ``floor``; never down. Returns the new max_id.
        With ``start``, ``floor`` is also the tag's start from now on (an operator's)."""

        def op(conn: sqlite3.Connection) -> int:
            # MAX() of two arguments is SQLite's GREATEST: never moves max_id down.
            conn.execute(
                "UPDATE idpool_tags SET max_id = MAX(max_id, ?), updated_at = ?"
                + (", start_id = ?" if start else "")
                + " WHERE tag = ?",
                (floor, time.time(), floor, tag) if start else (floor, time.time(), tag),
            )
            return _select(conn, tag).max_id

        return await self.file.write(op)

    async def add_tag(
        self,
        tag: str,
        *,
        step: int,
        start: int,
        description: str = "",
        floor: int = 0,
        min_step: int | None = None,
        max_step: int | None = None,
        end_id: int = MAX_ID,
        rules: KindRules = DEFAULT_RULES,
        layout: str = "",
        options: str = "",
        secret: str = "",
    ) -> TagRow:
        """Create a tag whose first ID is ``max(start, floor)`` (see Ledger.add_tag)."""
        new = NewRow.checked(
            tag, rules, step=step, start=start, description=description, floor=floor,
            min_step=min_step, max_step=max_step, end_id=end_id, layout=layout,
            options=options, secret=secret,
        )  # fmt: skip

        def op(conn: sqlite3.Connection) -> TagRow:
            now = time.time()
            # Under the file's write lock (BEGIN IMMEDIATE): no removal between the
            # tombstone's read and the INSERT; the tag starts above all it issued,
            # only as the kind and format it was (NewRow.values, see Ledger.add_tag).
            removed = conn.execute(
                f"SELECT {TOMBSTONE_COLUMNS} FROM idpool_removed_tags WHERE tag = ?", (tag,)
            ).fetchone()
            try:
                conn.execute(
                    f"INSERT INTO idpool_tags ({NEW_ROW_COLUMNS}, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*new.values(removed), now, now),
                )
            except sqlite3.IntegrityError:
                raise TagExists(tag) from None
            return _select(conn, tag)

        return await self.file.write(op)

    async def remove_tag(self, tag: str) -> TagRow:
        """Delete a tag's row and tokens, keeping its tombstone (see Ledger.remove_tag)."""

        def op(conn: sqlite3.Connection) -> TagRow:
            # One write transaction: no claim between the read and the delete.
            row = _select(conn, tag)
            conn.execute(
                "INSERT INTO idpool_removed_tags (tag, max_id, removed_at, options, secret, kind) "
                "VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (tag) DO UPDATE SET max_id = MAX(max_id, excluded.max_id), "
                "removed_at = excluded.removed_at, options = excluded.options, "
                "secret = excluded.secret, kind = excluded.kind",
                (tag, row.max_id, time.time(), row.options, row.secret, row.kind),
            )
            conn.execute("DELETE FROM idpool_tokens WHERE tag = ?", (tag,))
            conn.execute("DELETE FROM idpool_tags WHERE tag = ?", (tag,))
            return row

        return await self.file.write(op)

    async def first_made(self, tag: str) -> float | None:
        """When the tag was made, or None (see Ledger.first_made)."""

        def op(conn: sqlite3.Connection) -> float | None:
            row = conn.execute(
                "SELECT t.created_at, r.tag FROM idpool_tags t "
                "LEFT JOIN idpool_removed_tags r ON r.tag = t.tag WHERE t.tag = ?",
                (tag,),
            ).fetchone()
            return None if row is None or row[1] is not None else float(row[0])

        return await self.file.read(op)

    async def removed_format(self, tag: str) -> tuple[str, str] | None:
        """The format the tombstone of ``tag`` keeps (see Ledger.removed_format)."""

        def op(conn: sqlite3.Connection) -> tuple[str, str] | None:
            row = conn.execute(
                "SELECT options, secret FROM idpool_removed_tags WHERE tag = ?", (tag,)
            ).fetchone()
            return None if row is None else (str(row[0]), str(row[1]))

        return await self.file.read(op)

    async def set_step(self, tag: str, step: int) -> TagRow:
        """An operator's step, with the tag's period rows (see Ledger.set_step)."""

        def op(conn: sqlite3.Connection) -> TagRow:
            conn.execute(
                "UPDATE idpool_tags SET step = ?, min_step = ?, max_step = MAX(max_step, ?), "
                "updated_at = ? WHERE tag = ? OR tag BETWEEN ? AND ?",
                (step, step, step, time.time(), tag, *period_rows_between(tag)),
            )
            return _select(conn, tag)

        return await self.file.write(op)

    async def set_disabled(self, tag: str, disabled: bool) -> TagRow:
        """Disable or enable a tag; max_id is kept (see Ledger.set_disabled)."""

        def op(conn: sqlite3.Connection) -> TagRow:
            conn.execute(  # with the tag's period rows, as in Ledger.set_disabled
                "UPDATE idpool_tags SET disabled = ?, updated_at = ? "
                "WHERE tag = ? OR tag BETWEEN ? AND ?",
                (int(disabled), time.time(), tag, *period_rows_between(tag)),
            )
            return _select(conn, tag)

        return await self.file.write(op)

    async def adapt_step(self, tag: str, step: int) -> int:
        """The dynamic step's decision, kept within the tag's bounds. Returns the new step."""

        def op(conn: sqlite3.Connection) -> int:
            conn.execute(
                "UPDATE idpool_tags SET step = MIN(MAX(?, min_step), max_step), updated_at = ? "
                "WHERE tag = ?",
                (step, time.time(), tag),
            )
            return _select(conn, tag).step

        return await self.file.write(op)

    async def add_token(self, tag: str, token_id: str, token_hash: str) -> TokenRow:
        """Store a token's hash for ``tag``. Raises UnknownTag."""

        def op(conn: sqlite3.Connection) -> TokenRow:
            _select(conn, tag)  # raises UnknownTag; the write lock keeps the row there
            now = time.time()
            conn.execute(
                "INSERT INTO idpool_tokens (tag, token_id, token_hash, created_at) "
                "VALUES (?, ?, ?, ?)",
                (tag, token_id, token_hash, now),
            )
            return TokenRow(tag, token_id, token_hash, datetime.fromtimestamp(now, UTC))

        return await self.file.write(op)

    async def list_tokens(self, tag: str | None = None) -> list[TokenRow]:
        """Every tag's tokens (hashes), or one tag's."""

        def op(conn: sqlite3.Connection) -> list[TokenRow]:
            rows = conn.execute(
                "SELECT tag, token_id, token_hash, created_at FROM idpool_tokens "
                "ORDER BY tag, created_at"
            ).fetchall()
            return [
                TokenRow(t, i, h, datetime.fromtimestamp(c, UTC))
                for t, i, h, c in rows
                if tag is None or t == tag
            ]

        return await self.file.read(op)

    async def revoke_token(self, tag: str, token_id: str) -> bool:
        """Delete one token; False when the tag has no such token."""

        def op(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "DELETE FROM idpool_tokens WHERE tag = ? AND token_id = ?", (tag, token_id)
            )
            return cur.rowcount > 0

        return await self.file.write(op)

    async def ping(self) -> None:
        await self.file.read(lambda conn: conn.execute("SELECT 1").fetchone())

    async def get_tag(self, tag: str) -> TagRow:
        return await self.file.read(lambda conn: _select(conn, tag))

    async def list_tags(self, names: Sequence[str] | None = None) -> list[TagRow]:
        """Every tag's row, or only those of ``names``."""

        def op(conn: sqlite3.Connection) -> list[TagRow]:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM idpool_tags ORDER BY tag").fetchall()
            wanted = None if names is None else set(names)
            return [_row(r) for r in rows if wanted is None or r[0] in wanted]

        return await self.file.read(op)

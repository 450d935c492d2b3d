"""The MySQL ledger's tag rows: read, add, remove, change; and their tokens.

A tag is added above every ID its name ever issued (its tombstone, read under a
lock, ``tag_rules.NewRow``'s rules) and removed keeping that tombstone, in one
transaction each; an operator's step and the disabled flag change the tag's
period rows with it. The claim itself is in ``pool/ledger.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pymysql

from .errors import StoreUnavailable, TagExists, UnknownTag
from .kind_rules import DEFAULT_RULES, KindRules
from .ledger_connections import LedgerConnections
from .ledger_schema import _BAD_FIELD, _NO_SUCH_TABLE, REMOVED, TABLE, TOKENS
from .ranges import MAX_ID
from .tag_rules import NEW_ROW_COLUMNS, TOMBSTONE_COLUMNS, NewRow
from .tokens import TokenRow
from .values import TagRow, period_rows_between

_COLUMNS = (
    "tag, max_id, step, start_id, description, updated_at, min_step, max_step, end_id, disabled, "
    "kind, layout, options, secret"
)


def _tag_row(values: Sequence[Any]) -> TagRow:
    return TagRow.from_columns(values, values[5])


class LedgerTags(LedgerConnections):
    """A tag's row and its tokens in MySQL: every change but the claim."""

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
        """Create a tag of the kind ``rules`` whose first ID is ``max(start, floor)``.

        ``floor`` is the high-water mark known outside MySQL: a tag deleted by hand
        and added again cannot hand out its old IDs a second time. The dynamic
        step stays within ``[min_step, max_step]`` (default: ``[step, DEFAULT_MAX_STEP]``).
        No ID at or above ``end_id`` is ever claimed (ValueError unless above start).
        The row's rules are ``tag_rules.NewRow``'s; only the SQL is here.
        """
        new = NewRow.checked(
            tag, rules, step=step, start=start, description=description, floor=floor,
            min_step=min_step, max_step=max_step, end_id=end_id, layout=layout,
            options=options, secret=secret,
        )  # fmt: skip

        async def op(cur: Any) -> None:
            # The tombstone of a removed tag of this name, read with a lock (a gap
            # lock when there is none): a removal cannot write one between this
            # read and our INSERT, so the tag starts above every ID it ever issued,
            # and renders them only with the format and kind it had (NewRow.values).
            try:
                await cur.execute(
                    f"SELECT {TOMBSTONE_COLUMNS} FROM {REMOVED} "
                    "WHERE tag = %s FOR UPDATE",
                    (tag,),
                )
                removed = await cur.fetchone()
            except pymysql.err.ProgrammingError as e:
                if e.args[0] != _NO_SUCH_TABLE:
                    raise
                removed = None  # made before removals existed (IDPOOL_CREATE_DATABASE=0): none
            except pymysql.err.OperationalError as e:
                if e.args[0] != _BAD_FIELD:
                    raise
                raise StoreUnavailable(
                    "mysql",
                    f"table {REMOVED} lacks the options or kind column: run idpool once with "
                    "IDPOOL_CREATE_DATABASE=1 (the default) to add it; nothing was added",
                ) from None
            try:
                await cur.execute(
                    f"INSERT INTO {TABLE} ({NEW_ROW_COLUMNS}) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    new.values(removed),
                )
            except pymysql.err.IntegrityError:
                raise TagExists(tag) from None
            await cur.connection.commit()

        await self._run(op, transaction=True)
        return await self.get_tag(tag)

    async def remove_tag(self, tag: str) -> TagRow:
        """Delete a tag's row and tokens, keeping its tombstone (``max_id``) so
        that the name added again starts above every ID it ever issued. Returns
        the row as it was removed. Raises UnknownTag."""

        async def op(cur: Any) -> TagRow:
            # The tombstone's row lock first, as add_tag takes it: an add and a
            # removal of one name run one after the other, never interleaved.
            try:
                await cur.execute(
                    f"INSERT INTO {REMOVED} (tag, max_id) VALUES (%s, 0) "
                    "ON DUPLICATE KEY UPDATE max_id = max_id",
                    (tag,),
                )
            except pymysql.err.ProgrammingError as e:
                if e.args[0] != _NO_SUCH_TABLE:
                    raise
                raise StoreUnavailable(
                    "mysql",
                    f"no table {REMOVED} to keep the tag's tombstone in: run idpool once "
                    "with IDPOOL_CREATE_DATABASE=1 (the default) to add it; nothing was removed",
                ) from None
            # FOR UPDATE: a claim under way finishes first, and its range is below
            # the max_id we keep; a claim after our COMMIT finds no row.
            await cur.execute(f"SELECT {_COLUMNS} FROM {TABLE} WHERE tag = %s FOR UPDATE", (tag,))
            found = await cur.fetchone()
            if found is None:
                raise UnknownTag(tag)  # rolled back by _run, the tombstone's insert too
            row = _tag_row(found)
            # The format and kind too: the name added again may only be what this one was.
            await cur.execute(
                f"UPDATE {REMOVED} SET max_id = GREATEST(max_id, %s), options = %s, secret = %s, "
                "kind = %s WHERE tag = %s",
                (row.max_id, row.options, row.secret, row.kind, tag),
            )
            await cur.execute(f"DELETE FROM {TOKENS} WHERE tag = %s", (tag,))
            await cur.execute(f"DELETE FROM {TABLE} WHERE tag = %s", (tag,))
            await cur.connection.commit()
            return row

        return await self._run(op, transaction=True)

    async def first_made(self, tag: str) -> float | None:
        """When the tag was made (unix seconds), or None when that does not bound
        what the name issued: no row, or a name removed before (its tombstone:
        the earlier tag's IDs are dated before this row)."""

        async def op(cur: Any) -> float | None:
            await cur.execute(
                f"SELECT UNIX_TIMESTAMP(t.created_at), r.tag FROM {TABLE} t "
                f"LEFT JOIN {REMOVED} r ON r.tag = t.tag WHERE t.tag = %s",
                (tag,),
            )
            row = await cur.fetchone()
            return None if row is None or row[1] is not None else float(row[0])

        return await self._run(op)

    async def removed_format(self, tag: str) -> tuple[str, str] | None:
        """The format (options, secret) the tombstone of ``tag`` keeps, or None when
        the name was never removed. ``add_tag`` checks it again under its lock."""

        async def op(cur: Any) -> tuple[str, str] | None:
            try:
                await cur.execute(f"SELECT options, secret FROM {REMOVED} WHERE tag = %s", (tag,))
            except pymysql.err.ProgrammingError as e:
                if e.args[0] != _NO_SUCH_TABLE:
                    raise
                return None
            except pymysql.err.OperationalError as e:
                if e.args[0] != _BAD_FIELD:
                    raise
                return None  # add_tag refuses, naming the migration
            row = await cur.fetchone()
            return None if row is None else (str(row[0]), str(row[1]))

        return await self._run(op)

    async def set_step(self, tag: str, step: int) -> TagRow:
        """An operator's step: the new size, and the floor of the dynamic step.
        A tag with a reset claims from its period rows (``TAG@KEY``): they take it
        too (the periods to come copy the tag's own row)."""

        async def op(cur: Any) -> int:
            # A primary-key range beside the tag, as in set_disabled.
            result: int = await cur.execute(
                f"UPDATE {TABLE} SET step = %s, min_step = %s, "
                "max_step = GREATEST(max_step, %s) WHERE tag = %s OR tag BETWEEN %s AND %s",
                (step, step, step, tag, *period_rows_between(tag)),
            )
            return result

        await self._run(op)
        return await self.get_tag(tag)

    async def set_disabled(self, tag: str, disabled: bool) -> TagRow:
        """Disable or enable a tag. Only the flag changes: max_id (the tag's
        high-water mark in the ledger) is kept, so an enabled tag goes on above it."""

        async def op(cur: Any) -> int:
            # The tag's period rows (TAG@KEY, formats with a reset) with it: a
            # primary-key range, so no other tag's row is locked.
            result: int = await cur.execute(
                f"UPDATE {TABLE} SET disabled = %s WHERE tag = %s OR tag BETWEEN %s AND %s",
                (int(disabled), tag, *period_rows_between(tag)),
            )
            return result

        await self._run(op)
        return await self.get_tag(tag)

    async def get_tag(self, tag: str) -> TagRow:
        async def op(cur: Any) -> TagRow | None:
            await cur.execute(f"SELECT {_COLUMNS} FROM {TABLE} WHERE tag = %s", (tag,))
            row = await cur.fetchone()
            return None if row is None else _tag_row(row)

        found = await self._run(op)
        if found is None:
            raise UnknownTag(tag)
        return found

    async def list_tags(self, names: Sequence[str] | None = None) -> list[TagRow]:
        """Every tag's row, or only those of ``names``."""

        async def op(cur: Any) -> list[TagRow]:
            if names is None:
                await cur.execute(f"SELECT {_COLUMNS} FROM {TABLE} ORDER BY tag")
            elif not names:
                return []
            else:
                marks = ", ".join(["%s"] * len(names))
                await cur.execute(
                    f"SELECT {_COLUMNS} FROM {TABLE} WHERE tag IN ({marks}) ORDER BY tag",
                    tuple(names),
                )
            return [_tag_row(row) for row in await cur.fetchall()]

        return await self._run(op)

    async def add_token(self, tag: str, token_id: str, token_hash: str) -> TokenRow:
        """Store a token's hash for ``tag``. Raises UnknownTag."""

        async def op(cur: Any) -> None:
            # INSERT ... SELECT: the tag's row must exist, in the same statement.
            added = await cur.execute(
                f"INSERT INTO {TOKENS} (tag, token_id, token_hash) "
                f"SELECT tag, %s, %s FROM {TABLE} WHERE tag = %s",
                (token_id, token_hash, tag),
            )
            if added != 1:
                raise UnknownTag(tag)

        await self._run(op)
        return next(t for t in await self.list_tokens(tag) if t.token_id == token_id)

    async def list_tokens(self, tag: str | None = None) -> list[TokenRow]:
        """Every tag's tokens (hashes), or one tag's."""

        async def op(cur: Any) -> list[TokenRow]:
            # UNIX_TIMESTAMP: the instant, whatever the session's time zone (a TIMESTAMP
            # read as is comes back naive, in that zone: shown without one, it misled)
            query = (
                f"SELECT tag, token_id, token_hash, UNIX_TIMESTAMP(created_at) FROM {TOKENS}"
            )
            if tag is None:
                await cur.execute(query + " ORDER BY tag, created_at")
            else:
                await cur.execute(query + " WHERE tag = %s ORDER BY created_at", (tag,))
            return [
                TokenRow(t, i, h, datetime.fromtimestamp(float(c), UTC))
                for t, i, h, c in await cur.fetchall()
            ]

        return await self._run(op)

    async def revoke_token(self, tag: str, token_id: str) -> bool:
        """Delete one token; False when the tag has no such token."""

        async def op(cur: Any) -> bool:
            deleted = await cur.execute(
                f"DELETE FROM {TOKENS} WHERE tag = %s AND token_id = %s", (tag, token_id)
            )
            return bool(deleted)

        return await self._run(op)

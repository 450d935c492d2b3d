"""The MySQL ledger: one row per tag, and the atomic range claim.

Row semantics: ``max_id`` is the first ID not yet claimed by anyone. Every ID in
``[start_id, max_id)`` has been claimed (handed to a pool, a node, or wasted);
no ID at or above ``max_id`` has. ``max_id`` only ever grows.

``Ledger`` opens the connections (``connect``), makes the tables
(``ensure_schema``) and claims, over its parts: the tables
(``pool/ledger_schema.py``), the connections and the conflict retries
(``pool/ledger_connections.py``), the tag rows and tokens
(``pool/ledger_tags.py``).
"""

from __future__ import annotations

import warnings
from typing import Any

import pymysql

from .errors import StoreUnavailable, UnknownTag
from .kind_rules import DEFAULT_KIND
from .ledger_connections import (
    _CONNECTION_ERRORS,
    GALERA_SESSION,
    _error_text,
    _is_galera,
    _open_connections,
)
from .ledger_schema import (
    _MIGRATIONS,
    _UNKNOWN_DATABASE,
    REMOVED_SCHEMA,
    SCHEMA,
    TABLE,
    TOKENS,
    TOKENS_SCHEMA,
    _add_column,
    _create_database,
    _exact_tag_names,
)
from .ledger_tags import LedgerTags
from .ranges import IdRange
from .settings import Settings
from .tag_rules import check_kind
from .values import next_range, read_end

__all__ = ["SCHEMA", "TABLE", "Ledger"]


class Ledger(LedgerTags):
    name = "mysql"  # in /status, /metrics and 503 messages

    @classmethod
    async def connect(cls, settings: Settings, *, create: bool | None = None) -> Ledger:
        """Open the connections (aiomysql's pool); create the database and table if allowed.

        Raises StoreUnavailable naming IDPOOL_MYSQL_URL when MySQL cannot be reached.
        """
        params = settings.mysql_params()
        create = settings.create_database if create is None else create
        try:
            try:
                conns = await _open_connections(params, settings.store_timeout, params.database)
            except pymysql.err.OperationalError as e:
                if e.args[0] != _UNKNOWN_DATABASE or not create:
                    raise
                await _create_database(params, settings.store_timeout)
                conns = await _open_connections(params, settings.store_timeout, params.database)
            galera = await _is_galera(conns)
            if galera:  # again, each new connection setting wsrep_sync_wait first
                conns.close()
                await conns.wait_closed()
                conns = await _open_connections(
                    params, settings.store_timeout, params.database, GALERA_SESSION
                )
        except _CONNECTION_ERRORS as e:
            raise StoreUnavailable(
                "mysql",
                f"cannot open database {params.database!r} at {params.host}:{params.port} "
                f"as {params.user!r} (check IDPOOL_MYSQL_URL): {_error_text(e)}",
            ) from e
        ledger = cls(conns, settings.store_timeout, galera=galera)
        if create:
            await ledger.ensure_schema()
        return ledger

    async def ensure_schema(self) -> None:
        async def op(cur: Any) -> None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "table already exists" is the normal case
                # A migration that cannot get its metadata lock soon gives up (the
                # start fails and is retried) rather than queue every query behind it.
                await cur.execute("SET SESSION lock_wait_timeout = 10")
                await cur.execute(SCHEMA)
                await cur.execute(TOKENS_SCHEMA)
                await cur.execute(REMOVED_SCHEMA)
                for table, column, definition in _MIGRATIONS:
                    await _add_column(cur, table, column, definition)
                for table in (TABLE, TOKENS):
                    await _exact_tag_names(cur, table)

        await self._run(op)

    async def claim(self, tag: str, ranges: int = 1, kind: str = DEFAULT_KIND) -> IdRange:
        """Claim ``ranges * step`` fresh IDs for ``tag``, a tag of ``kind``, in one
        transaction.

        The last range of a bounded tag is cut short at its bound. Raises
        UnknownTag, KindChanged (the row is of another kind), TagDisabled,
        TagExhausted (nothing left below the bound), or StoreUnavailable when the
        outcome is unknown (the caller then treats whatever may have been claimed
        as wasted).
        """

        async def op(cur: Any) -> IdRange:
            # FOR UPDATE takes the row lock until COMMIT: no other claim can read
            # max_id between our read and our write, so two claims never overlap.
            # The kind in the same read: a name removed and added again as another
            # kind between a node's reloads gets no claim of the old kind.
            await cur.execute(
                f"SELECT max_id, step, end_id, disabled, kind FROM {TABLE} "
                "WHERE tag = %s FOR UPDATE",
                (tag,),
            )
            row = await cur.fetchone()
            if row is None:
                raise UnknownTag(tag)
            check_kind(tag, kind, str(row[4]))
            start, step, stored, disabled = (int(v) for v in row[:4])
            fresh = next_range(tag, start, step * ranges, read_end(stored), bool(disabled))
            await cur.execute(f"UPDATE {TABLE} SET max_id = %s WHERE tag = %s", (fresh.end, tag))
            await cur.connection.commit()
            return fresh

        return await self._run(op, transaction=True, retry="claim")

    async def raise_floor(self, tag: str, floor: int, *, start: bool = False) -> int:
        """Move ``max_id`` up to at least ``floor``; never down. Returns the new max_id.
        With ``start``, ``floor`` is also the tag's start from now on (an operator's)."""

        async def op(cur: Any) -> int:
            await cur.execute(
                f"UPDATE {TABLE} SET max_id = GREATEST(max_id, %s)"
                + (", start_id = %s" if start else "")
                + " WHERE tag = %s",
                (floor, floor, tag) if start else (floor, tag),
            )
            await cur.execute(f"SELECT max_id FROM {TABLE} WHERE tag = %s", (tag,))
            row = await cur.fetchone()
            await cur.connection.commit()
            if row is None:
                raise UnknownTag(tag)
            return int(row[0])

        return await self._run(op, transaction=True, retry="raise_floor")

    async def adapt_step(self, tag: str, step: int) -> int:
        """The dynamic step's decision, kept within the tag's bounds. Returns the new step."""

        async def op(cur: Any) -> int | None:
            await cur.execute(
                f"UPDATE {TABLE} SET step = LEAST(GREATEST(%s, min_step), max_step) WHERE tag = %s",
                (step, tag),
            )
            await cur.execute(f"SELECT step FROM {TABLE} WHERE tag = %s", (tag,))
            row = await cur.fetchone()
            await cur.connection.commit()
            return None if row is None else int(row[0])

        new = await self._run(op, transaction=True, retry="adapt_step")
        if new is None:
            raise UnknownTag(tag)
        return new

    async def ping(self) -> None:
        """Raise StoreUnavailable unless MySQL answers a trivial query (the health probe)."""

        async def op(cur: Any) -> None:
            await cur.execute("SELECT 1")
            await cur.fetchone()

        await self._run(op)

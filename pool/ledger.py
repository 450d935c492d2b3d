"""The MySQL ledger: one row per tag, and the atomic range claim.

Row semantics: ``max_id`` is the first ID not yet claimed by anyone. Every ID in
``[start_id, max_id)`` has been claimed (handed to a pool, a node, or wasted);
no ID at or above ``max_id`` has. ``max_id`` only ever grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiomysql
import pymysql

from .errors import (
    InvalidInput,
    StoreUnavailable,
    TagDisabled,
    TagExhausted,
    TagExists,
    UnknownTag,
)
from .kind_rules import DEFAULT_KIND, DEFAULT_RULES, KindRules
from .ranges import MAX_ID, IdRange
from .settings import MysqlParams, Settings
from .tag_rules import NEW_ROW_COLUMNS, TOMBSTONE_COLUMNS, NewRow, check_kind
from .tokens import TokenRow
from .values import TagRow, next_range, period_rows_between, read_end

T = TypeVar("T")
TABLE = "idpool_tags"
_COLUMNS = (
    "tag, max_id, step, start_id, description, updated_at, min_step, max_step, end_id, disabled, "
    "kind, layout, options, secret"
)

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    tag         VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    max_id      BIGINT       NOT NULL COMMENT 'first ID not yet claimed',
    step        INT          NOT NULL COMMENT 'IDs per range (adapted by the preloader)',
    min_step    INT          NOT NULL COMMENT 'dynamic step never goes below',
    max_step    INT          NOT NULL COMMENT 'dynamic step never goes above',
    start_id    BIGINT       NOT NULL COMMENT 'first ID the tag hands out',
    end_id      BIGINT       NOT NULL DEFAULT 9223372036854775807
                             COMMENT 'first ID never handed out: the tag bound (--max) + 1',
    disabled    TINYINT(1)   NOT NULL DEFAULT 0 COMMENT '1: no claim until enabled',
    kind        VARCHAR(16)  NOT NULL DEFAULT '{DEFAULT_KIND}' COMMENT 'how its IDs are made',
    layout      VARCHAR(64)  NOT NULL DEFAULT '' COMMENT 'bit layout of a snowflake tag',
    options     VARCHAR(1024) NOT NULL DEFAULT '' COMMENT 'JSON: format, reset, obfuscate',
    secret      VARCHAR(64)  NOT NULL DEFAULT '' COMMENT 'obfuscation key (hex); never shown',
    description VARCHAR(255) NOT NULL DEFAULT '',
    created_at  TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at  TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
                             ON UPDATE CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
"""

TOKENS = "idpool_tokens"
TOKENS_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TOKENS} (
    tag        VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    token_id   VARCHAR(16)  NOT NULL COMMENT 'names the token; not secret',
    token_hash CHAR(64)     NOT NULL COMMENT 'hex SHA-256 of the token (never the token)',
    created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (tag, token_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
"""

REMOVED = "idpool_removed_tags"
REMOVED_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {REMOVED} (
    tag        VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    max_id     BIGINT       NOT NULL COMMENT 'the removed row max_id: nothing above was claimed',
    options    VARCHAR(1024) NOT NULL DEFAULT '' COMMENT 'its format: kept by the name added again',
    secret     VARCHAR(64)  NOT NULL DEFAULT '' COMMENT 'its obfuscation key (hex)',
    kind       VARCHAR(16)  NOT NULL DEFAULT '' COMMENT 'its kind: kept by the name added again',
    removed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
                            ON UPDATE CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COMMENT 'tombstones of removed tags, never deleted'
"""

# Tables made before a column existed get it here, in place (ensure_schema).
# ADD COLUMN IF NOT EXISTS: two nodes starting at once both run it harmlessly.
_MIGRATIONS = [
    (
        TABLE,
        "end_id",
        "BIGINT NOT NULL DEFAULT 9223372036854775807 "
        "COMMENT 'first ID never handed out: the tag bound (--max) + 1'",
    ),
    (TABLE, "disabled", "TINYINT(1) NOT NULL DEFAULT 0 COMMENT '1: no claim until enabled'"),
    (
        TABLE,
        "kind",
        f"VARCHAR(16) NOT NULL DEFAULT '{DEFAULT_KIND}' COMMENT 'how its IDs are made'",
    ),
    (TABLE, "layout", "VARCHAR(64) NOT NULL DEFAULT '' COMMENT 'bit layout of a snowflake tag'"),
    (
        TABLE,
        "options",
        "VARCHAR(1024) NOT NULL DEFAULT '' COMMENT 'JSON: format, reset, obfuscate'",
    ),
    (
        TABLE,
        "secret",
        "VARCHAR(64) NOT NULL DEFAULT '' COMMENT 'obfuscation key (hex); never shown'",
    ),
    # A tombstone keeps the removed tag's format: the name added again may only
    # keep it (tombstones made before: '', as if plain).
    (
        REMOVED,
        "options",
        "VARCHAR(1024) NOT NULL DEFAULT '' COMMENT 'its format: kept by the name added again'",
    ),
    (REMOVED, "secret", "VARCHAR(64) NOT NULL DEFAULT '' COMMENT 'its obfuscation key (hex)'"),
    # And its kind (tombstones made before: '', taken as any kind).
    (
        REMOVED,
        "kind",
        "VARCHAR(16) NOT NULL DEFAULT '' COMMENT 'its kind: kept by the name added again'",
    ),
]
_DUPLICATE_COLUMN = 1060

# pymysql raises these when the server is gone or the socket broke.
_CONNECTION_ERRORS = (
    pymysql.err.OperationalError,
    pymysql.err.InterfaceError,
    ConnectionError,
    OSError,
    TimeoutError,
)
_UNKNOWN_DATABASE = 1049
_BAD_FIELD = 1054  # a column an older table lacks
_NO_SUCH_TABLE = 1146
# ER_LOCK_DEADLOCK: Galera's certification failure (at COMMIT, or a brute-force abort
# by a replicated write set), or an InnoDB deadlock. The server rolled the whole
# transaction back: nothing of it was applied on any member, so it may run again.
_DEADLOCK = 1213
# A transaction that keeps losing certification (a member catching up after a
# freeze loses many in a row) runs again for as long as the store timeout lasts:
# the n-th retry waits a random time up to min(CONFLICT_BACKOFF * 2**n,
# CONFLICT_BACKOFF_MAX), and none starts with less than CONFLICT_RESERVE of the
# timeout left (it could not finish: an attempt cut by the timeout is ambiguous).
CONFLICT_BACKOFF = 0.005  # s
CONFLICT_BACKOFF_MAX = 0.1  # s
CONFLICT_RESERVE = 0.1  # of the store timeout
# Galera: every read first waits until this member has applied every write set
# the cluster committed before it (1: SELECT, SHOW, BEGIN), so a tag created,
# disabled or bounded on another member is seen at once.
GALERA_SESSION = "SET SESSION wsrep_sync_wait = 1"


def _tag_row(values: Sequence[Any]) -> TagRow:
    return TagRow.from_columns(values, values[5])


class Ledger:
    name = "mysql"  # in /status, /metrics and 503 messages

    def __init__(self, connections: Any, timeout: float, *, galera: bool = False) -> None:
        self._connections = connections  # aiomysql's pool of connections
        self._timeout = timeout
        self.galera = galera  # a Galera member: its sessions set wsrep_sync_wait
        # (operation, reason) -> transactions run again after a conflict (/metrics)
        self.retries: Counter[tuple[str, str]] = Counter()
        # operation -> transactions given up after conflicts until the timeout (/metrics)
        self.conflict_failures: Counter[str] = Counter()

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

    async def close(self) -> None:
        if self._connections is None:
            return
        conns, self._connections = self._connections, None
        conns.close()
        try:
            # A connection still held (a query stuck on the server) must not hold
            # up the stop: past the store timeout, close every connection at once.
            await asyncio.wait_for(conns.wait_closed(), self._timeout)
        except TimeoutError:
            conns.terminate()
            await conns.wait_closed()

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

    async def _run(
        self, op: Callable[[Any], Awaitable[T]], *, transaction: bool = False, retry: str = ""
    ) -> T:
        """Run ``op`` on a pooled connection. With ``retry`` (the operation's name) a
        transaction the server rolled back on a conflict runs again, after a jittered
        exponential backoff, while the store timeout leaves time for another try: it
        was not applied, so running it again cannot claim a range twice. A lost
        answer is never retried (StoreUnavailable)."""
        if self._connections is None:
            raise StoreUnavailable("mysql", "ledger is closed")
        conns = self._connections
        loop = asyncio.get_running_loop()
        last_start = loop.time() + self._timeout * (1 - CONFLICT_RESERVE)
        try:
            async with asyncio.timeout(self._timeout):
                attempt = 0
                while True:
                    attempt += 1
                    try:
                        return await self._run_once(conns, op, transaction)
                    except pymysql.err.OperationalError as e:
                        if not (retry and _is_conflict(e)):
                            raise
                        # claims on several members collided: spread the next tries out
                        wait = random.uniform(
                            0, min(CONFLICT_BACKOFF * 2**attempt, CONFLICT_BACKOFF_MAX)
                        )
                        if loop.time() + wait > last_start:
                            self.conflict_failures[retry] += 1
                            raise StoreUnavailable(
                                "mysql",
                                f"{retry} rolled back by {attempt} conflicts in a row within "
                                f"the store timeout ({self._timeout} s; nothing applied): "
                                f"{_error_text(e)}",
                            ) from e
                        self.retries[retry, "certification" if self.galera else "deadlock"] += 1
                        await asyncio.sleep(wait)
        except _CONNECTION_ERRORS as e:
            await self._drop_idle(conns)
            raise StoreUnavailable("mysql", _error_text(e)) from e

    async def _run_once(
        self, conns: Any, op: Callable[[Any], Awaitable[T]], transaction: bool
    ) -> T:
        conn = await conns.acquire()
        try:
            if transaction:
                await conn.begin()
            async with conn.cursor() as cur:
                return await op(cur)
        except BaseException as e:
            # A timeout or broken socket leaves the connection in an unknown
            # state (maybe mid-transaction): never reuse it. After a conflict
            # the server rolled back; the connection is sound.
            if not isinstance(e, pymysql.err.IntegrityError | _DomainErrors) and not (
                _is_conflict(e)
            ):
                conn.close()
            elif transaction:
                await conn.rollback()
            raise
        finally:
            conns.release(conn)

    async def _drop_idle(self, conns: Any) -> None:
        """After a connection error, close the idle connections too: behind a virtual
        IP or proxy that moved to a promoted replica they lead to the old server, and
        one that hangs (no RST from a vanished host) would cost a call a timeout each."""
        with contextlib.suppress(*_CONNECTION_ERRORS):
            async with asyncio.timeout(self._timeout):
                await conns.clear()


_DomainErrors = (
    UnknownTag | TagExists | TagExhausted | TagDisabled | StoreUnavailable | InvalidInput
)





async def _exact_tag_names(cur: Any, table: str) -> None:
    """Make ``tag`` compare byte for byte in a table made before it did.

    With the database's default collation (case-insensitive) ``tag = 'ORDERS'``
    found the row ``orders``: a node then served ``ORDERS`` as a tag of its own,
    with its own token set (none), disabled flag and high-water mark, all while
    claiming from ``orders``'s row. Rows cannot clash: the old collation already
    refused two names that differ only in case.
    """
    await cur.execute(
        "SELECT COLLATION_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = 'tag'",
        (table,),
    )
    row = await cur.fetchone()
    if row is not None and row[0] != "utf8mb4_bin":
        await cur.execute(
            f"ALTER TABLE {table} MODIFY tag VARCHAR(64) "
            "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
        )


async def _add_column(cur: Any, table: str, column: str, definition: str) -> None:
    """Add a column a table made by an older idpool lacks. Look first: any ALTER,
    even one that changes nothing, waits for an exclusive metadata lock, and every
    query on the table queues behind it, so no node start may run one needlessly."""
    await cur.execute(
        "SELECT 1 FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = %s",
        (table, column),
    )
    if await cur.fetchone() is not None:
        return
    try:
        await cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
    except pymysql.err.MySQLError as dup:
        if dup.args[0] != _DUPLICATE_COLUMN:  # a node that added it meanwhile
            raise


def _is_conflict(e: BaseException) -> bool:
    return isinstance(e, pymysql.err.OperationalError) and bool(e.args) and e.args[0] == _DEADLOCK


async def _is_galera(conns: Any) -> bool:
    """Whether the server is a Galera member (``wsrep_on``); MySQL has no such variable."""
    async with conns.acquire() as conn, conn.cursor() as cur:
        await cur.execute("SHOW VARIABLES LIKE 'wsrep_on'")
        row = await cur.fetchone()
    return row is not None and str(row[1]).upper() == "ON"


def _error_text(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "no answer in time"
    return f"{type(e).__name__}: {e}"


async def _open_connections(
    params: MysqlParams, timeout: float, db: str, init_command: str | None = None
) -> Any:
    return await aiomysql.create_pool(
        host=params.host,
        port=params.port,
        user=params.user,
        password=params.password,
        db=db,
        autocommit=True,
        connect_timeout=timeout,
        minsize=1,
        maxsize=4,
        pool_recycle=300,
        init_command=init_command,
    )


async def _create_database(params: MysqlParams, timeout: float) -> None:
    conn = await aiomysql.connect(
        host=params.host,
        port=params.port,
        user=params.user,
        password=params.password,
        connect_timeout=timeout,
        autocommit=True,
    )
    try:
        async with conn.cursor() as cur:
            # database name was checked to be letters, digits and _ in Settings
            await cur.execute(f"CREATE DATABASE IF NOT EXISTS `{params.database}`")
    finally:
        conn.close()

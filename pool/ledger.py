"""The MySQL ledger: one row per tag, and the atomic range claim.

Row semantics: ``max_id`` is the first ID not yet claimed by anyone. Every ID in
``[start_id, max_id)`` has been claimed (handed to a pool, a node, or wasted);
no ID at or above ``max_id`` has. ``max_id`` only ever grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import aiomysql
import pymysql

from .errors import StoreUnavailable, TagExhausted, TagExists, UnknownTag
from .ranges import MAX_ID, IdRange
from .settings import MysqlParams, Settings

T = TypeVar("T")
TABLE = "idpool_tags"
DEFAULT_MAX_STEP = 1_000_000
_COLUMNS = "tag, max_id, step, start_id, description, updated_at, min_step, max_step"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    tag         VARCHAR(64)  NOT NULL PRIMARY KEY,
    max_id      BIGINT       NOT NULL COMMENT 'first ID not yet claimed',
    step        INT          NOT NULL COMMENT 'IDs per range (adapted by the preloader)',
    min_step    INT          NOT NULL COMMENT 'dynamic step never goes below',
    max_step    INT          NOT NULL COMMENT 'dynamic step never goes above',
    start_id    BIGINT       NOT NULL COMMENT 'first ID the tag hands out',
    description VARCHAR(255) NOT NULL DEFAULT '',
    created_at  TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at  TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
                             ON UPDATE CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
"""

# pymysql raises these when the server is gone or the socket broke.
_CONNECTION_ERRORS = (
    pymysql.err.OperationalError,
    pymysql.err.InterfaceError,
    ConnectionError,
    OSError,
    TimeoutError,
)
_UNKNOWN_DATABASE = 1049


def step_bounds(step: int, min_step: int | None, max_step: int | None) -> tuple[int, int]:
    """A new tag's dynamic-step bounds: ``[step, max(step, DEFAULT_MAX_STEP)]`` unless given."""
    lo = step if min_step is None else min_step
    hi = max(step, DEFAULT_MAX_STEP) if max_step is None else max_step
    return lo, hi


@dataclass(frozen=True)
class TagRow:
    tag: str
    max_id: int
    step: int
    start_id: int
    description: str
    updated_at: datetime
    min_step: int
    max_step: int


class Ledger:
    name = "mysql"  # in /status, /metrics and 503 messages

    def __init__(self, pool: Any, timeout: float) -> None:
        self._pool = pool
        self._timeout = timeout

    @classmethod
    async def connect(cls, settings: Settings, *, create: bool | None = None) -> Ledger:
        """Open a connection pool; create the database and table if allowed.

        Raises StoreUnavailable naming IDPOOL_MYSQL_URL when MySQL cannot be reached.
        """
        params = settings.mysql_params()
        create = settings.create_database if create is None else create
        try:
            try:
                pool = await _open_pool(params, settings.store_timeout, params.database)
            except pymysql.err.OperationalError as e:
                if e.args[0] != _UNKNOWN_DATABASE or not create:
                    raise
                await _create_database(params, settings.store_timeout)
                pool = await _open_pool(params, settings.store_timeout, params.database)
        except _CONNECTION_ERRORS as e:
            raise StoreUnavailable(
                "mysql",
                f"cannot open database {params.database!r} at {params.host}:{params.port} "
                f"as {params.user!r} (check IDPOOL_MYSQL_URL): {_describe(e)}",
            ) from e
        ledger = cls(pool, settings.store_timeout)
        if create:
            await ledger.ensure_schema()
        return ledger

    async def close(self) -> None:
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        pool.close()
        await pool.wait_closed()

    async def ensure_schema(self) -> None:
        async def op(cur: Any) -> None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "table already exists" is the normal case
                await cur.execute(SCHEMA)

        await self._run(op)

    async def claim(self, tag: str, ranges: int = 1) -> IdRange:
        """Claim ``ranges * step`` fresh IDs for ``tag`` in one transaction.

        Raises UnknownTag, or StoreUnavailable when the outcome is unknown (the
        caller then treats whatever may have been claimed as wasted).
        """

        async def op(cur: Any) -> IdRange:
            # The UPDATE takes the row lock; the SELECT in the same transaction
            # reads our own increment, so two claims can never overlap.
            # The guard is written max_id <= MAX_ID - step*n: the sum max_id + step*n
            # would overflow BIGINT near the top and fail as an error, not a no.
            updated = await cur.execute(
                f"UPDATE {TABLE} SET max_id = max_id + step * %s "
                "WHERE tag = %s AND max_id <= %s - step * %s",
                (ranges, tag, MAX_ID, ranges),
            )
            await cur.execute(f"SELECT max_id, step FROM {TABLE} WHERE tag = %s", (tag,))
            row = await cur.fetchone()
            await cur.connection.commit()
            if row is None:
                raise UnknownTag(tag)
            if updated != 1:
                raise TagExhausted(f"tag {tag!r} has run out of 64-bit IDs")
            max_id, step = int(row[0]), int(row[1])
            return IdRange(max_id - step * ranges, max_id)

        return await self._run(op, transaction=True)

    async def raise_floor(self, tag: str, floor: int) -> int:
        """Move ``max_id`` up to at least ``floor``; never down. Returns the new max_id."""

        async def op(cur: Any) -> int:
            await cur.execute(
                f"UPDATE {TABLE} SET max_id = GREATEST(max_id, %s) WHERE tag = %s", (floor, tag)
            )
            await cur.execute(f"SELECT max_id FROM {TABLE} WHERE tag = %s", (tag,))
            row = await cur.fetchone()
            await cur.connection.commit()
            if row is None:
                raise UnknownTag(tag)
            return int(row[0])

        return await self._run(op, transaction=True)

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
    ) -> TagRow:
        """Create a tag whose first ID is ``max(start, floor)``.

        ``floor`` is the high-water mark known outside MySQL: a tag deleted by hand
        and added again cannot hand out its old IDs a second time. The dynamic
        step stays within ``[min_step, max_step]`` (default: ``[step, DEFAULT_MAX_STEP]``).
        """
        lo, hi = step_bounds(step, min_step, max_step)

        async def op(cur: Any) -> None:
            try:
                await cur.execute(
                    f"INSERT INTO {TABLE} "
                    "(tag, max_id, step, start_id, description, min_step, max_step) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (tag, max(start, floor), step, start, description, lo, hi),
                )
            except pymysql.err.IntegrityError:
                raise TagExists(tag) from None

        await self._run(op)
        return await self.get_tag(tag)

    async def set_step(self, tag: str, step: int) -> TagRow:
        """An operator's step: the new size, and the floor of the dynamic step."""

        async def op(cur: Any) -> int:
            result: int = await cur.execute(
                f"UPDATE {TABLE} SET step = %s, min_step = %s, "
                "max_step = GREATEST(max_step, %s) WHERE tag = %s",
                (step, step, step, tag),
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

        new = await self._run(op, transaction=True)
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
            return None if row is None else TagRow(*row)

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
            return [TagRow(*row) for row in await cur.fetchall()]

        return await self._run(op)

    async def _run(self, op: Callable[[Any], Awaitable[T]], *, transaction: bool = False) -> T:
        if self._pool is None:
            raise StoreUnavailable("mysql", "ledger is closed")
        pool = self._pool
        try:
            async with asyncio.timeout(self._timeout):
                conn = await pool.acquire()
                try:
                    if transaction:
                        await conn.begin()
                    async with conn.cursor() as cur:
                        return await op(cur)
                except BaseException as e:
                    # A timeout or broken socket leaves the connection in an
                    # unknown state (maybe mid-transaction): never reuse it.
                    if not isinstance(e, pymysql.err.IntegrityError | _DomainErrors):
                        conn.close()
                    elif transaction:
                        await conn.rollback()
                    raise
                finally:
                    pool.release(conn)
        except _CONNECTION_ERRORS as e:
            await self._drop_idle(pool)
            raise StoreUnavailable("mysql", _describe(e)) from e

    async def _drop_idle(self, pool: Any) -> None:
        """After a connection error, close the idle connections too: behind a virtual
        IP or proxy that moved to a promoted replica they lead to the old server, and
        one that hangs (no RST from a vanished host) would cost a call a timeout each."""
        with contextlib.suppress(*_CONNECTION_ERRORS):
            async with asyncio.timeout(self._timeout):
                await pool.clear()


_DomainErrors = UnknownTag | TagExists | TagExhausted | StoreUnavailable


def _describe(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "no answer in time"
    return f"{type(e).__name__}: {e}"


async def _open_pool(params: MysqlParams, timeout: float, db: str) -> Any:
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

"""The MySQL ledger's connections, and how every ledger call runs on them.

``LedgerConnections`` holds aiomysql's pool of connections and runs each
operation on one (``_run``): within the store timeout, a connection in an
unknown state never reused, a lost answer never retried (StoreUnavailable).
A transaction the server rolled back on a conflict (a Galera certification
failure or an InnoDB deadlock: nothing of it applied) runs again after a
jittered backoff, so it cannot claim a range twice. The ledger's roles
(``pool/ledger_tags.py``, ``pool/ledger.py``) build on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Awaitable, Callable
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
from .settings import MysqlParams

T = TypeVar("T")

# pymysql raises these when the server is gone or the socket broke.
_CONNECTION_ERRORS = (
    pymysql.err.OperationalError,
    pymysql.err.InterfaceError,
    ConnectionError,
    OSError,
    TimeoutError,
)
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


class LedgerConnections:
    """aiomysql's pool of connections, and every call run on it (``_run``)."""

    def __init__(self, connections: Any, timeout: float, *, galera: bool = False) -> None:
        self._connections = connections  # aiomysql's pool of connections
        self._timeout = timeout
        self.galera = galera  # a Galera member: its sessions set wsrep_sync_wait
        # (operation, reason) -> transactions run again after a conflict (/metrics)
        self.retries: Counter[tuple[str, str]] = Counter()
        # operation -> transactions given up after conflicts until the timeout (/metrics)
        self.conflict_failures: Counter[str] = Counter()

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

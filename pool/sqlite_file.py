"""The embedded mode's SQLite file: one connection, one thread, whole transactions.

The embedded ledger (``pool/sqlite_ledger.py``) and pool (``pool/sqlite_pool.py``)
keep their tables in one file and each open it through a ``SqliteFile``. Every
store operation is one plain function run in the connection's own thread inside
``BEGIN IMMEDIATE ... COMMIT`` (ROLLBACK on any error). The thread finishes the
transaction whatever happens to the awaiting task: a timeout or a cancelled
request makes the outcome *unknown* to the caller (as with MySQL), never leaves a
transaction half done or the write lock held.

Durability: WAL journal with ``synchronous=FULL``, so COMMIT returns only after
the WAL is fsynced. A range claimed or popped is on disk before anyone uses it,
so neither ``kill -9`` nor a power cut can hand it out again after a restart.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from .errors import ConfigError, StoreUnavailable
from .settings import Settings

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS idpool_tags (
    tag         TEXT    NOT NULL PRIMARY KEY,
    max_id      INTEGER NOT NULL,  -- first ID not yet claimed; only ever grows
    step        INTEGER NOT NULL,  -- IDs per range (adapted by the preloader)
    min_step    INTEGER NOT NULL,
    max_step    INTEGER NOT NULL,
    start_id    INTEGER NOT NULL,
    end_id      INTEGER NOT NULL DEFAULT 9223372036854775807,  -- the bound (--max) + 1
    disabled    INTEGER NOT NULL DEFAULT 0,  -- 1: no claim until enabled
    kind        TEXT    NOT NULL DEFAULT 'segment',  -- how its IDs are made
    layout      TEXT    NOT NULL DEFAULT '',  -- bit layout of a snowflake tag
    options     TEXT    NOT NULL DEFAULT '',  -- JSON: format, reset, obfuscate
    secret      TEXT    NOT NULL DEFAULT '',  -- obfuscation key (hex); never shown
    description TEXT    NOT NULL DEFAULT '',
    created_at  REAL    NOT NULL,  -- unix time
    updated_at  REAL    NOT NULL
);
-- The pool: ranges ready per tag, served in seq order (head = lowest seq).
CREATE TABLE IF NOT EXISTS idpool_pool (
    tag      TEXT    NOT NULL,
    seq      INTEGER NOT NULL,
    first_id INTEGER NOT NULL,
    last_id  INTEGER NOT NULL,  -- inclusive, as in Redis
    PRIMARY KEY (tag, seq)
);
-- What Redis keeps in idpool:{tag}:stats, idpool:{tag}:hwm and idpool:preloader.
CREATE TABLE IF NOT EXISTS idpool_pool_stats (
    tag   TEXT NOT NULL,
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (tag, field)
);
CREATE TABLE IF NOT EXISTS idpool_high_water (
    tag        TEXT    NOT NULL PRIMARY KEY,
    high_water INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS idpool_leases (
    tag        TEXT NOT NULL PRIMARY KEY,
    owner      TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS idpool_moved (
    tag TEXT NOT NULL PRIMARY KEY
);
-- What Redis keeps in idpool:node:{id}: the cluster view's live nodes.
CREATE TABLE IF NOT EXISTS idpool_nodes (
    node_id TEXT NOT NULL PRIMARY KEY,
    fields  TEXT NOT NULL,  -- JSON object
    seen_at REAL NOT NULL
);
-- Tombstones of removed tags, never deleted: a tag added again starts above max_id.
CREATE TABLE IF NOT EXISTS idpool_removed_tags (
    tag        TEXT    NOT NULL PRIMARY KEY,
    max_id     INTEGER NOT NULL,  -- the removed row's max_id: no ID at or above was claimed
    removed_at REAL    NOT NULL,
    options    TEXT    NOT NULL DEFAULT '',  -- its format: the name added again keeps it
    secret     TEXT    NOT NULL DEFAULT '',  -- its obfuscation key (hex)
    kind       TEXT    NOT NULL DEFAULT ''   -- its kind: the name added again keeps it
);
-- What Redis keeps in idpool:{tag}:format: a formatted tag's fingerprint.
CREATE TABLE IF NOT EXISTS idpool_formats (
    tag         TEXT NOT NULL PRIMARY KEY,
    fingerprint TEXT NOT NULL
);
-- Per-tag tokens, hashed (pool/tokens.py).
CREATE TABLE IF NOT EXISTS idpool_tokens (
    tag        TEXT NOT NULL,
    token_id   TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (tag, token_id)
);
"""

# Columns added since the first release: files made before get them in place.
# SQLite has no ADD COLUMN IF NOT EXISTS; _migrate looks under the write lock.
MIGRATIONS = [
    ("idpool_tags", "end_id", "INTEGER NOT NULL DEFAULT 9223372036854775807"),
    ("idpool_tags", "disabled", "INTEGER NOT NULL DEFAULT 0"),
    ("idpool_tags", "kind", "TEXT NOT NULL DEFAULT 'segment'"),
    ("idpool_tags", "layout", "TEXT NOT NULL DEFAULT ''"),
    ("idpool_tags", "options", "TEXT NOT NULL DEFAULT ''"),
    ("idpool_tags", "secret", "TEXT NOT NULL DEFAULT ''"),
    ("idpool_removed_tags", "options", "TEXT NOT NULL DEFAULT ''"),
    ("idpool_removed_tags", "secret", "TEXT NOT NULL DEFAULT ''"),
    ("idpool_removed_tags", "kind", "TEXT NOT NULL DEFAULT ''"),
]


def _migrate(conn: sqlite3.Connection) -> None:
    # BEGIN IMMEDIATE: two processes opening an old file at once cannot both add.
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, column, definition in MIGRATIONS:
            have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class SqliteFile:
    def __init__(self, path: Path, timeout: float, store: str) -> None:
        self.path = path
        self.timeout = timeout
        self.store = store  # name in StoreUnavailable: "sqlite" or "sqlite_pool"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"idpool-{store}")
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    @classmethod
    async def from_settings(cls, settings: Settings, store: str) -> SqliteFile:
        """The file a ``sqlite:`` IDPOOL_MYSQL_URL names, made unless IDPOOL_CREATE_DATABASE=0."""
        path = settings.sqlite_path()
        if path is None:
            raise ConfigError("IDPOOL_MYSQL_URL does not name a SQLite file (sqlite:///path)")
        return await cls.open(path, settings.store_timeout, store, create=settings.create_database)

    @classmethod
    async def open(cls, path: Path, timeout: float, store: str, *, create: bool) -> SqliteFile:
        """Open (and with ``create``, make) the file and its tables.

        Raises StoreUnavailable naming IDPOOL_MYSQL_URL when the file cannot be opened.
        """
        file = cls(path, timeout, store)
        try:
            await file._in_thread(file._connect, create)
        except (sqlite3.Error, OSError) as e:
            file._executor.shutdown(wait=False)
            raise StoreUnavailable(
                store,
                f"cannot open SQLite file {str(path)!r} (check IDPOOL_MYSQL_URL): "
                f"{type(e).__name__}: {e}",
            ) from e
        return file

    def _connect(self, create: bool) -> None:
        if not create and not self.path.exists():
            raise FileNotFoundError(f"no such file, and IDPOOL_CREATE_DATABASE=0: {self.path}")
        # isolation_level=None: no implicit transactions; each op says BEGIN itself.
        # timeout: how long to wait for another process's write lock (busy timeout).
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # fsync the WAL on every COMMIT
            conn.executescript(SCHEMA)
            _migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    async def write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` as one write transaction (the file's write lock held throughout)."""
        return await self._run(op, "BEGIN IMMEDIATE")

    async def read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` on one consistent snapshot of the file."""
        return await self._run(op, "BEGIN")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._in_thread(self._disconnect)  # after every op already queued
        finally:
            self._executor.shutdown(wait=False)

    def _disconnect(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    async def _run(self, op: Callable[[sqlite3.Connection], T], begin: str) -> T:
        if self._closed:
            raise StoreUnavailable(self.store, "the SQLite file is closed")
        try:
            async with asyncio.timeout(self.timeout):
                return await self._in_thread(self._transaction, op, begin)
        except (sqlite3.Error, OSError, TimeoutError) as e:
            detail = "no answer in time" if isinstance(e, TimeoutError) else f"{e}"
            raise StoreUnavailable(self.store, f"{type(e).__name__}: {detail}") from e

    async def _in_thread(self, fn: Callable[..., T], *args: object) -> T:
        # A cancelled await does not stop the thread: the function runs to its end.
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _transaction(self, op: Callable[[sqlite3.Connection], T], begin: str) -> T:
        conn = self._conn
        if conn is None:
            raise sqlite3.ProgrammingError("the SQLite file is closed")
        conn.execute(begin)
        try:
            result = op(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

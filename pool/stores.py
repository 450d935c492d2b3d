"""Which ledger and pool the settings name, opened; and what the pair can hold.

The protocols they implement are in ``pool/roles.py`` (re-exported here).
``pool/ledger.py`` (MySQL) and ``pool/redis_pool.py`` (Redis) are the production
implementations; ``pool/sqlite_ledger.py`` and ``pool/sqlite_pool.py`` the
embedded mode's (one SQLite file). Which pair is used depends on the scheme of
IDPOOL_MYSQL_URL alone: a node never falls back from one ledger to another, since
two ledgers for one tag would hand out the same IDs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .errors import StoreUnavailable
from .lease_store import LeaseStore
from .ledger import Ledger
from .redis_pool import RedisPool
from .roles import (
    HighWaterMarks,
    LedgerStore,
    PoolStore,
)
from .settings import Settings
from .sqlite_ledger import SqliteLedger
from .sqlite_pool import SqlitePool
from .strict import RedisStrict, SqliteStrict
from .worker_store import WorkerStore

__all__ = [
    "HighWaterMarks",
    "LedgerStore",
    "PoolStore",
    "StoreParts",
    "open_ledger",
    "open_pool",
    "open_stores",
    "parts_of",
    "store_name",
]


async def open_ledger(settings: Settings) -> LedgerStore:
    """The ledger IDPOOL_MYSQL_URL names: MySQL, or a SQLite file for ``sqlite:``.

    Raises StoreUnavailable (naming IDPOOL_MYSQL_URL) when it cannot be opened;
    there is deliberately no fallback to the other kind.
    """
    if settings.embedded:
        return await SqliteLedger.connect(settings)
    return await Ledger.connect(settings)


async def open_pool(settings: Settings, *, check: bool = True) -> PoolStore:
    """The pool that goes with the ledger: Redis, or the embedded ledger's own file.

    With ``check``, raises StoreUnavailable (naming the variable) unless it answers.
    Without, a pool that does not answer is returned as it is (a tag can be added
    with Redis down), but one that answers as the wrong kind of server still raises
    ConfigError (a plain URL at a Cluster node: `tag add` printed "added" and wrote
    nothing to Redis, `tag remove` asked to be run again, forever).
    """
    pool: PoolStore
    if settings.embedded:
        pool = await SqlitePool.open(settings)
    else:
        pool = RedisPool.from_settings(settings)
    try:
        await pool.check()
    except StoreUnavailable:
        if check:
            await pool.close()
            raise
    except BaseException:
        await pool.close()
        raise
    return pool


async def open_stores(settings: Settings) -> tuple[LedgerStore, PoolStore]:
    """Connect the ledger and the pool the settings name; raise StoreUnavailable
    (naming the variable to fix) when either cannot be reached."""
    ledger = await open_ledger(settings)
    try:
        pool = await open_pool(settings)
    except BaseException:
        await ledger.close()
        raise
    return ledger, pool


@dataclass(frozen=True)
class StoreParts:
    """The optional roles of a ledger and pool pair, by what the backends can do:
    a part is None where they cannot hold it (the embedded SQLite mode has no
    Redis: no client leases, no worker IDs, no Redis strict counters). The
    service asks for a part instead of testing a store's class."""

    # snowflake worker IDs, leased in Redis (pool/worker_store.py)
    workers: WorkerStore | None = None
    # client leases, recorded in Redis for their TTL in seconds (pool/lease_store.py)
    leases: Callable[[int], LeaseStore] | None = None
    # strict counters in Redis, refilled from ledger claims (pool/strict.py)
    redis_strict: Callable[[], RedisStrict] | None = None
    # embedded: strict counters in the SQLite ledger's own file (pool/sqlite_strict.py), for
    # the tags of one kind (a take from a row of another is refused)
    file_strict: Callable[[str], SqliteStrict] | None = None


def parts_of(ledger: object, pool: object) -> StoreParts:
    """What the opened pair can hold (StoreParts): the one place that knows which
    backend offers which role. Test doubles of any other class hold none."""
    parts = StoreParts()
    if isinstance(pool, RedisPool):
        redis = pool
        parts = StoreParts(
            workers=WorkerStore(redis.client, redis.keys, redis.send),
            leases=lambda seconds: LeaseStore(
                redis.client, redis.keys, seconds, redis.send, redis.legacy
            ),
            redis_strict=lambda: RedisStrict(redis),
        )
    if isinstance(ledger, SqliteLedger):
        file = ledger.file
        embedded = StoreParts(file_strict=lambda kind: SqliteStrict(file, kind))
        parts = StoreParts(parts.workers, parts.leases, parts.redis_strict, embedded.file_strict)
    return parts


def store_name(store: object, default: str) -> str:
    """What /status, /metrics and 503 messages call a store: "mysql", "redis",
    "sqlite" (embedded ledger), "sqlite_pool" (embedded pool). Stores without a
    ``name`` (test doubles) are called by their role's production name."""
    return str(getattr(store, "name", default))

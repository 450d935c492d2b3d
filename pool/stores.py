"""What the rest of idpool needs from a ledger and from a pool, as protocols.

``pool/ledger.py`` (MySQL) and ``pool/redis_pool.py`` (Redis) are the production
implementations; ``pool/sqlite_ledger.py`` and ``pool/sqlite_pool.py`` the
embedded mode's (one SQLite file). Which pair is used depends on the scheme of
IDPOOL_MYSQL_URL alone: a node never falls back from one ledger to another, since
two ledgers for one tag would hand out the same IDs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .errors import StoreUnavailable
from .kind_rules import KindRules
from .lease_store import LeaseStore
from .ledger import Ledger
from .ranges import IdRange
from .redis_pool import RedisPool
from .settings import Settings
from .sqlite_ledger import SqliteLedger
from .sqlite_pool import SqlitePool
from .tokens import TokenRow
from .values import Moved, PoolSummary, PopResult, PushResult, TagRow
from .worker_store import WorkerStore

if TYPE_CHECKING:  # pool/strict.py reads claims.py, which reads these protocols
    from .strict import RedisStrict, SqliteStrict


class LedgerStore(Protocol):
    async def close(self) -> None: ...

    async def claim(self, tag: str, ranges: int = 1, kind: str = ...) -> IdRange: ...

    async def raise_floor(self, tag: str, floor: int, *, start: bool = False) -> int: ...

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
        end_id: int = ...,
        rules: KindRules = ...,
        layout: str = ...,
        options: str = ...,
        secret: str = ...,
    ) -> TagRow: ...

    async def remove_tag(self, tag: str) -> TagRow: ...

    async def first_made(self, tag: str) -> float | None: ...

    async def removed_format(self, tag: str) -> tuple[str, str] | None: ...

    async def set_disabled(self, tag: str, disabled: bool) -> TagRow: ...

    async def set_step(self, tag: str, step: int) -> TagRow: ...

    async def adapt_step(self, tag: str, step: int) -> int: ...

    async def ping(self) -> None: ...

    async def get_tag(self, tag: str) -> TagRow: ...

    async def list_tags(self, names: Sequence[str] | None = None) -> list[TagRow]: ...

    async def add_token(self, tag: str, token_id: str, token_hash: str) -> TokenRow: ...

    async def list_tokens(self, tag: str | None = None) -> list[TokenRow]: ...

    async def revoke_token(self, tag: str, token_id: str) -> bool: ...


class RangeLists(Protocol):
    """Per tag, the list of ranges ready to serve."""

    async def pop(self, tag: str, ids: int = 1) -> PopResult: ...

    async def push(
        self, tag: str, ranges: Sequence[IdRange], *, head: bool, leader: str = ""
    ) -> PushResult: ...

    async def depth(self, tag: str) -> int: ...

    async def depths(self, tags: Sequence[str]) -> dict[str, int]: ...

    async def ranges(self, tag: str) -> list[IdRange]: ...

    async def summaries(self, tags: Sequence[str]) -> dict[str, PoolSummary]: ...

    async def tags(self) -> list[str]: ...

    async def take_all(self, tag: str) -> list[IdRange]: ...

    async def forget_periods(self, tags: Sequence[str]) -> None: ...


class HighWaterMarks(Protocol):
    """Per tag, the highest range end ever claimed: the fence of every claim."""

    async def high_water(self, tag: str) -> int: ...

    async def high_water_to_claim(self, tag: str) -> int:
        """The mark, read right before a claim: also raises TooFewReplicas when a
        raise could not count now, so nothing is claimed (and wasted) in vain."""
        ...

    async def raise_high_water(self, tag: str, value: int) -> int: ...

    async def fence_format(self, tag: str, fingerprint: str, *, serving: bool = ...) -> str: ...

    async def unfence_format(self, tag: str, fingerprint: str) -> None: ...

    async def fence_strict(self, tag: str, floor: int) -> int:
        """Before a strict tag's row is made: its name's strict sequence starts
        again, above ``floor`` (a no-op where strict takes are the ledger's own)."""
        ...


class SizingStats(Protocol):
    """What nodes report and the preloader sizes the lists by; the cluster totals."""

    async def report_issued(self, counts: Mapping[str, int]) -> None: ...

    async def take_moved(self) -> Moved: ...

    async def report_lifetime(self, tag: str, ids: int, seconds: float) -> None: ...

    async def take_lifetime(self, tag: str) -> tuple[int, float] | None: ...

    async def read_stats(self, tag: str) -> dict[str, str]: ...

    async def write_stats(self, tag: str, fields: dict[str, str]) -> None: ...

    async def write_stats_many(self, figures: Mapping[str, dict[str, str]]) -> None: ...

    async def add_stats(self, increments: Mapping[str, Mapping[str, int]]) -> None: ...


class NodeRegistry(Protocol):
    """The live nodes of the cluster view: heartbeats with a TTL."""

    async def heartbeat(self, node_id: str, fields: Mapping[str, str], ttl: float) -> None: ...

    async def leave(self, node_id: str) -> None: ...

    async def live_nodes(self, ttl: float) -> list[dict[str, str]]: ...


class PreloaderLeadership(Protocol):
    """Which preloader fills the lists: one leader at a time, by expiring lease."""

    async def lead(self, owner: str, seconds: float) -> bool: ...

    async def resign(self, owner: str) -> None: ...


class PoolStore(
    RangeLists, HighWaterMarks, SizingStats, NodeRegistry, PreloaderLeadership, Protocol
):
    """Everything a pool offers (Redis, or the embedded SQLite pool), by role above."""

    async def close(self) -> None: ...

    async def check(self) -> None: ...


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
    Redis: no client leases, no worker IDs, no Redis strict sequences). The
    service asks for a part instead of testing a store's class."""

    # snowflake worker IDs, leased in Redis (pool/worker_store.py)
    workers: WorkerStore | None = None
    # client leases, recorded in Redis for their TTL in seconds (pool/lease_store.py)
    leases: Callable[[int], LeaseStore] | None = None
    # strict sequences in Redis, refilled from ledger claims (pool/strict.py)
    redis_strict: Callable[[], RedisStrict] | None = None
    # embedded: strict sequences in the SQLite ledger's own file (pool/strict.py), for
    # the tags of one kind (a take from a row of another is refused)
    file_strict: Callable[[str], SqliteStrict] | None = None


def parts_of(ledger: object, pool: object) -> StoreParts:
    """What the opened pair can hold (StoreParts): the one place that knows which
    backend offers which role. Test doubles of any other class hold none."""
    from .strict import RedisStrict, SqliteStrict  # here: strict.py reads claims.py

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

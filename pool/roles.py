"""What the rest of idpool needs from a ledger and from a pool, as protocols by role.

``pool/ledger.py`` (MySQL) and ``pool/redis_pool.py`` (Redis) are the production
implementations; ``pool/sqlite_ledger.py`` and ``pool/sqlite_pool.py`` the
embedded mode's (one SQLite file). Which pair is used depends on the scheme of
IDPOOL_MYSQL_URL alone: a node never falls back from one ledger to another, since
two ledgers for one tag would hand out the same IDs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from .kind_rules import KindRules
from .ranges import IdRange
from .tokens import TokenRow
from .values import Moved, PoolSummary, PopResult, PushResult, TagRow


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

    async def fence_state(self, tag: str, floor: int) -> int:
        """Before the row of a tag whose kind's rules say ``fences_state`` (strict) is
        made: its name's counter starts again, above ``floor`` (a no-op where the
        counter is the ledger's own)."""
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

"""The Redis pool's sizing figures (``SizingStats``): what nodes report, what the preloader reads.

Per tag a stats hash (``issued``, the last range lifetime, the preloader's
figures, running totals) and one moved set of the tags to look at next tick.
Lost reports only undercount; a read-and-clear is one script, never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from .ranges import tagged_ranges
from .redis_base import Lua
from .redis_incarnation import RedisIncarnations
from .values import Moved

# KEYS[1] = moved set. Read and empty it in one step: a tag added meanwhile is
# either read now or left for the next tick, never lost.
_TAKE_MOVED = """
local tags = redis.call('SMEMBERS', KEYS[1])
redis.call('DEL', KEYS[1])
return tags
"""

# KEYS[1] = stats hash. Read and clear the last lifetime: one observation, one decision.
_TAKE_LIFETIME = """
local seen = redis.call('HMGET', KEYS[1], 'lifetime_ids', 'lifetime_s')
redis.call('HDEL', KEYS[1], 'lifetime_ids', 'lifetime_s')
return seen
"""


class RedisStats(RedisIncarnations):
    """Issued counts, the moved set, range lifetimes and each tag's figures."""

    _take_moved = Lua.of(_TAKE_MOVED)
    _take_lifetime = Lua.of(_TAKE_LIFETIME)

    async def report_issued(self, counts: Mapping[str, int]) -> None:
        """Add IDs a node handed out to each tag's ``issued`` count (the consumption
        signal), and mark the tags moved: one round trip for all of them."""
        if not counts:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for tag, ids in counts.items():
                pipe.hincrby(self.keys.stats(tag), "issued", ids)
            pipe.sadd(self.keys.moved, *counts)
            await self._plain(pipe.execute())

    async def take_moved(self) -> Moved:
        """The tags that moved since the last call (read and emptied at once)."""
        if self._moved_task is not None and not self._moved_task.done():
            # this process's own marks first (they are sent apart from the pops)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._moved_task), self._slot_wait)
        tags = await self._call(self._take_moved, [self.keys.moved], [])
        return Moved(sorted(tags), tagged_ranges(await self._clean_new_incarnations()))

    async def report_lifetime(self, tag: str, ids: int, seconds: float) -> None:
        """A node finished a range of ``ids`` IDs that it served for ``seconds``."""
        mapping: dict[Any, Any] = {"lifetime_ids": ids, "lifetime_s": f"{seconds:.3f}"}
        await self._plain(self.client.hset(self.keys.stats(tag), mapping=mapping))

    async def read_stats(self, tag: str) -> dict[str, str]:
        return dict(await self._plain(self.client.hgetall(self.keys.stats(tag))))

    async def write_stats(self, tag: str, fields: dict[str, str]) -> None:
        await self.write_stats_many({tag: fields})

    async def write_stats_many(self, figures: Mapping[str, dict[str, str]]) -> None:
        """HSET each tag's figures, all in one round trip."""
        if not figures:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for tag, fields in figures.items():
                mapping: dict[Any, Any] = dict(fields)
                pipe.hset(self.keys.stats(tag), mapping=mapping)
            await self._plain(pipe.execute())

    async def add_stats(self, increments: Mapping[str, Mapping[str, int]]) -> None:
        """HINCRBY each tag's running totals (``returned``, ``wasted:{reason}``):
        one round trip. Never retried by callers: a lost one only undercounts."""
        if not increments:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for tag, fields in increments.items():
                for name, n in fields.items():
                    pipe.hincrby(self.keys.stats(tag), name, n)
            await self._plain(pipe.execute())

    async def take_lifetime(self, tag: str) -> tuple[int, float] | None:
        """Read and clear the last reported range lifetime: one observation, one decision."""
        ids, seconds = await self._call(self._take_lifetime, [self.keys.stats(tag)], [])
        if ids is None or seconds is None:
            return None
        return int(ids), float(seconds)

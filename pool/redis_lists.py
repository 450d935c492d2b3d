"""The Redis pool's ranges: per tag, the list of ranges ready to serve (``RangeLists``).

A pop takes head ranges, a push appends fresh ranges or returns remainders to
the head, each one Lua script over the tag's keys after its incarnation check
(``pool/redis_incarnation.py``): atomic on the server, run at most once (an
error means "maybe popped", "maybe pushed": the range is lost, never served twice).
"""

from __future__ import annotations

from collections.abc import Sequence

from .ranges import IdRange, tagged_ranges
from .redis_base import Lua
from .redis_incarnation import PRELUDE, RedisIncarnations
from .values import MAX_POP_RANGES, PoolSummary, PopResult, PushResult, summary

# KEYS[1] = the tag's clean marker, KEYS[2] = pool list, KEYS[3] = stats hash,
# KEYS[4] = the old layout's list (single Redis only); ARGV[1] = tag, ARGV[2] =
# the old layout's clean-marker prefix, ARGV[3] = IDs wanted, ARGV[4] = most
# ranges to take. Takes head ranges until they hold the IDs wanted (at least one
# range): a batch larger than a range is one call, not one per range.
# Returns {dropped, ranges taken, depth after the pop, target depth or false}.
_POP = (
    PRELUDE
    + """
local dropped = ensure_clean(KEYS[1], KEYS[2], ARGV[1], KEYS[4], ARGV[2])
local want, most, got, taken = tonumber(ARGV[3]), tonumber(ARGV[4]), 0, {}
repeat
  local range = redis.call('LPOP', KEYS[2])
  if not range then break end
  taken[#taken + 1] = range
  -- doubles: exact below 2^53, and only decides when to stop, never what is served
  local first, last = string.match(range, '(%d+)-(%d+)')
  got = got + tonumber(last) - tonumber(first) + 1
until got >= want or #taken >= most
return {dropped, taken, redis.call('LLEN', KEYS[2]), redis.call('HGET', KEYS[3], 'target_depth')}
"""
)

# KEYS[1] = clean marker, KEYS[2] = pool list, KEYS[3] = the preloader leadership and
# KEYS[4] = the old list (single Redis only); ARGV[1] = tag, ARGV[2] = old clean
# prefix, ARGV[3] = 'head' or 'tail', ARGV[4] = the pushing preloader's id to check
# here ('' for a node, and on a cluster, where the lease is in another slot: checked
# just before, see push()), ARGV[5..] = ranges in the order they should be served.
# Returns {dropped, new length, or -1: lease not held}.
_PUSH = (
    PRELUDE
    + """
local dropped = ensure_clean(KEYS[1], KEYS[2], ARGV[1], KEYS[4], ARGV[2])
-- A preloader frozen past its lease (SIGSTOP, swap) must not push what it claimed
-- while the new holder fills the same list: its push counts only while it holds it.
if ARGV[4] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[4] then return {dropped, -1} end
local n = 0
if ARGV[3] == 'head' then
  for i = #ARGV, 5, -1 do n = redis.call('LPUSH', KEYS[2], ARGV[i]) end
else
  for i = 5, #ARGV do n = redis.call('RPUSH', KEYS[2], ARGV[i]) end
end
return {dropped, n}
"""
)

# KEYS = the tag's list (and the old layout's). Read and delete in one step: a
# pop or push between the read and the delete would otherwise be lost from the
# answer (a pushed range deleted unread) or counted twice.
_TAKE_ALL = """
local taken = {}
for i = 1, #KEYS do
  for _, r in ipairs(redis.call('LRANGE', KEYS[i], 0, -1)) do taken[#taken + 1] = r end
  redis.call('DEL', KEYS[i])
end
return taken
"""


class RedisLists(RedisIncarnations):
    """Pop, push, read and drain each tag's list."""

    _pop = Lua.of(_POP)
    _push = Lua.of(_PUSH)
    _take_all = Lua.of(_TAKE_ALL)

    async def pop(self, tag: str, ids: int = 1) -> PopResult:
        """Take head ranges holding at least ``ids`` IDs (at least one range), or
        none when the list is empty.

        On an error the pop may have happened: whatever it took is lost, never
        handed out; the caller just fetches elsewhere.
        """
        keys, old, args = self._tag_args(tag)
        keys += [self.keys.stats(tag), *old]
        args += [str(ids), str(MAX_POP_RANGES)]
        dropped, texts, depth, target = await self._call(self._pop, keys, args)
        # The active preloader looks at the tag on its next tick (a hint, sent apart:
        # the moved set is on another shard of a cluster).
        self._mark_moved(tag)
        taken = [IdRange.from_text(t) for t in texts]
        return PopResult(taken, tagged_ranges(dropped), int(depth), int(target or 0))

    async def push(
        self, tag: str, ranges: Sequence[IdRange], *, head: bool, leader: str = ""
    ) -> PushResult:
        """Append fresh ranges (tail) or return remainders (head), in serving order.
        With ``leader`` (a preloader's id), only while it holds the preloader leadership:
        otherwise nothing is pushed and the result says ``lease_lost``.

        Called once per batch; never retried (an error means "maybe pushed").
        """
        keys, old, args = self._tag_args(tag)
        if self.clustered:
            # The lease key is in another slot than the tag's keys: a script cannot
            # read both on a cluster. Read right before the push instead: a preloader
            # frozen between the two still pushes, ranges it claimed with the mark
            # (waste, never a duplicate; docs/design/failovers.md, "Redis Cluster").
            if leader and await self._plain(self.client.get(self.keys.preloader)) != leader:
                return PushResult(0, [], lease_lost=True)
            leader = ""
        else:
            keys.append(self.keys.preloader)
        args += ["head" if head else "tail", leader, *(r.to_text() for r in ranges)]
        dropped, depth = await self._call(self._push, keys + old, args)
        if int(depth) < 0:
            return PushResult(0, tagged_ranges(dropped), lease_lost=True)
        return PushResult(int(depth), tagged_ranges(dropped))

    async def depth(self, tag: str) -> int:
        return int(await self._plain(self.client.llen(self.keys.pool(tag))))

    async def depths(self, tags: Sequence[str]) -> dict[str, int]:
        """Each list's depth: one LLEN per tag, in one round trip."""
        if not tags:
            return {}
        async with self.client.pipeline(transaction=False) as pipe:
            for tag in tags:
                pipe.llen(self.keys.pool(tag))
            replies = await self._plain(pipe.execute())
        return {tag: int(n) for tag, n in zip(tags, replies, strict=True)}

    async def ranges(self, tag: str) -> list[IdRange]:
        texts = await self._plain(self.client.lrange(self.keys.pool(tag), 0, -1))
        return [IdRange.from_text(t) for t in texts]

    async def summaries(self, tags: Sequence[str]) -> dict[str, PoolSummary]:
        """Depth, head range and stats of each tag's list: three O(1) reads per
        tag, in one round trip (never the whole list, however deep)."""
        if not tags:
            return {}
        async with self.client.pipeline(transaction=False) as pipe:
            for tag in tags:
                pipe.llen(self.keys.pool(tag))
                pipe.lindex(self.keys.pool(tag), 0)
                pipe.hgetall(self.keys.stats(tag))
            replies = await self._plain(pipe.execute())
        found = {}
        for i, tag in enumerate(tags):
            depth, head_text, stats = replies[3 * i : 3 * i + 3]
            found[tag] = summary(int(depth), head_text, dict(stats))
        return found

    async def tags(self) -> list[str]:
        """Tags that have a list (a SCAN: for inspection, never on a hot path)."""
        head, tail = len(self.keys.tag_prefix) + 1, len("}:pool")
        found = {key[head:-tail] for key in await self._plain(self._scan(self.keys.pool("*")))}
        if self.legacy is not None:
            found.update(await self._plain(self.client.smembers(self.legacy.pools)))
        return sorted(found)

    async def take_all(self, tag: str) -> list[IdRange]:
        """Remove every ready range of ``tag`` and return them (a disabled tag's
        list). On an error they may or may not be gone: the caller calls again."""
        keys = [self.keys.pool(tag)] + ([] if self.legacy is None else [self.legacy.pool(tag)])
        texts = await self._call(self._take_all, keys, [])
        return [IdRange.from_text(t) for t in texts]

    async def forget_periods(self, tags: Sequence[str]) -> None:
        """Delete the ``:stats`` and ``:clean`` keys of period rows that ended (their
        lists were emptied by take_all); their ``:hwm`` stays, with the ledger row."""
        if not tags:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for tag in tags:
                pipe.delete(self.keys.stats(tag))
                pipe.delete(self.keys.clean(tag))
            await self._plain(pipe.execute())

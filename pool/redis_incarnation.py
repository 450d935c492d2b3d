"""The incarnation check of the Redis pool: a tag's list holds only ranges of this server.

Every script that touches a pool list first checks that the tag's keys belong
to the server's current *incarnation* (see ``PRELUDE``), so a Redis that
restarted from an old snapshot, or a replica promoted with missing writes, can
never hand out a range that was already popped. ``RedisIncarnations`` also
cleans, once per new incarnation of each server, every list no script touched
yet (``_clean_new_incarnations``, from the preloader's tick).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from .cluster import Client
from .keys import Keys
from .redis_base import Lua, RedisCore

# The Redis incarnation, computed on the server inside the script that relies on
# it: `run_id` changes on every start, `master_replid` on every promotion.
INCARNATION_LUA = """
local function incarnation()
  local server = redis.call('INFO', 'server')
  local repl = redis.call('INFO', 'replication')
  return string.match(server, 'run_id:(%w+)') .. ':' .. string.match(repl, 'master_replid:(%w+)')
end
"""

# Shared head of the pool scripts: the incarnation check, per tag.
PRELUDE = (
    INCARNATION_LUA
    + """
-- The tag's list may hold only ranges pushed on this incarnation. The first
-- script of the tag here (restart, failover, restore) drops what an older one
-- left, unread: those ranges may have been popped before the data was lost.
-- On a single Redis it also takes in the old layout's list (an upgrade):
-- whole when the old layout cleaned this incarnation too, else dropped.
local function ensure_clean(marker, list, tag, old_list, old_clean)
  local here = incarnation()
  local dropped = {}
  if redis.call('GET', marker) ~= here then
    for _, r in ipairs(redis.call('LRANGE', list, 0, -1)) do
      dropped[#dropped + 1] = tag .. '=' .. r
    end
    redis.call('DEL', list)
    redis.call('SET', marker, here)
  end
  if old_list and redis.call('EXISTS', old_list) == 1 then
    local ranges = redis.call('LRANGE', old_list, 0, -1)
    redis.call('DEL', old_list)
    if redis.call('EXISTS', old_clean .. here) == 1 then
      for i = #ranges, 1, -1 do redis.call('LPUSH', list, ranges[i]) end
    else
      for _, r in ipairs(ranges) do dropped[#dropped + 1] = tag .. '=' .. r end
    end
  end
  return dropped
end
"""
)

# KEYS as the push's (pool/redis_lists.py); ARGV[1] = tag, ARGV[2] = old clean prefix. Only the
# incarnation check: a tag's list cleaned without popping or pushing.
_TOUCH = (
    PRELUDE
    + """
return ensure_clean(KEYS[1], KEYS[2], ARGV[1], KEYS[3], ARGV[2])
"""
)

# The server's incarnation, as the prelude computes it.
_INCARNATION = PRELUDE + "\nreturn incarnation()\n"


class RedisIncarnations(RedisCore):
    """The prelude's keys of a tag, and the cleaning of a new incarnation's lists."""

    _touch = Lua.of(_TOUCH)
    _incarnation = Lua.of(_INCARNATION)

    def __init__(
        self, client: Client, keys: Keys, slot_wait: float = 2.0, mark_replicas: int = 0
    ) -> None:
        super().__init__(client, keys, slot_wait, mark_replicas)
        self._seen: dict[str, str] = {}  # server -> incarnation whose lists this process cleaned

    def _tag_args(self, tag: str) -> tuple[list[str], list[str], list[str]]:
        """The prelude's keys: clean marker, list; the old list (single Redis); and
        the old clean-marker prefix ('' on a cluster)."""
        keys = [self.keys.clean(tag), self.keys.pool(tag)]
        if self.legacy is None:
            return keys, [], [tag, ""]
        return keys, [self.legacy.pool(tag)], [tag, self.legacy.clean_prefix]

    async def _clean_new_incarnations(self) -> list[str]:
        """Clean every list of a server that is a new incarnation since the last
        look (a restart, a failover; any server at the first look): nodes may live
        on their reserve for a while, and a list not cleaned yet would read as full.

        One small script per primary each tick; a SCAN of the server's lists and
        a GET of each one's marker only when its incarnation changed."""
        dropped: list[str] = []
        servers: list[Any] = (
            self.client.get_primaries() if isinstance(self.client, RedisCluster) else [None]
        )
        for server in servers:
            name = "" if server is None else server.name
            here = str(await self._plain(self._incarnation_of(server)))
            if self._seen.get(name) == here:
                continue
            dropped += await self._clean_server(server, here)
            self._seen[name] = here
        return dropped

    async def _incarnation_of(self, server: Any) -> Any:
        """The incarnation script on one server (by SHA; its text only after NOSCRIPT)."""
        options: dict[str, Any] = {} if server is None else {"target_nodes": server}
        script = self._incarnation
        try:
            return await self.client.execute_command("EVALSHA", script.sha, 0, **options)
        except NoScriptError:
            return await self.client.execute_command("EVAL", script.text, 0, **options)

    async def _clean_server(self, server: Any, here: str) -> list[str]:
        head, tail = len(self.keys.tag_prefix) + 1, len("}:pool")
        lists = await self._plain(self._scan(self.keys.pool("*"), server))
        tags = {key[head : len(key) - tail] for key in lists}
        old_tags: set[str] = set()
        if self.legacy is not None:  # the old layout's lists move in when touched
            start = len(self.legacy.pool(""))
            old_tags = {key[start:] for key in await self._plain(self._scan(self.legacy.pool("*")))}
        dropped: list[str] = []
        ordered = sorted(tags | old_tags)
        for first in range(0, len(ordered), 500):
            chunk = ordered[first : first + 500]
            async with self.client.pipeline(transaction=False) as pipe:
                for tag in chunk:
                    pipe.get(self.keys.clean(tag))
                markers = await self._plain(pipe.execute())
            for tag, marker in zip(chunk, markers, strict=True):
                if marker != here or tag in old_tags:
                    keys, old, args = self._tag_args(tag)
                    dropped += await self._call(self._touch, keys + old, args)
        return dropped

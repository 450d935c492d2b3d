"""The Redis pool's preloader leadership (``PreloaderLeadership``): one leader at a time.

The leadership is one key holding the leader's id, with an expiry: taken when
free, renewed only by its holder, deleted only by its holder. A preloader's push
checks that it still holds it (``pool/redis_lists.py``: in the push's script on a
single Redis, right before it on a cluster).
"""

from __future__ import annotations

from .redis_base import Lua, RedisCore

# KEYS[1] = preloader leadership; ARGV[1] = owner, ARGV[2] = ms. Take it, or renew our own.
_LEAD = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS[1] = preloader leadership; ARGV[1] = owner. Delete only our own leadership.
_RESIGN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisLeadership(RedisCore):
    """Lead (take or renew the lease) and resign."""

    _lead = Lua.of(_LEAD)
    _resign = Lua.of(_RESIGN)

    async def lead(self, owner: str, seconds: float) -> bool:
        """Become (or stay) the one active preloader for ``seconds``; False when
        another holds the lease."""
        ms = str(max(1, int(seconds * 1000)))
        return bool(await self._call(self._lead, [self.keys.preloader], [owner, ms]))

    async def resign(self, owner: str) -> None:
        await self._call(self._resign, [self.keys.preloader], [owner])

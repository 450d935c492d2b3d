"""The shared pool: one Redis list of ready ranges per tag.

Every read-modify-write is a Lua script over the keys of one tag (one slot, so
one shard of a Redis Cluster), so it is atomic on the server. Every script that
touches a pool list first checks that the tag's keys belong to the server's
current *incarnation* (see ``PRELUDE``), so a Redis that restarted from an old
snapshot, or a replica promoted with missing writes, can never hand out a range
that was already popped. The same code runs on a single Redis, behind Sentinel,
and on a Redis Cluster (``pool/cluster.py``). Every command runs at most once
(``pool/redis_base.py``).

``RedisPool`` is the five roles of ``pool/roles.py``, one module each, each with
its own scripts: ``RedisLists`` (``pool/redis_lists.py``), ``RedisMarks``
(``redis_marks.py``), ``RedisStats`` (``redis_stats.py``), ``RedisNodes``
(``redis_nodes.py``), ``RedisLeadership`` (``redis_leadership.py``), over the
shared ``RedisCore`` (``redis_base.py``: the client, the call runner) and the
incarnation check (``redis_incarnation.py``). ``Lua``, ``make_client`` and
``MAX_CONNECTIONS`` stay importable from here.
"""

from __future__ import annotations

from .keys import Keys
from .redis_base import MAX_CONNECTIONS, Lua, make_client
from .redis_leadership import RedisLeadership
from .redis_lists import RedisLists
from .redis_marks import RedisMarks
from .redis_nodes import RedisNodes
from .redis_stats import RedisStats
from .settings import Settings

__all__ = ["MAX_CONNECTIONS", "Lua", "RedisPool", "make_client"]


class RedisPool(RedisLists, RedisMarks, RedisStats, RedisNodes, RedisLeadership):
    """Everything a pool offers (``pool/roles.py``'s ``PoolStore``), on Redis."""

    name = "redis"  # in /status, /metrics and 503 messages

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisPool:
        return cls(
            make_client(settings),
            Keys(settings.redis_prefix),
            settings.store_timeout,
            settings.redis_mark_replicas,
        )

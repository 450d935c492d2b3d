"""Every Redis key idpool uses, built in one place.

One layout for a single Redis (plain or behind Sentinel) and for a Redis
Cluster. A tag's keys share the *hash tag* ``{tag}`` (the braces are part of the
name), so they live in one slot, on one shard, and every script touches the keys
of that one slot. Each shard fails over on its own, so each tag carries its own
incarnation marker: a failover or restart of one shard is detected, and fenced,
for the tags on that shard alone.

With the default prefix ``idpool`` and the tag ``orders``:

``idpool:{orders}:pool``  LIST of ranges as ``"first-last"`` text, inclusive.
    The preloader RPUSHes fresh ranges at the tail; a stopping node LPUSHes its
    unused remainders at the head; nodes LPOP whole ranges from the head.
    ``redis-cli -c LRANGE 'idpool:{orders}:pool' 0 -1`` shows what is ready. A
    tag with a reset (ID formats) has one per period, named after the period's
    ledger row: ``idpool:{orders@20261124}:pool`` (and so ``:hwm``, ``:stats``).

``idpool:{orders}:clean``  STRING ``run_id:master_replid``: the incarnation of
    the server that last cleaned this tag's list. Every pool script of the tag
    compares it with the incarnation it runs on first; when they differ (a
    restart, a failover, a restore) it drops the list unread and writes its own.
    No snapshot or replica of an older incarnation can hold the new value.

``idpool:{orders}:hwm``  STRING, the highest ledger ``max_id`` any process has
    claimed up to (the high-water mark). Raised, never lowered, by whoever claims
    a range from MySQL, before the range is pushed or served; read before every
    claim to refuse ranges from a MySQL that came back older.

``idpool:{orders}:format``  STRING, the fingerprint of a formatted tag's format
    (32 hex of SHA-256 over its options and obfuscation key; never the key).
    Set once, by ``idpool tag add`` (or POST /admin/tags) before the ledger row
    is made, and never deleted: a name added again (after ``tag remove``, or a
    row deleted by hand) with another format, or none, is refused, since it
    could render strings the old tag handed out. A name whose mark shows
    numbers claimed with no fingerprint cannot become formatted. Read again
    by a node before it first serves a formatted tag: a row whose format is
    not the recorded one (edited by hand) is not served; a missing record is
    written from the row. With IDPOOL_REDIS_MARK_REPLICAS it is WAITed for, as
    the mark is.

``idpool:{orders}:strict``  HASH, the sequence of a strict tag: ``next`` (the next
    ID to hand out), ``limit`` (the end of the ledger-claimed IDs behind it, so
    ``[next, limit)`` is ready) and ``inc`` (the Redis incarnation,
    ``run_id:master_replid``, it was set under). Written only by the strict
    scripts (``pool/redis_strict.py``): a take moves ``next`` up by the batch; a refill
    raises ``limit`` with a range it claimed from the ledger, or replaces a state
    of an older incarnation. Read by the same scripts. A state whose ``inc`` is
    not the server's current incarnation is never served from. Also
    ``refill_until`` and ``refill_by`` (the one node granted the next refill,
    until when, in Redis ``TIME`` ms) and ``since_ms``, ``since_next`` (where the
    consumption rate that sizes a refill is measured from), and ``floor``: set when a
    strict tag is made (again) under the name (``RedisPool.fence_state``, which
    drops the rest of the hash first), never lowered; a refill whose claim starts
    below it is refused. Every strict script
    touches this one key: on a cluster it runs on the tag's shard, and the
    incarnation it checks is that shard's.

``idpool:{orders}:stats``  HASH of supply figures. ``issued``: IDs nodes have
    handed out (HINCRBY by nodes every few seconds: the consumption signal);
    ``lifetime_s`` and ``lifetime_ids``: how long the last range a node finished
    lasted, and its size (HSET by nodes, consumed by the preloader's dynamic
    step); ``rate``, ``target_depth``, ``step``: the preloader's latest estimate
    of IDs/s, the depth it fills to, and the step (HSET by the preloader;
    ``target_depth`` is read by the pop script so a node knows when the pool
    runs low); the cluster's running totals ``returned`` and
    ``wasted:{reason}`` (HINCRBY by each node with its report).

``idpool:{R}:leased:{run_id}:{replid}:{lease_id}``  STRING with a TTL
    (``IDPOOL_CLIENT_LEASE_SECONDS``), one range leased to a client library:
    ``"L tag first last end hash"`` while out, then the tombstone
    ``"R tag first last end hash from"`` once its tail was returned; ``hash`` is
    the SHA-256 of the lease's secret, which a return must show (the key's name
    alone returns nothing). ``R`` is a short
    string in the tag's slot, and the lease id ends with it (``<token>-<R>``), so
    a return that names only the lease reaches the tag's shard. Written by a
    node's lease script (SET; it also LPUSHes what was cut off the lease back to
    the tag's list) and its return script (which also LPUSHes the tail); read by
    the return script only. The incarnation in the name means a
    Redis restored from an old snapshot cannot take a lease's return twice.

Keys that are not a tag's (each in a slot of its own; hints and coordination,
never part of the no-duplicate argument: a shard that loses them costs a
tick's work, never an ID):

``idpool:moved``  SET of tags that moved since the active preloader's last
    tick: SADD by nodes after a pop and with their consumption reports; read and
    emptied by the active preloader, which visits only these tags (and, once a
    minute, checks every list's depth).

``idpool:preloader``  STRING with a TTL, the id of the one active preloader.
    Taken with SET NX PX and renewed each tick (and before each claim) by its
    holder; the other preloaders stand by, one SET NX a tick each, and take over
    when it expires. A preloader's push lands only while it holds the leadership:
    read by the push script on a single Redis; on a cluster (another slot than
    the tag's keys) by a GET right before the push.

``idpool:{orders}:workers``  HASH of a snowflake tag's worker IDs
    (``pool/worker_store.py``), in the tag's slot like its other keys: ``inc``
    (the incarnation, ``run_id:master_replid``, of the server its holders were
    granted on: the per-tag check ``:clean`` makes for the list), ``q`` and
    ``f`` (no grant before server ms ``q`` after a new incarnation; the time
    floor of a worker ID never held since), and
    ``w:{n}`` = ``"generation expires_ms last_ms holder hash"`` per worker ID (hash:
    SHA-256 of the lease's secret; see worker_store.py).
    Written and read only by the worker script (grant, renew, release), on
    nodes; ``idpool tag list`` reads how many are held. Each ``w:{n}`` of a held
    lease ends with its TTL in ms (renewals extend by it, whoever sends them).

``idpool:{orders}:worker_lease``  STRING, the largest worker-lease TTL (ms) ever
    granted for the tag on this Redis; only raised, by the grant script, and read
    by it to size a quarantine (a hash deleted alone still knows how long its
    leases ran). A Redis that lost it is covered by the tag's lease in the ledger.

``idpool:nodes``  ZSET of node ids scored by the unix time of their last
    heartbeat (ZADD by each node every ``IDPOOL_REPORT_SECONDS``; entries older
    than the heartbeat TTL are dropped by the next heartbeat). Read by
    ``/status`` and ``idpool status`` for the cluster view.

``idpool:node:{id}``  HASH describing one node (``addr``, ``pid``,
    ``version``, ``started_at``, ``seen_at``, ``draining``, ``ready``, ``tags``),
    with a TTL a few heartbeats long: a node that died drops out by itself.

The layout before issue 22 (``idpool:pool:{tag}``, ``idpool:hwm:{tag}``,
``idpool:stats:{tag}``, ``idpool:pools``, ``idpool:clean:{run_id}:{replid}``,
``idpool:incarnation``, ``idpool:leased:{run_id}:{replid}:{lease_id}``) is read
on a single Redis only, to upgrade a running deployment (``Legacy`` below and
"Upgrading the key layout" in docs/design/upgrades.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from redis.crc import key_slot


@dataclass(frozen=True)
class Keys:
    prefix: str = "idpool"

    def _of(self, tag: str, what: str) -> str:
        return f"{self.prefix}:{{{tag}}}:{what}"

    def pool(self, tag: str) -> str:
        return self._of(tag, "pool")

    def clean(self, tag: str) -> str:
        return self._of(tag, "clean")

    def hwm(self, tag: str) -> str:
        return self._of(tag, "hwm")

    def format(self, tag: str) -> str:
        return self._of(tag, "format")

    def strict(self, tag: str) -> str:
        return self._of(tag, "strict")

    def stats(self, tag: str) -> str:
        return self._of(tag, "stats")

    @property
    def tag_prefix(self) -> str:
        """A tag's keys are this, then ``{tag}:`` and the key's role (built in Lua)."""
        return f"{self.prefix}:"

    def lease_route(self, route: str) -> str:
        """The key that takes a lease script to the tag's shard (never written)."""
        return self._of(route, "leased")

    def leased_prefix(self, route: str) -> str:
        """Lease records are this, then ``{run_id}:{replid}:{lease_id}`` (built in Lua)."""
        return self._of(route, "leased:")

    def leased(self, route: str, incarnation: str, lease_id: str) -> str:
        return f"{self.leased_prefix(route)}{incarnation}:{lease_id}"

    @property
    def moved(self) -> str:
        return f"{self.prefix}:moved"

    @property
    def preloader(self) -> str:
        return f"{self.prefix}:preloader"

    def workers(self, tag: str) -> str:
        return self._of(tag, "workers")

    def worker_lease(self, tag: str) -> str:
        return self._of(tag, "worker_lease")

    @property
    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    def node(self, node_id: str) -> str:
        return f"{self.prefix}:node:{node_id}"


@dataclass(frozen=True)
class Legacy:
    """The layout before issue 22, read on a single Redis to upgrade in place."""

    prefix: str = "idpool"

    def pool(self, tag: str) -> str:
        return f"{self.prefix}:pool:{tag}"

    def hwm(self, tag: str) -> str:
        return f"{self.prefix}:hwm:{tag}"

    @property
    def pools(self) -> str:
        return f"{self.prefix}:pools"

    @property
    def clean_prefix(self) -> str:
        return f"{self.prefix}:clean:"

    @property
    def leased_prefix(self) -> str:
        return f"{self.prefix}:leased:"


# A lease id is a 22-character token, "-", then the route: a short string whose
# slot is the tag's (ids without one are the old layout's).
TOKEN_CHARS = 22


@lru_cache(maxsize=16384)
def slot_route(slot: int) -> str:
    """The shortest decimal string in ``slot`` (about 16,000 CRCs, once per slot)."""
    n = 0
    while key_slot(str(n).encode()) != slot:
        n += 1
    return str(n)


def route_of(tag: str) -> str:
    return slot_route(key_slot(tag.encode()))


def lease_route(lease_id: str) -> str | None:
    """The route a lease id ends with, or None for an id of the old layout."""
    if len(lease_id) > TOKEN_CHARS + 1 and lease_id[TOKEN_CHARS] == "-":
        route = lease_id[TOKEN_CHARS + 1 :]
        if route.isdigit():
            return route
    return None

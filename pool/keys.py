"""Every Redis key idpool uses, built in one place.

With the default prefix ``idpool``:

``idpool:pool:{tag}``  LIST of ranges as ``"first-last"`` text, inclusive.
    The preloader RPUSHes fresh ranges at the tail; a stopping node LPUSHes its
    unused remainders at the head; nodes LPOP whole ranges from the head.
    ``redis-cli LRANGE idpool:pool:orders 0 -1`` shows what is ready. A tag
    with a reset (ID formats) has one per period, named after the period's
    ledger row: ``idpool:pool:orders@20261124`` (and so ``hwm:``, ``stats:``).

``idpool:pools``  SET of tags that have a pool list. Written by every push,
    read when a new Redis incarnation is cleaned and by ``idpool pool show``.

``idpool:hwm:{tag}``  STRING, the highest ledger ``max_id`` any process has
    claimed up to (the high-water mark). Raised, never lowered, by whoever claims
    a range from MySQL, before the range is pushed or served; read before every
    claim to refuse ranges from a MySQL that came back older.

``idpool:stats:{tag}``  HASH of supply figures. ``issued``: IDs nodes have
    handed out (HINCRBY by nodes every few seconds: the consumption signal);
    ``lifetime_s`` and ``lifetime_ids``: how long the last range a node finished
    lasted, and its size (HSET by nodes, consumed by the preloader's dynamic
    step); ``rate``, ``target_depth``, ``step``: the preloader's latest estimate
    of IDs/s, the depth it fills to, and the step (HSET by the preloader;
    ``target_depth`` is read by the pop script so a node knows when the pool
    runs low).

``idpool:moved``  SET of tags that moved since the active preloader's last
    tick: SADD by the pop script and by nodes' consumption reports; read and
    emptied by the active preloader, which visits only these tags (and, once a
    minute, checks every list's depth).

``idpool:preloader``  STRING with a TTL, the id of the one active preloader.
    Taken with SET NX PX and renewed each tick (and before each claim) by its
    holder; the other preloaders stand by, one SET NX a tick each, and take over
    when it expires. Read by the push script: a preloader's push lands only
    while it holds the lease.

``idpool:clean:{run_id}:{replid}``  STRING, present once the Redis incarnation
    with that ``run_id`` (changes on every restart) and ``master_replid`` (changes
    on every failover) has had its pool lists flushed. Every pool script checks it
    first; no snapshot of an older incarnation can contain it.

``idpool:incarnation``  STRING, the name of the current clean marker, so the
    next incarnation can delete the old one.

``idpool:leased:{run_id}:{replid}:{lease_id}``  STRING with a TTL
    (``IDPOOL_CLIENT_LEASE_SECONDS``), one range leased to a client library:
    ``"L tag first last end hash"`` while out, then the tombstone
    ``"R tag first last end hash from"`` once its tail was returned; ``hash`` is
    the SHA-256 of the lease's secret, which a return must show (the key's name
    alone returns nothing). Written by a
    node's lease script (SET) and its return script (which also LPUSHes the tail);
    read by the return script only. The incarnation in the name means a Redis
    restored from an old snapshot cannot take a lease's return twice.

``idpool:workers:{tag}``  HASH of a snowflake tag's worker IDs
    (``pool/worker_store.py``): ``inc`` (the Redis incarnation its holders
    belong to), ``q`` and ``f`` (no grant before server ms ``q`` after a new
    incarnation; the time floor of a worker ID never held since), and
    ``w:{n}`` = ``"generation expires_ms last_ms holder"`` per worker ID.
    Written and read only by the worker script (grant, renew, release), on
    nodes; ``idpool tag list`` reads how many are held.

``idpool:nodes``  ZSET of node ids scored by the unix time of their last
    heartbeat (ZADD by each node every ``IDPOOL_REPORT_SECONDS``; entries older
    than the heartbeat TTL are dropped by the next heartbeat). Read by
    ``/status`` and ``idpool status`` for the cluster view.

``idpool:node:{id}``  HASH describing one node (``addr``, ``pid``,
    ``version``, ``started_at``, ``seen_at``, ``draining``, ``ready``, ``tags``),
    with a TTL a few heartbeats long: a node that died drops out by itself.

The ``idpool:stats:{tag}`` hash also carries the cluster's running totals,
HINCRBY by each node with its report: ``returned`` (IDs given back to the
pool by stopping nodes) and ``wasted:{reason}`` (IDs given up, by reason).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "idpool"

    def pool(self, tag: str) -> str:
        return f"{self.prefix}:pool:{tag}"

    @property
    def pools(self) -> str:
        return f"{self.prefix}:pools"

    def hwm(self, tag: str) -> str:
        return f"{self.prefix}:hwm:{tag}"

    def stats(self, tag: str) -> str:
        return f"{self.prefix}:stats:{tag}"

    @property
    def moved(self) -> str:
        return f"{self.prefix}:moved"

    @property
    def preloader(self) -> str:
        return f"{self.prefix}:preloader"

    @property
    def clean_prefix(self) -> str:
        return f"{self.prefix}:clean:"

    @property
    def incarnation(self) -> str:
        return f"{self.prefix}:incarnation"

    @property
    def leased_prefix(self) -> str:
        """Lease records are this, then ``{run_id}:{replid}:{lease_id}`` (built in Lua)."""
        return f"{self.prefix}:leased:"

    def leased(self, incarnation: str, lease_id: str) -> str:
        return f"{self.leased_prefix}{incarnation}:{lease_id}"

    def workers(self, tag: str) -> str:
        return f"{self.prefix}:workers:{tag}"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    def node(self, node_id: str) -> str:
        return f"{self.prefix}:node:{node_id}"

"""Every Redis key idpool uses, built in one place.

With the default prefix ``idpool``:

``idpool:pool:{tag}``  LIST of ranges as ``"first-last"`` text, inclusive.
    The preloader RPUSHes fresh ranges at the tail; a stopping node LPUSHes its
    unused remainders at the head; nodes LPOP one whole range from the head.
    ``redis-cli LRANGE idpool:pool:orders 0 -1`` shows what is ready.

``idpool:pools``  SET of tags that have a pool list. Written by every push,
    read when a new Redis incarnation is cleaned and by ``idpool pool show``.

``idpool:hwm:{tag}``  STRING, the highest ledger ``max_id`` any process has seen
    for the tag (the high-water mark). Raised, never lowered, by whoever claims a
    range from MySQL; read to refuse ranges from a MySQL that came back older.

``idpool:stats:{tag}``  HASH of supply figures. ``taken``: IDs nodes have taken
    (HINCRBY by nodes on every range they take, pool or ledger); ``lifetime_s``
    and ``lifetime_ids``: how long the last range a node finished lasted, and its
    size (HSET by nodes, consumed by the preloader's dynamic step); ``rate``,
    ``target_depth``, ``step``: the preloader's latest estimate of IDs/s, the
    depth it fills to, and the step (HSET by the preloader; ``target_depth`` is
    read by the pop script so a node knows when the pool runs low).

``idpool:lease:{tag}``  STRING with a TTL, the id of the preloader refilling the
    tag right now. Set with NX by the preloader, deleted by its owner only.

``idpool:clean:{run_id}:{replid}``  STRING, present once the Redis incarnation
    with that ``run_id`` (changes on every restart) and ``master_replid`` (changes
    on every failover) has had its pool lists flushed. Every pool script checks it
    first; no snapshot of an older incarnation can contain it.

``idpool:incarnation``  STRING, the name of the current clean marker, so the
    next incarnation can delete the old one.

``idpool:leased:{run_id}:{replid}:{lease_id}``  STRING with a TTL
    (``IDPOOL_CLIENT_LEASE_SECONDS``), one range leased to a client library:
    ``"L tag first last end"`` while out, then the tombstone
    ``"R tag first last end from"`` once its tail was returned. Written by a
    node's lease script (SET) and its return script (which also LPUSHes the tail);
    read by the return script only. The incarnation in the name means a Redis
    restored from an old snapshot cannot take a lease's return twice.
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

    def lease(self, tag: str) -> str:
        return f"{self.prefix}:lease:{tag}"

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

from __future__ import annotations

from .ranges import IdRange


class IdPoolError(Exception):
    """Base class of every error idpool raises on purpose."""


class ConfigError(IdPoolError):
    """A setting is malformed; the message names the variable to fix."""


class InvalidInput(IdPoolError):
    """A value a caller gave is malformed or out of range: 400 over HTTP, exit 2 in
    the CLI. ``code`` names the field (``bad_tag``, ``bad_step``, ...); the
    message says what to give instead."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class UnknownTag(IdPoolError):
    """No row for this tag in the ledger."""


class KindChanged(UnknownTag):
    """A claim for a tag of one kind found the name's row of another: the tag the
    caller serves was removed and the name added again as another kind (or its kind
    edited by hand). Nothing was claimed; the caller's tag is gone (an UnknownTag),
    and what it holds of it must not be served as the new tag's."""

    def __init__(self, tag: str, expected: str, found: str) -> None:
        super().__init__(
            f"tag {tag!r} is now a {found} tag, not the {expected} tag this process served; "
            "nothing claimed"
        )
        self.tag = tag
        self.expected = expected
        self.found = found


class TagExists(IdPoolError):
    """`tag add` for a tag that already has a row."""

    def __init__(self, tag: str) -> None:
        super().__init__(f"tag {tag!r} already exists; change it with PATCH or `idpool tag`")
        self.tag = tag


class NameUsedBefore(InvalidInput):
    """A snowflake tag added under a name that issued IDs before (a removed tag's
    tombstone, or a high-water mark in Redis): its IDs come from the clock since a
    new epoch, which no ``max_id`` fences, so they could repeat the old tag's
    (409 ``name_used``)."""

    def __init__(self, tag: str, before: str) -> None:
        super().__init__(
            "name_used",
            f"tag {tag!r} issued IDs before ({before}); a snowflake tag makes its IDs from "
            "the clock, not above the old ones, and could hand them out again: choose a new name",
        )
        self.tag = tag


class KindKept(InvalidInput):
    """A removed name added again as another kind (409 ``name_used``). A node that
    held the old tag's buffer serves it until its next tag-list reload (or, paused,
    until it runs again): a strict tag would go down, and a snowflake tag's clock
    IDs are fenced by no ``max_id``. A name keeps its kind for ever."""

    def __init__(self, tag: str, old_kind: str, kind: str) -> None:
        super().__init__(
            "name_used",
            f"tag {tag!r} was a {old_kind} tag before it was removed; a name keeps its kind "
            f"for ever (nodes may still hold the old tag's IDs), so it cannot come back as a "
            f"{kind} tag: add it again as {old_kind}, or choose a new name for the {kind} tag",
        )
        self.tag = tag


class FormatChanged(InvalidInput):
    """A tag name used before with another format (or none) added again with this one:
    the new format could render strings the old tag handed out (409 ``format_changed``)."""

    def __init__(self, tag: str, before: str) -> None:
        super().__init__(
            "format_changed",
            f"tag {tag!r} was used before {before}; with another format (or none) its new IDs "
            "could repeat strings it already handed out. Add it again with exactly the same "
            "format, reset, obfuscate and max (it then goes on above the IDs it issued, with "
            "the same key), or choose a new name",
        )
        self.tag = tag


class StartOnReset(InvalidInput):
    """``tag start`` on a tag with a reset: its numbers restart each period from the
    tag's start, so one start cannot move (409 ``start_on_reset``)."""

    def __init__(self, tag: str) -> None:
        super().__init__(
            "start_on_reset",
            f"tag {tag!r} has a reset: {{id}} counts from its start again each period, in a "
            "ledger row per period, so a start cannot be moved; nothing changed. For other "
            "numbers, add a new tag with --start (and choose a new name)",
        )


class StartBelowIssued(IdPoolError):
    """A tag's start may only move forward: IDs below ``max_id`` were already claimed."""

    def __init__(self, tag: str, max_id: int) -> None:
        super().__init__(
            f"tag {tag!r}: IDs below {max_id} are already issued or claimed; "
            f"start can only move forward, to {max_id} or above"
        )
        self.max_id = max_id


class StartAboveMax(IdPoolError):
    """A start past a tag's max would leave it nothing to hand out (its max never changes)."""

    def __init__(self, tag: str, start: int, top: int) -> None:
        super().__init__(
            f"tag {tag!r}: start {start} is above the tag's max {top}; a start there would "
            f"leave it no ID to hand out: choose one from its current start up to {top}"
        )
        self.top = top


class StoreUnavailable(IdPoolError):
    """A store (MySQL or Redis) could not be reached or did not answer in time.

    ``store`` is "mysql" or "redis" ("sqlite" or "sqlite_pool" in the embedded
    mode), so a 503 can say which one is down.
    """

    def __init__(self, store: str, detail: str) -> None:
        super().__init__(f"{store} unavailable: {detail}")
        self.store = store
        self.detail = detail


class StaleLedger(IdPoolError):
    """MySQL handed out a range at or below a high-water mark seen before.

    This happens after a failover to a lagging replica or a restore from backup.
    The range is abandoned; the ledger is raised past the mark before claiming again.
    """


class StoreNotSent(StoreUnavailable):
    """The command never left this process (no connection could be made): unlike
    its parent, not ambiguous. A push that was not sent may be sent again."""


class StoreSkipped(StoreNotSent):
    """Not tried: the store failed a moment ago (the one-second Redis skip). Says
    nothing new about its health."""


class StoreBusy(StoreNotSent):
    """Every connection to the store stayed busy: the command was never sent.

    It says nothing about the store's health either: no Redis skip, no waste.
    """


class MarkNotRaised(StoreUnavailable):
    """A range was claimed but the shared high-water mark could not be raised past it.

    The range must not be served or pushed: if MySQL later went back in time,
    another process reading the old mark would claim the same IDs. ``wasted`` is
    the range given up.
    """

    def __init__(self, store: str, detail: str, wasted: IdRange) -> None:
        super().__init__(store, detail)
        self.wasted = wasted


class TooFewReplicas(StoreUnavailable):
    """A high-water raise landed on the Redis primary, but fewer replicas than
    ``IDPOOL_REDIS_MARK_REPLICAS`` acknowledged it (``WAIT``) in time. Redis
    answers: pops and pushes go on; only claims stop until enough replicas are
    back."""

    def __init__(self, acked: int, wanted: int, online: int, detail: str) -> None:
        super().__init__("redis", detail)
        self.acked = acked
        self.wanted = wanted
        self.online = online


class StrictNotConfirmed(StoreUnavailable):
    """A strict take ran on a Redis Cluster primary, but not every replica that
    primary knows of acknowledged it (``WAIT``): it may be a primary deposed while
    paused, so its IDs are given up. Redis answers: nothing else stops."""

    def __init__(self, detail: str) -> None:
        super().__init__("redis", detail)


class MarkNotReplicated(MarkNotRaised):
    """A MarkNotRaised because too few replicas acknowledged the raise (TooFewReplicas):
    the range is given up like any, but Redis is not down."""


class TagExhausted(IdPoolError):
    """The tag has no IDs left below its upper bound; other tags are unaffected."""


class TagDisabled(IdPoolError):
    """An operator disabled the tag: no claim, no pop, no ID until it is enabled.

    Its ledger row and high-water mark are kept, so enabling it again serves
    IDs above everything it ever issued.
    """


class Draining(IdPoolError):
    """The node is stopping; its remainders are being returned to the pool."""


class NoRangeAvailable(IdPoolError):
    """Neither store could supply a range; the message says which is down and why."""

    def __init__(self, tag: str, errors: list[StoreUnavailable]) -> None:
        stores = " and ".join(dict.fromkeys(e.store for e in errors))
        details = "; ".join(str(e) for e in errors)
        if errors and all(isinstance(e, TooFewReplicas) for e in errors):
            # Redis answers: only its replicas are short, and only claims stopped
            why = "claims stopped, too few Redis replicas"
        else:
            why = f"{stores} down"
        super().__init__(f"no ID range available for tag {tag!r}: {why} ({details})")
        self.stores = [e.store for e in errors]


class LeaseRefused(IdPoolError):
    """A return that is not the unused tail of a live lease; nothing was changed.

    ``code`` is ``unknown_lease``, ``wrong_secret``, ``already_returned``,
    ``wrong_tag`` or ``outside_lease``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class LeaseClash(IdPoolError):
    """A lease id was already recorded (never in practice: ids are 128-bit random)."""


class FormatNotFenced(IdPoolError):
    """A formatted tag whose row's format is not the one recorded for its name in
    Redis (a row inserted or edited by hand): never served (503)."""

    def __init__(self, tag: str, why: str = "") -> None:
        why = why or "its format is not the one this name was used with (idpool:{tag}:format)"
        super().__init__(
            f"tag {tag!r}: {why}: a row inserted or edited by hand could repeat strings "
            "the old tag handed out, so it is not served; remove it and choose a new name"
        )


class KindNotServed(IdPoolError):
    """The tag's kind (the ledger's ``kind`` column) is one this node does not know:
    a newer idpool made it. Served by nodes that know it; here a 503."""

    def __init__(self, tag: str, kind: str) -> None:
        super().__init__(
            f"tag {tag!r} is of kind {kind!r}, which this node does not serve; "
            "upgrade idpool on this node"
        )
        self.kind = kind

"""Which tags exist: the node's copy of the ledger's tag list.

A request names a tag; only a tag in the ledger gets a buffer, a range pop or a
claim. A name not in the copy makes the node reload the whole list, at most
once per ``min_interval`` (one query, shared by every request waiting for it).
Within that interval a name still not known costs one primary-key lookup, one
at a time, and is then remembered as unknown for ``min_interval`` (in a
bounded cache); when too many wait for a lookup the request is refused at once
rather than queued. So a tag created a moment ago is served at once, while a
flood of made-up names costs the ledger one connection at most, the node a
bounded amount of memory, and requests for real tags nothing.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from idpool_client.formats import TagFormat

from idpool.pool.clock import SYSTEM_CLOCK
from idpool.pool.errors import StoreBusy, StoreUnavailable, TagDisabled, UnknownTag
from idpool.pool.kind_rules import KindRules
from idpool.pool.stores import LedgerStore
from idpool.pool.tag_rules import name_fingerprint
from idpool.pool.tokens import TokenRow
from idpool.pool.values import TagRow

from .formats import formats_of, parent_of

UNKNOWN_CACHE_SIZE = 10_000  # names remembered as unknown, oldest dropped first
MAX_WAITING_LOOKUPS = 64  # requests queued for a one-name lookup before refusing more


class TagDirectory:
    def __init__(
        self,
        ledger: LedgerStore,
        min_interval: float = 1.0,
        clock: Callable[[], float] = SYSTEM_CLOCK.monotonic,  # the runtime's Clock.monotonic
        *,
        rules_of: Callable[[str], KindRules],
    ) -> None:
        self.ledger = ledger
        # a kind's name -> its rules (service/kinds' rules_of; given: the kinds read
        # this directory, so it reads none of them)
        self.rules_of = rules_of
        self.min_interval = min_interval
        self.rows: dict[str, TagRow] = {}
        # tag -> hashes of its tokens, for the tags that have any (pool/tokens.py);
        # read with the rows, so a token added or revoked counts within a reload
        self.tokens: dict[str, frozenset[str]] = {}
        # tag -> its format, for the tags whose rows carry one (service/formats.py);
        # a period's row (TAG@KEY) -> None: never served by its own name. Read with
        # the rows; kept when a row goes (a format never changes), so NodeApp never
        # answers a formatted tag's buffer as a plain one.
        self.formats: dict[str, TagFormat | None] = {}
        # tag -> fingerprint of the format (options, secret) this process first read
        # in its row ('' for a plain tag), and the tags whose row now reads otherwise:
        # a format never changes, so such a row was edited by hand and is refused
        # (FormatNotFenced, 503), never rendered nor served plain. Both go with the
        # tag's format (Node.refresh_tags).
        self.fingerprints: dict[str, str] = {}
        self.changed: set[str] = set()
        self._clock = clock
        self._loaded_at: float | None = None  # when the last reload was started
        self.full_at: float | None = None  # when the last whole list was read
        self._loading: asyncio.Task[None] | None = None
        self._error: StoreUnavailable | None = None  # the last reload's failure
        self._unknown: OrderedDict[str, float] = OrderedDict()  # name -> known unknown until
        self._lookup_slot = asyncio.Semaphore(1)
        self._waiting = 0

    def step(self, tag: str) -> int:
        """The tag's step as last read (a sizing hint, 1 when not known)."""
        row = self.rows.get(tag)
        return 1 if row is None else row.step

    async def lookup(self, tag: str) -> TagRow:
        """The tag's row; raises UnknownTag, TagDisabled, or StoreUnavailable
        when the list cannot be read and the tag is not known yet."""
        row = self.rows.get(tag)
        if row is not None and not row.disabled:
            return row
        now = self._clock()
        if row is not None:
            # Disabled as last read: read the list again (at most once per
            # min_interval, shared) in case it was enabled meanwhile.
            await self.reload()
            row = self.rows.get(tag)
        elif self._unknown.get(tag, 0.0) > now:
            raise UnknownTag(tag)
        elif self._loaded_at is None or now - self._loaded_at >= self.min_interval:
            await self.reload()
            row = self.rows.get(tag)
        else:
            row = await self._lookup_one(tag)
        if row is None:
            self._unknown[tag] = self._clock() + self.min_interval
            self._unknown.move_to_end(tag)
            while len(self._unknown) > UNKNOWN_CACHE_SIZE:
                self._unknown.popitem(last=False)
            raise UnknownTag(tag)
        if row.disabled:
            raise TagDisabled(f"tag {tag!r} is disabled; an operator can enable it again")
        return row

    def disabled(self) -> set[str]:
        """Tags the last reload found disabled (a period's row with its tag)."""
        off = {tag for tag, row in self.rows.items() if row.disabled}
        return off | {name for name in self.formats if parent_of(name) in off}

    def added(self, row: TagRow) -> None:
        """A row this node just created (a period's row): known at once."""
        self._learn_formats([row])
        self.rows[row.tag] = row
        self._unknown.pop(row.tag, None)

    def _learn_formats(self, rows: Sequence[TagRow]) -> None:
        """What ``formats`` learns from rows read now. A tag's format is the one its
        row had when this process first read it: a row read again with other options
        or another key (edited by hand in the ledger) never replaces it. Taken at a
        reload, unchecked, it rendered new numbers as strings the old format had
        handed out (``H{id}`` edited to ``H{id:x}``: 51 became ``H33``, which 33 was);
        the first-serve check (``FormatFence.check_fence``) runs once per tag and
        format, and the fast path never runs it. So the tag is refused instead."""
        found = formats_of(list(rows))
        for row in rows:
            fingerprint = name_fingerprint(row, self.rules_of(row.kind))
            if self.fingerprints.setdefault(row.tag, fingerprint) != fingerprint:
                self.changed.add(row.tag)
                found[row.tag] = None  # in formats, so NodeApp never serves it plain
            elif row.tag in self.changed:  # edited back: the format it always had
                self.changed.discard(row.tag)
                if row.tag not in found:  # plain, as first read: served plain again
                    self.formats.pop(row.tag, None)
        self.formats.update(found)

    def forget_format(self, tag: str) -> None:
        """A removed tag whose buffers are gone: a tag added again under its name is
        read afresh (and checked against the name's fingerprint in Redis)."""
        self.formats.pop(tag, None)
        self.fingerprints.pop(tag, None)
        self.changed.discard(tag)

    async def _lookup_one(self, tag: str) -> TagRow | None:
        """One name, by primary key, one lookup at a time for the whole node."""
        if self._waiting >= MAX_WAITING_LOOKUPS:
            raise StoreBusy("mysql", "too many lookups of unknown tags waiting; retry")
        self._waiting += 1
        try:
            async with self._lookup_slot:
                row = self.rows.get(tag)  # a reload may have found it meanwhile
                if row is None:
                    try:
                        row = await self.ledger.get_tag(tag)
                        tokens = await self.ledger.list_tokens(tag)
                    except UnknownTag:
                        return None
                    if row.tag != tag:
                        return None  # another spelling of a tag is not that tag
                    # Its tokens before its row: a tag found this way is never served open.
                    if tokens:
                        self.tokens[tag] = frozenset(t.token_hash for t in tokens)
                    self._learn_formats([row])  # before the row: see formats
                    self.rows[tag] = row
                return row
        finally:
            self._waiting -= 1

    async def reload(self) -> None:
        """Read the ledger's list again, unless that was done less than
        ``min_interval`` ago (then its outcome stands, failure included)."""
        if self._loading is None:
            now = self._clock()
            if self._loaded_at is not None and now - self._loaded_at < self.min_interval:
                if self._error is not None:  # a fresh copy: the original's traceback stays put
                    raise StoreUnavailable(self._error.store, self._error.detail)
                return
            self._loaded_at = now
            self._loading = asyncio.ensure_future(self._load())
        # shield: a client that hangs up must not cancel a reload others wait on
        await asyncio.shield(self._loading)

    async def refresh(self, names: Sequence[str] | None = None) -> None:
        """Read the ledger's list again now (the node's periodic reload, which
        makes disabled tags stop), or only the rows of ``names`` (the tags this
        node serves: a list of 10,000 rows every few seconds on every node cost
        more than everything else at idle) and every token. Not counted against
        ``min_interval``: that limit is for misses."""
        if names is not None:
            rows = await self.ledger.list_tags(names)
            tokens = await self.ledger.list_tokens()
            # In one synchronous step, as a full reload: rows and tokens agree.
            found = {row.tag: row for row in rows}
            for gone in set(names) - set(found):
                # removed (idpool tag remove): unknown from now on; its format goes
                # once its buffer has (Node.refresh_tags)
                self.rows.pop(gone, None)
            self._learn_formats(rows)
            self.rows.update(found)
            self.tokens = _hashes(tokens)
            return
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._load())
        await asyncio.shield(self._loading)

    async def _load(self) -> None:
        try:
            rows = await self.ledger.list_tags()
            tokens = await self.ledger.list_tokens()
        except StoreUnavailable as e:
            self._error = e
            raise
        finally:
            self._loading = None
        self._error = None
        # Both in one synchronous step: no request sees new rows with old tokens.
        self._learn_formats(rows)
        self.rows = {row.tag: row for row in rows}
        self.tokens = _hashes(tokens)
        self.full_at = self._clock()


def _hashes(tokens: Iterable[TokenRow]) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {}
    for token in tokens:
        found.setdefault(token.tag, set()).add(token.token_hash)
    return {tag: frozenset(hashes) for tag, hashes in found.items()}

"""Which tags exist: the node's copy of the ledger's tag list.

A request names a tag; only a tag in the ledger gets a buffer, a range pop or a
claim. A name not in the copy makes the node reload the whole list, at most
once per ``min_interval`` however many names arrive (one query, shared by every
request waiting for it), so a flood of made-up names costs the ledger at most
one cheap read a second and the node no memory per name.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from pool.errors import StoreUnavailable, TagDisabled, UnknownTag
from pool.ledger import TagRow
from pool.stores import LedgerStore


class TagDirectory:
    def __init__(
        self,
        ledger: LedgerStore,
        min_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self.min_interval = min_interval
        self.rows: dict[str, TagRow] = {}
        # tag -> hashes of its tokens, for the tags that have any (pool/tokens.py);
        # read with the rows, so a token added or revoked counts within a reload
        self.tokens: dict[str, frozenset[str]] = {}
        self._clock = clock
        self._loaded_at: float | None = None  # when the last reload was started
        self._loading: asyncio.Task[None] | None = None
        self._error: StoreUnavailable | None = None  # the last reload's failure

    def step(self, tag: str) -> int:
        """The tag's step as last read (a sizing hint, 1 when not known)."""
        row = self.rows.get(tag)
        return 1 if row is None else row.step

    async def lookup(self, tag: str) -> TagRow:
        """The tag's row; raises UnknownTag, TagDisabled, or StoreUnavailable
        when the list cannot be read and the tag is not known yet."""
        row = self.rows.get(tag)
        if row is None or row.disabled:
            await self.reload()  # a disabled tag may have been enabled meanwhile
            row = self.rows.get(tag)
        if row is None:
            raise UnknownTag(tag)
        if row.disabled:
            raise TagDisabled(f"tag {tag!r} is disabled; an operator can enable it again")
        return row

    def disabled(self) -> set[str]:
        """Tags the last reload found disabled."""
        return {tag for tag, row in self.rows.items() if row.disabled}

    async def reload(self) -> None:
        """Read the ledger's list again, unless that was done less than
        ``min_interval`` ago (then its outcome stands, failure included)."""
        if self._loading is None:
            now = self._clock()
            if self._loaded_at is not None and now - self._loaded_at < self.min_interval:
                if self._error is not None:
                    raise self._error
                return
            self._loaded_at = now
            self._loading = asyncio.ensure_future(self._load())
        # shield: a client that hangs up must not cancel a reload others wait on
        await asyncio.shield(self._loading)

    async def refresh(self) -> None:
        """Read the ledger's list again now (the node's periodic reload, which
        makes disabled tags stop). Not counted against ``min_interval``: that
        limit is for misses, and a miss right after must still find a new tag."""
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
        hashes: dict[str, set[str]] = {}
        for token in tokens:
            hashes.setdefault(token.tag, set()).add(token.token_hash)
        # Both in one synchronous step: no request sees new rows with old tokens.
        self.rows = {row.tag: row for row in rows}
        self.tokens = {tag: frozenset(found) for tag, found in hashes.items()}

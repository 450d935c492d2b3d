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

from pool.errors import StoreUnavailable, UnknownTag
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
        self._clock = clock
        self._loaded_at: float | None = None  # when the last reload was started
        self._loading: asyncio.Task[None] | None = None
        self._error: StoreUnavailable | None = None  # the last reload's failure

    def step(self, tag: str) -> int:
        """The tag's step as last read (a sizing hint, 1 when not known)."""
        row = self.rows.get(tag)
        return 1 if row is None else row.step

    async def lookup(self, tag: str) -> TagRow:
        """The tag's row; raises UnknownTag, or StoreUnavailable when the list
        cannot be read and the tag is not known yet."""
        row = self.rows.get(tag)
        if row is not None:
            return row
        await self.reload()
        row = self.rows.get(tag)
        if row is None:
            raise UnknownTag(tag)
        return row

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

    async def _load(self) -> None:
        try:
            rows = await self.ledger.list_tags()
        except StoreUnavailable as e:
            self._error = e
            raise
        finally:
            self._loading = None
        self._error = None
        self.rows = {row.tag: row for row in rows}

"""A buffer's unused remainder given back to the head of its tag's list, so the
next node serves it first: when a tag goes idle, and for every tag at shutdown.

A push that was never sent is sent again, a few times; one that may or may not
have landed is never sent again: its remainder is waste, recorded with why,
never served twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from idpool.pool.errors import StoreNotSent, StoreUnavailable
from idpool.pool.ranges import IdRange
from idpool.pool.waste import Reason

from .source import RangeSource

# The node's log lines, under the node's logger as before they moved here
logger = logging.getLogger("idpool.node")

_BUSY_RETRIES = 3  # a remainder push that was never sent is sent again, this often
_RETURNS_AT_ONCE = 16  # remainder pushes in flight at shutdown


@dataclass
class ShutdownReport:
    returned: list[tuple[str, IdRange]] = field(default_factory=list)
    abandoned: list[tuple[str, IdRange]] = field(default_factory=list)


async def return_all(
    source: RangeSource, remainders: Iterable[tuple[str, list[IdRange]]], report: ShutdownReport
) -> None:
    """Give back every tag's remainder (the empty ones skipped), a few at a time."""
    # Many tags at once: one at a time, 300 tags behind a slow Redis outlasted a
    # 30 s grace period, and what was not pushed by the SIGKILL was waste.
    slots = asyncio.Semaphore(_RETURNS_AT_ONCE)

    async def give_back(tag: str, remainder: list[IdRange]) -> None:
        async with slots:
            await return_remainder(source, tag, remainder, report)

    await asyncio.gather(*(give_back(tag, rem) for tag, rem in remainders if rem))


async def return_remainder(
    source: RangeSource, tag: str, remainder: list[IdRange], report: ShutdownReport
) -> None:
    pool = source.pool

    def abandon(reason: Reason, detail: str | None = None) -> None:
        report.abandoned += [(tag, r) for r in remainder]
        source.waste.record(tag, remainder, reason, detail)

    if pool is None:
        abandon(Reason.NO_POOL)
        return
    for _ in range(_BUSY_RETRIES):
        try:
            result = await pool.push(tag, remainder, head=True)
            break
        except StoreNotSent:
            continue  # never sent: safe to send again
        except StoreUnavailable as e:
            # Maybe pushed, maybe not: never retried, the remainder is waste.
            abandon(Reason.PUSH_OUTCOME_UNKNOWN, e.detail)
            return
    else:
        abandon(Reason.PUSH_NOT_SENT)
        return
    source.waste.dropped(result.dropped)
    report.returned += [(tag, r) for r in remainder]
    source.stats.tags[tag].ids_returned += sum(map(len, remainder))
    texts = ",".join(r.to_text() for r in remainder)
    logger.info("event=range_returned tag=%s range=%s depth=%d", tag, texts, result.depth)

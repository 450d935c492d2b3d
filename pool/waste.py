"""Waste: IDs given up so that none is ever handed out twice (docs/design/faults.md,
"Invariant 3: bounded waste"). Every range given up in a process goes through one
``WasteRecorder.record`` call, which logs it (``event=range_abandoned
reason=...``; ``event=stale_ledger`` for a range MySQL handed out below the
high-water mark) and counts it per (tag, reason): /status, /metrics and the
cluster totals read those counts. IDs given up whose range is not known (a
strict take that may have run) go through ``WasteRecorder.lost``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum

from .clock import SYSTEM_CLOCK
from .ranges import IdRange, TaggedRange

logger = logging.getLogger("idpool.waste")


class Reason(StrEnum):
    """Why a range was given up (the ``reason`` of its log line and its counter)."""

    STALE_LEDGER = "stale_ledger"  # MySQL handed it out below the high-water mark
    MARK_NOT_RAISED = "mark_not_raised"  # claimed, but the mark could not be raised past it
    REDIS_NEW_INCARNATION = "redis_new_incarnation"  # a restarted Redis's list held it
    TAG_DISABLED = "tag_disabled"  # ready or buffered when its tag was disabled
    LEASE_NOT_RECORDED = "lease_not_recorded"  # a lease Redis may not have recorded
    TAG_REMOVED = "tag_removed"  # ready or buffered when its tag was removed
    PERIOD_ENDED = "period_ended"  # left in a reset tag's list after its period ended
    ANSWER_UNDELIVERED = "answer_undelivered"  # taken for a client that hung up first
    LEADERSHIP_LOST = "lease_lost"  # claimed by a preloader that found another leading
    NO_POOL = "no_pool"  # a remainder at shutdown with no pool to return it to
    PUSH_NOT_SENT = "push_not_sent"  # a push never sent, retries used up
    PUSH_OUTCOME_UNKNOWN = "push_outcome_unknown"  # a push that may or may not have landed
    # strict tags (pool/strict.py): their takes and refills
    STRICT_TAKE_OUTCOME_UNKNOWN = "strict_take_outcome_unknown"  # a take that may have run
    STRICT_EXTEND_OUTCOME_UNKNOWN = "strict_extend_outcome_unknown"  # a refill that may have landed
    STRICT_EXTEND_NOT_SENT = "strict_extend_not_sent"  # a refill's claim never put in the state
    STRICT_REFILL_RACED = "strict_refill_raced"  # claimed below a limit another node set first
    STRICT_STATE_SKIPPED = "strict_state_skipped"  # a state's rest, jumped over by a refill
    STRICT_NOT_MASTER = "strict_not_master"  # taken on a Redis the Sentinels no longer name
    # taken on a cluster primary whose replicas did not acknowledge the take (WAIT)
    STRICT_NOT_CONFIRMED = "strict_not_confirmed"


# A store that failed mid-write is worth an error; a decision (disable, no pool) a warning.
_ERRORS = {
    Reason.STALE_LEDGER,
    Reason.MARK_NOT_RAISED,
    Reason.LEASE_NOT_RECORDED,
    Reason.PUSH_NOT_SENT,
    Reason.PUSH_OUTCOME_UNKNOWN,
    Reason.LEADERSHIP_LOST,
    Reason.STRICT_TAKE_OUTCOME_UNKNOWN,
    Reason.STRICT_EXTEND_OUTCOME_UNKNOWN,
    Reason.STRICT_EXTEND_NOT_SENT,
}


class WasteRecorder:
    """One per process: logs each range given up and counts its IDs."""

    def __init__(self, clock: Callable[[], float] = SYSTEM_CLOCK.monotonic) -> None:
        self._by_tag: dict[str, Counter[str]] = {}  # tag -> reason -> IDs
        self._clock = clock  # monotonic seconds (the runtime's Clock.monotonic)
        # answer_undelivered: logged at most once a second, with what the line stands for
        self._undelivered_next = 0.0
        self._undelivered_answers = self._undelivered_ids = 0

    def record(
        self,
        tag: str,
        ranges: Sequence[IdRange],
        reason: Reason,
        detail: str | None = None,
        raised_to: int | None = None,
    ) -> None:
        """``ranges`` of ``tag`` are given up: never served, pushed or returned."""
        if not ranges:
            return
        self._by_tag.setdefault(tag, Counter())[reason.value] += sum(map(len, ranges))
        level = logging.ERROR if reason in _ERRORS else logging.WARNING
        if reason is Reason.STALE_LEDGER:
            for r in ranges:
                logger.log(
                    level,
                    "event=stale_ledger tag=%s range=%s raised_max_id_to=%s "
                    "detail='MySQL returned a range below the high-water mark; range abandoned'",
                    tag,
                    r.to_text(),
                    raised_to,
                )
            return
        texts = ",".join(r.to_text() for r in ranges)
        if detail is None:
            logger.log(level, "event=range_abandoned tag=%s range=%s reason=%s", tag, texts, reason)
        else:
            logger.log(
                level,
                "event=range_abandoned tag=%s range=%s reason=%s detail=%r",
                tag,
                texts,
                reason,
                detail,
            )

    def lost(self, tag: str, ids: int, reason: Reason) -> None:
        """``ids`` IDs of ``tag`` given up whose range this process cannot know (a
        strict take whose answer never came): counted, and logged as
        ``event=strict_ids_lost``."""
        if ids <= 0:
            return
        self._by_tag.setdefault(tag, Counter())[reason.value] += ids
        level = logging.ERROR if reason in _ERRORS else logging.WARNING
        logger.log(level, "event=strict_ids_lost tag=%s ids=%d reason=%s", tag, ids, reason)

    def undelivered(self, tag: str, ids: Sequence[int]) -> None:
        """IDs taken for an answer the client never got (it hung up first): counted
        always, logged at most once a second: a client that hangs up in a loop
        must not flood the log."""
        self._by_tag.setdefault(tag, Counter())[Reason.ANSWER_UNDELIVERED.value] += len(ids)
        self._undelivered_answers += 1
        self._undelivered_ids += len(ids)
        now = self._clock()
        if now < self._undelivered_next or not ids:
            return
        runs = [IdRange(ids[0], ids[0] + 1)]
        for value in ids[1:]:
            if value == runs[-1].end:
                runs[-1] = IdRange(runs[-1].start, value + 1)
            else:
                runs.append(IdRange(value, value + 1))
        logger.warning(
            "event=range_abandoned tag=%s range=%s reason=answer_undelivered "
            "answers_since_last=%d ids_since_last=%d",
            tag,
            ",".join(r.to_text() for r in runs),
            self._undelivered_answers,
            self._undelivered_ids,
        )
        self._undelivered_next = now + 1.0
        self._undelivered_answers = self._undelivered_ids = 0

    def dropped(self, dropped: Iterable[TaggedRange]) -> None:
        """Ranges a new Redis incarnation held when it was cleaned (any tag)."""
        for tag, r in dropped:
            self.record(tag, [r], Reason.REDIS_NEW_INCARNATION)

    def of(self, tag: str) -> Counter[str]:
        """reason -> IDs given up for ``tag`` in this process."""
        return Counter(self._by_tag.get(tag, ()))

    def tags(self) -> set[str]:
        """The tags that wasted IDs in this process."""
        return set(self._by_tag)

    def totals(self) -> Counter[tuple[str, str]]:
        """(tag, reason) -> IDs given up in this process."""
        return Counter(
            {(tag, reason): ids for tag, c in self._by_tag.items() for reason, ids in c.items()}
        )

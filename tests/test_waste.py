"""pool/waste.py: one call logs a range given up and counts it."""

from __future__ import annotations

import logging

import pytest

from idpool.pool.ranges import IdRange, TaggedRange
from idpool.pool.waste import Reason, WasteRecorder


def test_a_range_given_up_is_logged_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    waste = WasteRecorder()
    with caplog.at_level(logging.WARNING, logger="idpool.waste"):
        waste.record("a", [IdRange(1, 11), IdRange(21, 26)], Reason.TAG_DISABLED)
        waste.record("a", [IdRange(31, 41)], Reason.PUSH_OUTCOME_UNKNOWN, "timeout")
        waste.record("b", [], Reason.NO_POOL)  # nothing given up: nothing logged
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "event=range_abandoned tag=a range=1-10,21-25 reason=tag_disabled",
        "event=range_abandoned tag=a range=31-40 reason=push_outcome_unknown detail='timeout'",
    ]
    assert [r.levelname for r in caplog.records] == ["WARNING", "ERROR"]
    assert waste.of("a") == {"tag_disabled": 15, "push_outcome_unknown": 10}
    assert waste.tags() == {"a"} and waste.of("b") == {}
    assert waste.totals() == {("a", "tag_disabled"): 15, ("a", "push_outcome_unknown"): 10}


def test_stale_ranges_keep_their_own_event(caplog: pytest.LogCaptureFixture) -> None:
    waste = WasteRecorder()
    with caplog.at_level(logging.WARNING, logger="idpool.waste"):
        waste.record("a", [IdRange(1, 101)], Reason.STALE_LEDGER, raised_to=500)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("event=stale_ledger tag=a range=1-100 raised_max_id_to=500 ")
    assert waste.of("a") == {"stale_ledger": 100}


def test_ranges_a_new_redis_dropped_arrive_as_values() -> None:
    waste = WasteRecorder()
    waste.dropped([TaggedRange.from_text("a=1-10"), TaggedRange("b", IdRange(5, 7))])
    assert waste.totals() == {("a", "redis_new_incarnation"): 10, ("b", "redis_new_incarnation"): 2}


def test_ids_lost_without_a_known_range_are_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A strict take whose answer never came: how many IDs, not which."""
    waste = WasteRecorder()
    with caplog.at_level(logging.WARNING, logger="idpool.waste"):
        waste.lost("s", 4, Reason.STRICT_TAKE_OUTCOME_UNKNOWN)
        waste.lost("s", 3, Reason.STRICT_NOT_MASTER)
        waste.lost("s", 0, Reason.STRICT_NOT_MASTER)  # nothing given up: nothing logged
    assert [r.getMessage() for r in caplog.records] == [
        "event=strict_ids_lost tag=s ids=4 reason=strict_take_outcome_unknown",
        "event=strict_ids_lost tag=s ids=3 reason=strict_not_master",
    ]
    assert [r.levelname for r in caplog.records] == ["ERROR", "WARNING"]
    assert waste.of("s") == {"strict_take_outcome_unknown": 4, "strict_not_master": 3}

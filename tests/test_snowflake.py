"""Snowflake layouts and the generator, with injected clocks (pool/snowflake.py)."""

from __future__ import annotations

import pytest

from idpool.pool.errors import InvalidInput
from idpool.pool.snowflake import (
    LAYOUTS,
    MAX_WAIT_BACK_MS,
    ClockAhead,
    ClockBehind,
    Generator,
    Layout,
    WorkerLeaseLost,
    check_layout,
)

NOW = 1_764_000_000_000  # unix ms


class Clocks:
    def __init__(self, wall: int = NOW) -> None:
        self.wall = wall
        self.mono = 100.0

    def ms(self) -> int:
        return self.wall

    def monotonic(self) -> float:
        return self.mono


def make(
    clocks: Clocks, layout: Layout | None = None, floor: int = 0, worker: int = 3
) -> Generator:
    layout = layout or Layout(41, 10, 12, 1, NOW - 1000)
    return Generator(
        "t", layout, worker, floor, clocks.mono + 8, clock_ms=clocks.ms, monotonic=clocks.monotonic
    )


def test_default_and_js53_layouts() -> None:
    default = check_layout({}, NOW)
    assert (default.time_bits, default.worker_bits, default.sequence_bits) == (41, 10, 12)
    assert default.bits == 63 and default.unit_ms == 1 and default.epoch_ms == NOW
    js = check_layout({"layout": "js53"}, NOW)
    assert js.bits == 53 and js.unit_ms == 10
    # the largest ID the js53 layout can make is below 2^53
    top = js.encode((1 << js.time_bits) - 1, js.workers - 1, js.max_sequence)
    assert top < 2**53
    assert Layout.from_text(js.to_text()) == js


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"time_bits": 45, "worker_bits": 10, "sequence_bits": 12}, "add up to 67"),
        ({"epoch_ms": NOW + 60_000}, "in the future"),
        ({"unit_ms": 0}, "from 1 to 1000"),
        ({"unit_ms": 5000}, "from 1 to 1000"),
        ({"time_bits": 20}, "less than a year"),
        ({"layout": "js64"}, "default, js53"),
        ({"worker_bits": True}, "integer"),
    ],
)
def test_a_layout_is_checked_when_the_tag_is_made(fields: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidInput) as e:
        check_layout(fields, NOW)
    assert e.value.code == "bad_layout" and words in str(e.value)


def test_decode_gives_time_worker_and_sequence() -> None:
    layout = Layout(41, 10, 12, 1, NOW - 5000)
    value = layout.encode(5000, 7, 42)
    found = layout.decode(value)
    assert found["time_ms"] == NOW and found["worker"] == 7 and found["sequence"] == 42
    assert found["time"].endswith("Z")
    with pytest.raises(InvalidInput):
        layout.decode(1 << 63)


def test_ids_increase_and_carry_the_worker() -> None:
    clocks = Clocks()
    gen = make(clocks)
    seen = []
    for step in range(50):
        clocks.wall = NOW + step // 3
        value = gen.take()
        assert value is not None
        seen.append(value)
    assert seen == sorted(seen) and len(set(seen)) == 50
    assert {gen.layout.decode(v)["worker"] for v in seen} == {3}


def test_a_used_up_sequence_waits_for_the_next_unit() -> None:
    clocks = Clocks()
    gen = make(clocks, Layout(41, 10, 2, 1, NOW - 1000))  # 4 IDs a millisecond
    got = [gen.take() for _ in range(4)]
    assert None not in got
    assert gen.take() is None  # the fifth in the same millisecond waits
    assert 0 < gen.wait_seconds() <= 0.001
    clocks.wall += 1
    nxt = gen.take()
    assert nxt is not None and nxt > max(v for v in got if v is not None)


def test_a_small_step_back_goes_on_from_the_last_time_then_waits() -> None:
    clocks = Clocks()
    gen = make(clocks, Layout(41, 10, 3, 1, NOW - 1000))
    first = gen.take()
    clocks.wall -= 50  # NTP slews back 50 ms
    more = [gen.take() for _ in range(8)]  # 8 a millisecond: 7 more, then none
    assert more[-1] is None  # sequence of the last millisecond used up: wait
    assert all(v is not None and first is not None and v > first for v in more[:-1])
    clocks.wall += 51  # caught up
    assert gen.take() is not None


def test_a_large_step_back_stops_the_tag_until_the_clock_catches_up() -> None:
    clocks = Clocks()
    gen = make(clocks)
    before = gen.take()
    assert before is not None
    clocks.wall -= MAX_WAIT_BACK_MS + 500
    with pytest.raises(ClockBehind) as e:
        gen.take()
    assert e.value.behind_ms >= MAX_WAIT_BACK_MS + 500 and gen.behind_ms
    clocks.wall = NOW + 1
    after = gen.take()
    assert after is not None and after > before and not gen.behind_ms


def test_a_leap_forward_moves_on_and_a_later_correction_never_goes_back() -> None:
    clocks = Clocks()
    gen = make(clocks)
    before = gen.take()
    clocks.wall += 3_600_000  # an hour ahead
    ahead = gen.take()
    assert before is not None and ahead is not None and ahead > before
    clocks.wall -= 3_600_000  # corrected: a large step back
    with pytest.raises(ClockBehind):
        gen.take()
    assert gen.last_ms >= NOW + 3_600_000  # what a renewal reports: the time used


def test_no_id_at_or_below_the_floor_of_the_previous_holder() -> None:
    clocks = Clocks()
    gen = make(clocks, floor=NOW + 200)  # the previous holder used up to NOW + 200
    assert gen.take() is None  # 200 ms ahead: a small step back, waited out
    clocks.wall = NOW + 200
    assert gen.take() is None  # the floor's own unit is not used either
    clocks.wall = NOW + 201
    value = gen.take()
    assert value is not None and gen.layout.decode(value)["time_ms"] == NOW + 201
    far = make(clocks, floor=NOW + 60_000)
    with pytest.raises(ClockBehind):
        far.take()


def test_the_generator_stops_before_its_lease_could_expire() -> None:
    clocks = Clocks()
    gen = make(clocks)
    assert gen.take() is not None
    clocks.mono = gen.stop_at
    with pytest.raises(WorkerLeaseLost):
        gen.take()
    gen.stop_at += 10
    assert gen.take() is not None
    gen.lost = "the lease was lost"
    with pytest.raises(WorkerLeaseLost):
        gen.take()


def test_many_workers_never_make_the_same_id() -> None:
    clocks = Clocks()
    layout = LAYOUTS["js53"]
    layout = Layout(layout.time_bits, layout.worker_bits, layout.sequence_bits, 10, NOW - 10_000)
    gens = [make(clocks, layout, worker=w) for w in range(16)]
    seen: set[int] = set()
    made = 0
    for tick in range(40):
        clocks.wall = NOW + tick * 3
        for gen in gens:
            for _ in range(40):
                value = gen.take()
                if value is not None:
                    seen.add(value)
                    made += 1
    assert made == len(seen) and made > 16 * 40
    assert max(seen) < 2**53


def test_no_id_past_the_leases_recorded_expiry_whatever_the_clock_and_redis_do() -> None:
    """Issue 28: the generator made IDs at whatever time its clock leaped to; a
    holder that then cannot reach Redis records nothing, and its worker ID comes
    back above the expiry Redis recorded. It stops there instead, until a
    renewal (``cover``) records a later expiry; a late answer never lowers it."""
    clocks = Clocks()
    layout = Layout(41, 10, 12, 10, NOW - 1000)  # 10 ms units
    gen = Generator(
        "t", layout, 3, 0, clocks.mono + 8, clock_ms=clocks.ms, monotonic=clocks.monotonic,
        ceiling_ms=NOW + 1005,
    )  # fmt: skip
    assert gen.take() is not None
    clocks.wall = NOW + 1009  # in the expiry's unit: still covered
    assert gen.take() is not None and gen.ahead_ms() == 4
    clocks.wall = NOW + 60_000  # leaped a minute; no renewal gets through
    with pytest.raises(ClockAhead) as e:
        gen.take()
    assert e.value.ahead_ms == 60_000 - 1005 and gen.last_ms < NOW + 1010
    gen.cover(NOW + 500)  # an earlier renewal's answer, late: not lowered
    with pytest.raises(ClockAhead):
        gen.take()
    gen.cover(NOW + 61_000)  # a renewal recorded it
    value = gen.take()
    assert value is not None and value >> 22 == (60_000 + 1000) // 10

from __future__ import annotations

import pytest

from idpool.pool.sizing import MIN_SPAN, RateMeter, next_step, target_depth


def test_rate_over_a_sliding_window() -> None:
    meter = RateMeter(window=10)
    assert meter.add(0, 0) == 0.0
    assert meter.add(1, 100) == 100 / MIN_SPAN  # under MIN_SPAN of history: spread over it
    for t in range(2, 31):
        rate = meter.add(t, 100 * t)
    assert rate == 100.0
    assert meter.history()[0][0] >= 30 - 11  # old samples dropped
    # a burst of 1,000 extra IDs in the last second, over the 10 s window from t=21
    assert meter.add(31, 100 * 30 + 1000) == (100 * 30 + 1000 - 100 * 21) / 10


def test_a_range_taken_just_after_the_first_sample_is_no_burst() -> None:
    meter = RateMeter(window=60)
    meter.add(0, 0)
    assert meter.add(0.005, 1000) == 1000 / MIN_SPAN  # not 200,000 IDs/s
    assert meter.add(10, 3000) == 3000 / 10  # past MIN_SPAN: the real rate, not 3000 / 60


def test_counter_reset_starts_over() -> None:
    meter = RateMeter(window=10)
    meter.add(0, 5000)
    meter.add(1, 6000)
    assert meter.add(2, 10) == 0.0  # Redis lost the counter; no negative rate


@pytest.mark.parametrize(
    ("step", "ids", "seconds", "expected"),
    [
        (1000, 1000, 60.0, 2000),  # lasted 1 min < 15 min: double
        (1000, 1000, 900.0, 1000),  # exactly the target: keep
        (1000, 1000, 1800.0, 1000),  # twice the target: keep
        (1000, 1000, 1801.0, 500),  # over twice: halve
        (1000, 100, 60.0, 2000),  # a remainder of 100 took 60 s: 1,000 would take 600 s
        (1000, 100, 200.0, 500),  # 100 took 200 s: 1,000 would take 2,000 s
    ],
)
def test_next_step(step: int, ids: int, seconds: float, expected: int) -> None:
    assert next_step(step, ids, seconds, 900.0) == expected


def test_next_step_without_data_keeps_the_step() -> None:
    assert next_step(1000, 0, 10.0, 900.0) == 1000
    assert next_step(1000, 10, 10.0, 0.0) == 1000


def test_target_depth_in_time() -> None:
    assert target_depth(rate=0, step=1000, seconds=600, least=2, most=100) == 2
    assert target_depth(rate=100, step=1000, seconds=600, least=2, most=100) == 60
    assert target_depth(rate=101, step=1000, seconds=600, least=2, most=100) == 61
    assert target_depth(rate=1e6, step=1000, seconds=600, least=2, most=100) == 100

"""The one clock (pool/clock.py): the system clock, and the fake one tests move."""

from __future__ import annotations

import asyncio
import time

import pytest

from idpool.pool.clock import SYSTEM_CLOCK, FakeClock

pytestmark = pytest.mark.anyio


async def test_the_system_clock_is_the_machines() -> None:
    before = time.monotonic()
    await SYSTEM_CLOCK.sleep(0.01)
    assert SYSTEM_CLOCK.monotonic() - before >= 0.01
    assert abs(SYSTEM_CLOCK.now() - time.time()) < 1.0


async def test_advancing_wakes_the_sleepers_due_in_their_order(clock: FakeClock) -> None:
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic()))

    start = clock.monotonic()
    tasks = [asyncio.ensure_future(sleeper(n, s)) for n, s in (("c", 3), ("a", 1), ("b", 1))]
    await clock.until_sleeping(3)
    await clock.advance(2.0)
    assert woke == [("a", start + 1), ("b", start + 1)]  # due together: in the order slept
    assert clock.monotonic() == start + 2 and clock.sleeping == 1 and clock.next_due() == 1.0
    await clock.advance(5.0)
    assert woke[-1] == ("c", start + 3) and clock.monotonic() == start + 7
    await asyncio.gather(*tasks)


async def test_a_loop_is_woken_at_each_of_its_times_within_one_advance(
    clock: FakeClock,
) -> None:
    beats: list[float] = []
    wall = clock.now()

    async def loop() -> None:
        while True:
            beats.append(clock.monotonic())
            await clock.sleep(1.0)

    task = asyncio.ensure_future(loop())
    await clock.until_sleeping()
    await clock.advance(3.5)
    assert [b - beats[0] for b in beats] == [0.0, 1.0, 2.0, 3.0]
    assert clock.now() == wall + 3.5  # the wall clock moves with it
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await clock.advance(10.0)  # a cancelled sleeper is skipped
    assert len(beats) == 4 and clock.sleeping == 0


async def test_no_sleep_is_a_turn_of_the_loop_and_time_never_goes_back(clock: FakeClock) -> None:
    await asyncio.wait_for(clock.sleep(0), 1.0)
    with pytest.raises(ValueError, match="does not go back"):
        await clock.advance(-1.0)
    with pytest.raises(TimeoutError, match="0 of 1 sleepers"):
        await clock.until_sleeping(within=0.01)

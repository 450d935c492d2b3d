"""What the lifespan opens (service/runtime.py): one clock handed to every part."""

from __future__ import annotations

import pytest

from idpool.pool.clock import FakeClock
from idpool.pool.settings import Settings
from idpool.pool.stores import open_stores
from idpool.service.runtime import open_runtime
from idpool.service.status import STORE_READS_SECONDS

pytestmark = pytest.mark.anyio


async def test_one_clock_times_the_preloader_the_probes_and_the_pages(
    settings: Settings, clock: FakeClock
) -> None:
    run = await open_runtime(settings, open_stores, clock)
    try:
        assert run.clock is clock and run.preloader.clock is clock
        assert run.node.health.clock is clock  # the probes, and the source's view of them
        renders: list[float] = []

        async def render() -> bytes:
            renders.append(clock.monotonic())
            return b"page %d" % len(renders)

        assert await run.render_once_a_second("page", render) == b"page 1"
        await clock.advance(STORE_READS_SECONDS - 0.1)
        assert await run.render_once_a_second("page", render) == b"page 1"  # within a second
        await clock.advance(0.1)
        assert await run.render_once_a_second("page", render) == b"page 2"
        shot = await run.snapshot()
        assert shot["updated_at"] == round(clock.now(), 3)
    finally:
        await run.close()


async def test_the_node_its_kinds_and_its_logs_read_the_same_clock(
    settings: Settings, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    run = await open_runtime(settings, open_stores, clock)
    try:
        node = run.node
        assert node.clock is clock and node.context.clock is clock  # housekeeping, kinds
        assert node.stats.started_at == clock.now()  # /status.json's and the heartbeat's
        assert node.identity["started_at"] == f"{clock.now():.0f}"
        assert node.wall_clock() == clock.now()  # the dates of formatted IDs
        # event=request_failed at most once a second, by the clock
        with caplog.at_level("WARNING", logger="idpool.app"):
            for _ in range(3):
                run.failures.log("t", "down")
            await clock.advance(0.999)
            run.failures.log("t", "down")
            assert caplog.text.count("event=request_failed") == 1
            await clock.advance(0.001)
            run.failures.log("t", "down")
        assert caplog.text.count("event=request_failed") == 2
        assert "similar_since_last=3" in caplog.text
    finally:
        await run.close()

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

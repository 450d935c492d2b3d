"""Regressions (adversarial review of issue 24), both failing on main 854f735.

1. Two `tag add` of one new name with the same template race, and the loser's
`unfence_format` deletes the fingerprint of the tag the winner made and a node
already serves.

create_tag fences the format ('set' for the first caller, 'same' for the second),
then INSERTs. When the caller that got 'set' loses the INSERT to the one that got
'same', it "takes back" its fingerprint (compare-and-delete): but the fingerprint
is byte-for-byte the winner's (a template without obfuscation has no key), so the
live tag is left without one. A node that fenced the tag in between (once per
process, FormatFence.check_fence) never writes it again. The fence that the
design promises for a row deleted by hand ("a formatted name never comes back
plain") is then gone: the name comes back plain, and the plain tag's decimal
strings repeat the old '{id:b}' strings ('1000' was binary 8).

2. A node that served a formatted tag takes a format edited by hand into its
row at the next tag reload, unchecked: duplicate strings (second test).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pymysql
import pytest

from idpool.pool.claims import create_tag
from idpool.pool.errors import FormatChanged, TagExists
from idpool.pool.ledger import Ledger
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.tag_rules import format_fingerprint
from idpool.service.tag_fields import new_tag


class _HeldLedger:
    """A ledger whose add_tag waits until released: the INSERT comes late."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.fenced = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    async def add_tag(self, *args: Any, **kwargs: Any) -> Any:
        self.fenced.set()  # create_tag has fenced the format by now
        await self.release.wait()
        return await self._ledger.add_tag(*args, **kwargs)


def _delete_row(settings: Settings, tag: str) -> None:
    params = settings.mysql_params()
    conn = pymysql.connect(host=params.host, port=params.port, user=params.user,
                           database=params.database, autocommit=True)  # fmt: skip
    try:
        conn.cursor().execute("DELETE FROM idpool_tags WHERE tag = %s", (tag,))
    finally:
        conn.close()


def test_a_lost_add_race_keeps_the_winners_fingerprint(settings: Settings, tag: str) -> None:
    spec = new_tag({"tag": tag, "format": "{id:b}"}, 1000)

    async def go() -> None:
        ledger = await Ledger.connect(settings)
        pool = RedisPool.from_settings(settings)
        held = _HeldLedger(ledger)
        try:
            fields: dict[str, Any] = dict(
                step=spec.step, start=spec.start, end_id=spec.end_id,
                options=spec.options, secret=spec.secret,
            )  # fmt: skip
            first = asyncio.ensure_future(create_tag(held, pool, tag, **fields))  # type: ignore[arg-type]
            await held.fenced.wait()  # the first add fenced: 'set'
            row = await create_tag(ledger, pool, tag, **fields)  # the second: 'same', made
            # a node serves the tag: its first serve checks (and would write) the record
            fp = format_fingerprint(row.options, row.secret)
            assert await pool.fence_format(tag, fp, serving=True) == "same"
            await pool.raise_high_water(tag, 1000)  # it claimed 1..1000 and served them
            held.release.set()
            with pytest.raises(TagExists):
                await first
            # The live, served tag must keep its fingerprint.
            assert await pool.fence_format(tag, "", serving=False) == "other"
        finally:
            await pool.close()
            await ledger.close()

    asyncio.run(go())

    # What it fences: the row deleted by hand must not come back plain.
    _delete_row(settings, tag)

    async def again() -> None:
        ledger = await Ledger.connect(settings)
        pool = RedisPool.from_settings(settings)
        try:
            with pytest.raises(FormatChanged):
                await create_tag(ledger, pool, tag, step=1000, start=1)
        finally:
            await pool.close()
            await ledger.close()

    asyncio.run(again())


def test_a_running_node_does_not_take_a_format_edited_by_hand(settings: Settings, tag: str) -> None:
    """A node checks a formatted tag's fingerprint once per process (check_fence),
    but takes the row's options again at every tag reload (TagDirectory.formats is
    updated from the rows): a row edited by hand from 'H{id}' to 'H{id:x}' is then
    served by every node that served it before, with no check, and 51 renders
    'H33', 52 'H34'... strings that 33, 34... were. A node started after the edit
    refuses it (503), as docs/design/formats.md says every node does."""
    from starlette.testclient import TestClient

    from idpool.service.app import NodeApp, create_app

    with TestClient(create_app(settings.with_changes(admin_token="t"))) as c:
        r = c.post(
            "/admin/tags",
            json={"tag": tag, "step": 10, "format": "H{id}"},
            headers={"authorization": "Bearer t"},
        )
        assert r.status_code == 201, r.text
        seen = [c.get(f"/id/{tag}").text for _ in range(60)]
        params = settings.mysql_params()
        conn = pymysql.connect(host=params.host, port=params.port, user=params.user,
                               database=params.database, autocommit=True)  # fmt: skip
        try:
            conn.cursor().execute(
                "UPDATE idpool_tags SET options = %s WHERE tag = %s",
                ('{"format": "H{id:x}", "reset": null}', tag),
            )
        finally:
            conn.close()
        app = c.app
        assert isinstance(app, NodeApp) and app.node is not None and c.portal is not None
        c.portal.call(app.node.refresh_tags)  # what the reload loop does every few seconds
        for _ in range(60):
            r = c.get(f"/id/{tag}")
            if r.status_code != 200:
                assert r.status_code == 503, r.text  # refused, as a new node does
                break
            seen.append(r.text)
    repeated = sorted({s for s in seen if seen.count(s) > 1})
    assert not repeated, f"{len(repeated)} strings handed out twice: {repeated[:5]}"


def test_the_last_instant_before_midnight_is_rendered_with_its_own_day(
    settings: Settings, tag: str
) -> None:
    """datetime.fromtimestamp rounds to the microsecond: the last float before a
    UTC midnight (0.24 us before it, in 2026) renders as the next day, while the
    period (TagFormat.period) and the date cache's window compare the raw float.
    With a clock that only moves forward: a number of the 24th's row, taken at that
    instant, is rendered 'D20261125000000-2', which the 25th's row hands out again
    a moment later."""
    import math
    from datetime import UTC, datetime

    from starlette.testclient import TestClient

    from idpool.service.app import NodeApp, create_app

    midnight = datetime(2026, 11, 25, tzinfo=UTC).timestamp()
    now = [midnight - 1.5]
    with TestClient(create_app(settings.with_changes(admin_token="t"))) as c:
        app = c.app
        assert isinstance(app, NodeApp) and app.node is not None
        app.node.wall_clock = lambda: now[0]
        fields = {"tag": tag, "step": 100, "format": "D{date:%Y%m%d%H%M%S}-{id}", "reset": "daily"}
        r = c.post("/admin/tags", json=fields, headers={"authorization": "Bearer t"})
        assert r.status_code == 201, r.text
        seen = [c.get(f"/id/{tag}").text]  # 23:59:58.5: the 24th's row, number 1
        now[0] = math.nextafter(midnight, 0)  # the last instant of the 24th
        seen.append(c.get(f"/id/{tag}").text)  # the 24th's row, number 2
        now[0] = midnight + 0.1
        seen += [c.get(f"/id/{tag}").text for _ in range(3)]  # the 25th's row: 1, 2, 3
    assert len(set(seen)) == len(seen), seen

"""A tag is served only as the kind its row has now (issue 28, items 4 and 5).

4. During the documented rolling upgrade from the old key layout, nodes of the old
   release (7717122, before the ``kind`` column) serve every row as a segment tag:
   they claimed plain ranges from strict and snowflake rows (out of order; a small
   snowflake layout's numbers repeated). A row of another kind now stores its bound
   negated (``tag_rules.stored_end``): the old claim, run here verbatim, gets nothing.
5. A segment tag removed and added again as strict between two tag reloads of a
   node that held its buffer: the fast path went on serving that buffer, refilled
   by claims from the now-strict row, until it idled out. A name now keeps its
   kind for ever (its tombstone says which); and for a kind edited by hand, the
   ledger's claim checks the kind and a reload drops a buffer of another kind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from starlette.testclient import TestClient

from idpool.pool import claims
from idpool.pool.errors import KindChanged, KindKept, TagExhausted
from idpool.pool.ledger import Ledger
from idpool.pool.ranges import MAX_ID, IdRange
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.snowflake import Layout
from idpool.service.app import create_app
from idpool.service.kinds import SPECS, rules_of

from .test_kind_hand_edits import SMALL, _edit, _sql

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# -- the old release's claim, verbatim (pool/ledger.py and its cut() at 7717122) --


class OldTagDisabled(Exception):
    pass


class OldTagExhausted(Exception):
    pass


def old_cut(tag: str, start: int, ids: int, end_id: int, disabled: bool) -> IdRange:
    if disabled:
        raise OldTagDisabled(f"tag {tag!r} is disabled; enable it with `idpool tag enable {tag}`")
    if start >= end_id:
        bound = "64-bit IDs" if end_id >= MAX_ID else f"IDs up to its max {end_id - 1}"
        raise OldTagExhausted(f"tag {tag!r} has run out of {bound}")
    return IdRange(start, start + ids if start < end_id - ids else end_id)


def old_claim(settings: Settings, tag: str, ranges: int = 1) -> IdRange:
    """What a node or preloader of the old release runs to claim: one transaction."""
    conn = _sql(settings)
    try:
        conn.begin()
        cur = conn.cursor()
        cur.execute(
            "SELECT max_id, step, end_id, disabled FROM idpool_tags WHERE tag = %s FOR UPDATE",
            (tag,),
        )
        row = cur.fetchone()
        assert row is not None
        start, step, end_id, disabled = (int(v) for v in row)
        fresh = old_cut(tag, start, step * ranges, end_id, bool(disabled))
        cur.execute("UPDATE idpool_tags SET max_id = %s WHERE tag = %s", (fresh.end, tag))
        conn.commit()
        return fresh
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()


def old_preloader_fills(settings: Settings, tag: str) -> bool:
    """The old preloader's test of a row (``row.disabled or not row.left``: skipped)."""
    conn = _sql(settings)
    try:
        cur = conn.cursor()
        cur.execute("SELECT max_id, end_id, disabled FROM idpool_tags WHERE tag = %s", (tag,))
        max_id, end_id, disabled = cur.fetchone()  # type: ignore[misc]
        return not (disabled or not max(0, int(end_id) - int(max_id)))
    finally:
        conn.close()


def _add(settings: Settings, tag: str, **kw: object) -> None:
    async def go() -> None:
        ledger = await Ledger.connect(settings)
        pool = RedisPool.from_settings(settings)
        try:
            if "kind" in kw:
                kw["rules"] = rules_of(str(kw.pop("kind")))
            await claims.create_tag(ledger, pool, tag, **kw)  # type: ignore[arg-type]
        finally:
            await pool.close()
            await ledger.close()

    asyncio.run(go())


def _remove(settings: Settings, tag: str) -> None:
    async def go() -> None:
        ledger = await Ledger.connect(settings)
        pool = RedisPool.from_settings(settings)
        try:
            await claims.remove_tag(ledger, pool, tag)
        finally:
            await pool.close()
            await ledger.close()

    asyncio.run(go())


# Every kind whose row's end_id a release before kinds must not claim from (the
# registry's: a new kind is tested here by itself)
NEW_KINDS = [name for name, spec in SPECS.items() if spec.rules.end_negated]


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_the_old_release_claims_nothing_from_a_row_of_a_new_kind(
    settings: Settings, tag: str, kind: str
) -> None:
    layout = Layout(**SMALL).to_text() if "layout" in SPECS[kind].fields else ""
    _add(settings, tag, step=10, start=1, kind=kind, layout=layout)
    with pytest.raises(OldTagExhausted):
        old_claim(settings, tag)
    assert not old_preloader_fills(settings, tag)  # its preloader skips it too
    # An old CLI's `tag enable`, `tag step` and `tag start` write no end_id: still fenced.
    conn = _sql(settings)
    try:
        conn.cursor().execute(
            "UPDATE idpool_tags SET disabled = 0, step = 100, max_id = GREATEST(max_id, 5) "
            "WHERE tag = %s",
            (tag,),
        )
    finally:
        conn.close()
    with pytest.raises(OldTagExhausted):
        old_claim(settings, tag)

    async def new() -> tuple[IdRange, int | None]:
        ledger = await Ledger.connect(settings)
        try:
            row = await ledger.get_tag(tag)
            return await ledger.claim(tag, 1, kind), row.max
        finally:
            await ledger.close()

    got, top = asyncio.run(new())  # this release reads its bound back
    assert top is None and len(got) >= 1


def test_a_segment_row_is_claimed_by_the_old_release_as_before(
    settings: Settings, tag: str
) -> None:
    _add(settings, tag, step=10, start=1, end_id=1001)
    assert old_claim(settings, tag) == IdRange(1, 11)
    assert old_preloader_fills(settings, tag)

    async def new() -> tuple[int | None, IdRange]:
        ledger = await Ledger.connect(settings)
        try:
            return (await ledger.get_tag(tag)).max, await ledger.claim(tag)
        finally:
            await ledger.close()

    assert asyncio.run(new()) == (1000, IdRange(11, 21))


def test_a_bounded_strict_tag_keeps_its_bound(settings: Settings, tag: str) -> None:
    _add(settings, tag, step=10, start=1, end_id=26, kind="strict")

    async def new() -> list[IdRange]:
        ledger = await Ledger.connect(settings)
        try:
            assert (await ledger.get_tag(tag)).max == 25
            got = [await ledger.claim(tag, 1, "strict") for _ in range(3)]
            with pytest.raises(TagExhausted):
                await ledger.claim(tag, 1, "strict")
            return got
        finally:
            await ledger.close()

    assert asyncio.run(new()) == [IdRange(1, 11), IdRange(11, 21), IdRange(21, 26)]


def test_a_claim_of_one_kind_is_refused_on_a_row_of_another(settings: Settings, tag: str) -> None:
    _add(settings, tag, step=10, start=1, kind="strict")

    async def go() -> int:
        ledger = await Ledger.connect(settings)
        try:
            with pytest.raises(KindChanged, match="now a strict tag"):
                await ledger.claim(tag)  # a stale node's segment buffer
            return (await ledger.get_tag(tag)).max_id
        finally:
            await ledger.close()

    assert asyncio.run(go()) == 1  # nothing claimed


def _late(answers: list[int]) -> int:
    """Answers not above every answer before them (strict order broken)."""
    late, top = 0, 0
    for value in answers:
        if value <= top:
            late += 1
        top = max(top, value)
    return late


@pytest.mark.parametrize(("was", "now"), [("segment", "strict"), ("strict", "segment")])
def test_a_removed_name_comes_back_only_as_the_kind_it_was(
    settings: Settings, tag: str, was: str, now: str
) -> None:
    """A node holding the removed segment tag's buffer serves it until its next tag
    reload, or, paused, until it runs again: the name added again as strict would
    go down. So a name keeps its kind for ever (and the tombstone keeps it)."""
    _add(settings, tag, step=10, start=1, kind=was)
    _remove(settings, tag)
    with pytest.raises(KindKept, match=f"was a {was} tag"):
        _add(settings, tag, step=10, start=5_000_000, kind=now)
    _add(settings, tag, step=10, start=1, kind=was)  # as it was: fine


def test_a_claim_of_another_kind_drops_the_buffer_and_serves_the_row_as_it_is(
    settings: Settings, tag: str
) -> None:
    """A row's kind edited by hand (segment to strict) with no reload between the
    edit and the requests: the old buffer's claims are refused by the ledger, so it
    serves at most what it held, then the strict kind."""
    quiet = dataclasses.replace(settings, tag_reload_seconds=3600.0)
    _add(settings, tag, step=10, start=1)
    with TestClient(create_app(quiet)) as a, TestClient(create_app(quiet)) as b:
        node_a = a.app.node  # type: ignore[attr-defined]
        for _ in range(3):
            assert a.get(f"/id/{tag}").status_code == 200
        buf = node_a.buffers[tag]
        while buf.fetching:  # a prefetch claimed before the edit: the old kind's too
            time.sleep(0.01)
        held = buf.in_memory
        _edit(settings, "UPDATE idpool_tags SET kind = 'strict' WHERE tag = %s", tag)
        answers = []
        for i in range(120):
            got = (a if i % 2 else b).get(f"/id/{tag}")
            assert got.status_code == 200, got.text
            answers.append(int(got.text))
        assert tag not in node_a.buffers
        assert _late(answers) <= held  # the old buffer's IDs at most (before: ~half)
        assert len(set(answers)) == len(answers)


def test_a_reload_drops_the_buffer_of_a_row_whose_kind_changed(
    settings: Settings, tag: str
) -> None:
    quiet = dataclasses.replace(settings, tag_reload_seconds=3600.0)
    _add(settings, tag, step=1000, start=1)
    with TestClient(create_app(quiet)) as a, TestClient(create_app(quiet)) as b:
        node_a = a.app.node  # type: ignore[attr-defined]
        assert a.get(f"/id/{tag}").text == "1"
        _edit(settings, "UPDATE idpool_tags SET kind = 'strict' WHERE tag = %s", tag)
        a.portal.call(node_a.refresh_tags)  # what the reload loop does every few seconds
        assert tag not in node_a.buffers
        answers = [int((a if i % 2 else b).get(f"/id/{tag}").text) for i in range(40)]
        assert _late(answers) == 0 and answers[0] > 1000  # above the removed tag's

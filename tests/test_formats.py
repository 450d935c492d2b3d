"""Formatted tags on a node: templates, period sequences, obfuscation, bad templates.

Against the real MariaDB and Redis, through the admin API and the ID routes
(fast path and routes both), with the node's wall clock injected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from starlette.testclient import TestClient

from idpool.pool.ledger import Ledger
from idpool.pool.settings import Settings
from idpool.service.app import NodeApp, create_app
from idpool.service.formats import format_of

TOKEN = "admin-secret"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def at(text: str) -> float:
    """Unix seconds of a UTC time written ``2026-11-24 23:59:59.5``."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def admin(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        yield c


def node_of(client: TestClient) -> NodeApp:
    app = client.app
    assert isinstance(app, NodeApp) and app.node is not None
    return app


def add(client: TestClient, **fields: object) -> dict[str, object]:
    r = client.post("/admin/tags", json=fields, headers=AUTH)
    assert r.status_code == 201, r.text
    body: dict[str, object] = r.json()
    return body


def test_template_renders_on_id_ids_and_leaf_path(admin: TestClient, tag: str) -> None:
    clock = Clock(at("2026-11-24 10:00:00"))
    node_of(admin).node.wall_clock = clock  # type: ignore[union-attr]
    body = add(admin, tag=tag, step=10, format="INV-{date:%Y%m%d}-{id:06d}")
    assert body["format"] == {
        "format": "INV-{date:%Y%m%d}-{id:06d}",
        "reset": None,
        "obfuscate": False,
    }
    first = admin.get(f"/id/{tag}")  # the routes (no buffer yet)
    assert first.text == "INV-20261124-000001"
    assert admin.get(f"/id/{tag}").text == "INV-20261124-000002"  # the fast path
    assert admin.get(f"/api/segment/get/{tag}").text == "INV-20261124-000003"
    many = admin.get(f"/ids/{tag}?count=3").json()
    assert many == {"tag": tag, "ids": [f"INV-20261124-00000{i}" for i in (4, 5, 6)]}
    # more than the buffer holds: the route waits for a range
    batch = admin.get(f"/ids/{tag}?count=12").json()["ids"]
    assert batch == [f"INV-20261124-{i:06d}" for i in range(7, 19)]


def test_base62_and_base36(admin: TestClient, tag: str) -> None:
    add(admin, tag=tag, step=100, start=61, format="{id:b62}")
    assert [admin.get(f"/id/{tag}").text for _ in range(3)] == ["z", "10", "11"]
    other = tag + "x"
    add(admin, tag=other, step=100, start=35, format="K{id:04b36}")
    assert admin.get(f"/ids/{other}?count=2").json()["ids"] == ["K000z", "K0010"]


def test_daily_reset_restarts_each_day_and_midnight_between_fetch_and_use(
    admin: TestClient, tag: str
) -> None:
    clock = Clock(at("2026-11-24 23:59:59.5"))
    app = node_of(admin)
    assert app.node is not None
    app.node.wall_clock = clock
    add(admin, tag=tag, step=100, format="D{date:%Y%m%d}-{id}", reset="daily")
    assert admin.get(f"/id/{tag}").text == "D20261124-1"
    assert admin.get(f"/id/{tag}").text == "D20261124-2"  # from the buffer fetched above
    clock.now = at("2026-11-25 00:00:00.1")  # midnight between the range's fetch and its use
    assert admin.get(f"/id/{tag}").text == "D20261125-1"
    assert admin.get(f"/ids/{tag}?count=2").json()["ids"] == ["D20261125-2", "D20261125-3"]
    # a node whose clock is a second behind still renders the old period's numbers
    # with the old date: unique
    clock.now = at("2026-11-24 23:59:59.9")
    assert admin.get(f"/id/{tag}").text == "D20261124-3"
    rows = [t["tag"] for t in admin.get("/admin/tags", headers=AUTH).json()["tags"]]
    assert tag in rows and f"{tag}@20261124" not in rows  # period rows are not tags
    # a period's row is never served by its own name
    assert admin.get(f"/id/{tag}@20261125").status_code == 400


def test_a_batch_waits_across_midnight_takes_from_the_new_period(
    settings: Settings, tag: str
) -> None:
    async def go() -> None:
        from idpool.pool.claims import create_tag
        from idpool.pool.stores import open_stores
        from idpool.service.runtime import open_runtime
        from idpool.service.tag_fields import new_tag

        run = await open_runtime(settings, open_stores)
        try:
            clock = Clock(at("2026-11-24 23:59:59.9"))
            run.node.wall_clock = clock
            spec = new_tag(
                {"tag": tag, "step": 5, "format": "{date:%Y%m%d}{id:04d}", "reset": "daily"}, 5
            )
            await create_tag(run.ledger, run.pool, tag, step=5, start=1, options=spec.options)
            assert await run.node.next_id(tag) == "202611240001"
            fetch = run.node.source.fetch

            async def slow_fetch(name: str, ids: int) -> list:  # type: ignore[type-arg]
                clock.now = at("2026-11-25 00:00:01")  # midnight while the range is on its way
                return await fetch(name, ids)

            run.node.source.fetch = slow_fetch  # type: ignore[method-assign]
            for buf in run.node.buffers.values():
                buf._fetch = slow_fetch
            ids = await run.node.next_ids(tag, 8)  # more than the buffer holds: waits
            assert ids == [f"20261125{i:04d}" for i in range(1, 9)]
        finally:
            await run.stop()
            await run.close()

    asyncio.run(go())


def test_period_rows_are_made_once_and_fenced(
    settings: Settings, admin: TestClient, tag: str
) -> None:
    clock = Clock(at("2026-01-31 12:00:00"))
    node_of(admin).node.wall_clock = clock  # type: ignore[union-attr]
    add(admin, tag=tag, step=10, format="{date:%Y%m}-{id}", reset="monthly")
    assert admin.get(f"/id/{tag}").text == "202601-1"

    async def row_max() -> int:
        ledger = await Ledger.connect(settings)
        try:
            return (await ledger.get_tag(f"{tag}@202601")).max_id
        finally:
            await ledger.close()

    assert asyncio.run(row_max()) == 11


@pytest.mark.parametrize(
    ("fields", "code", "says"),
    [
        ({"format": "INV-{date:%Y%m%d}"}, "bad_format", "no {id}"),
        ({"format": "{id}{order}"}, "bad_format", "unknown field {order}"),
        ({"format": "{id:q}"}, "bad_format", "not an allowed id spec"),
        ({"format": "{{x}}{id}"}, "bad_format", "literal braces"),
        ({"format": "{id}" + "x" * 200}, "bad_format", "at most 128"),
        ({"format": "{id}{id}"}, "bad_format", "twice"),
        ({"format": "{date:%f}{id}"}, "bad_format", "%f is not allowed"),
        ({"format": "{id}-{date:%Y%m}", "reset": "daily"}, "bad_reset", "lacks %d (or %j"),
        ({"format": "{id}-{date:%y}", "reset": "yearly"}, "bad_reset", "%Y"),
        ({"format": "{id}", "reset": "hourly"}, "bad_reset", "daily, monthly, yearly"),
        ({"reset": "daily"}, "bad_reset", "needs a format"),
        ({"obfuscate": "yes"}, "bad_obfuscate", "true or false"),
        ({"format": 12}, "bad_format", "string"),
    ],
)
def test_bad_templates_are_refused_with_what_is_wrong(
    admin: TestClient, tag: str, fields: dict[str, object], code: str, says: str
) -> None:
    r = admin.post("/admin/tags", json={"tag": tag, **fields}, headers=AUTH)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == code
    assert says in r.json()["message"]
    assert admin.get(f"/id/{tag}").status_code == 404  # nothing was made


def test_obfuscated_numbers_are_unique_bounded_and_not_ascending(
    admin: TestClient, tag: str
) -> None:
    add(admin, tag=tag, step=50, obfuscate=True, max=2**53 - 1)
    first = admin.get(f"/id/{tag}")
    assert first.status_code == 200, first.text
    one = int(first.text)
    many = admin.get(f"/ids/{tag}?count=99").json()["ids"]
    assert all(isinstance(v, int) for v in many)  # numbers in JSON, not strings
    values = [one, *many]
    assert len(set(values)) == 100
    assert all(1 <= v <= 2**53 - 1 for v in values)
    assert values != sorted(values)
    listed = admin.get("/admin/tags", headers=AUTH).json()["tags"]
    shown = next(t for t in listed if t["tag"] == tag)
    assert shown["format"] == {"format": None, "reset": None, "obfuscate": True}
    shown_here = next(t for t in admin.get("/status.json").json()["tags"] if t["tag"] == tag)
    assert shown_here["format"] == "obfuscated"
    assert 'data-field="tags.0.format">obfuscated<' in admin.get("/status").text
    # the key is nowhere on the operator's pages
    key = _secret(admin, tag)
    for page in ("/admin/tags", "/status.json", "/status", "/metrics"):
        assert key not in admin.get(page, headers=AUTH).text


def _secret(client: TestClient, tag: str) -> str:
    app = node_of(client)
    assert app.node is not None
    row = app.node.tags.rows[tag]
    assert row.secret and row.secret not in repr(row)
    return row.secret


def test_plain_tags_are_untouched(admin: TestClient, tag: str) -> None:
    add(admin, tag=tag, step=10)
    assert admin.get(f"/id/{tag}").text == "1"
    assert admin.get(f"/ids/{tag}?count=2").json()["ids"] == [2, 3]
    app = node_of(admin)
    assert app.node is not None and tag not in app.node.tags.formats


def test_cli_add_list_and_decode(settings: Settings, tag: str) -> None:
    from .test_cli import idpool

    made = idpool(settings, "tag", "add", tag, "--format", "INV-{date:%Y%m%d}-{id:06d}")
    assert made.returncode == 0, made.stderr
    assert "format 'INV-{date:%Y%m%d}-{id:06d}'" in made.stdout
    listed = idpool(settings, "tag", "list")
    assert "format 'INV-{date:%Y%m%d}-{id:06d}'" in listed.stdout
    # Well spelt, but no number of the tag was issued yet: the ledger says so.
    decoded = idpool(settings, "tag", "decode", tag, "INV-20261124-001234")
    assert decoded.returncode == 2, decoded.stdout
    assert "was never issued" in decoded.stderr and "sequence number 1234" in decoded.stderr
    wrong = idpool(settings, "tag", "decode", tag, "INV-2026112x-00z234")
    assert wrong.returncode == 2 and "is not an ID of tag" in wrong.stderr
    hidden = tag + "o"
    made = idpool(settings, "tag", "add", hidden, "--obfuscate", "--max", "9007199254740991")
    assert made.returncode == 0, made.stderr
    assert "obfuscated" in idpool(settings, "tag", "list").stdout


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--format", "INV-{date:%Y%m%d}"], "--format 'INV-{date:%Y%m%d}' has no {id}"),
        (["--format", "{id}-{date:%Y}", "--reset", "daily"], "lacks %m and %d (or %j"),
        (["--format", "{nope}{id}"], "unknown field {nope}"),
        (["--reset", "daily"], "--reset needs a --format"),
    ],
)
def test_cli_refuses_bad_templates(
    settings: Settings, tag: str, options: list[str], says: str
) -> None:
    from .test_cli import idpool

    refused = idpool(settings, "tag", "add", tag, *options)
    assert refused.returncode == 2
    assert says in refused.stderr
    assert tag not in idpool(settings, "tag", "list").stdout


def test_admin_decode_dispatches_on_the_tag(admin: TestClient, tag: str) -> None:
    add(admin, tag=tag, obfuscate=True, max=10**6)
    values = admin.get(f"/ids/{tag}?count=5").json()["ids"]
    for n, value in enumerate(values, start=1):
        r = admin.get(f"/admin/tags/{tag}/decode", params={"value": str(value)}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["sequence"] == n
    bad = admin.get(f"/admin/tags/{tag}/decode", params={"value": "abc"}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"] == "bad_value"
    outside = admin.get(f"/admin/tags/{tag}/decode", params={"value": "0"}, headers=AUTH)
    assert outside.status_code == 400
    plain = tag + "p"
    add(admin, tag=plain, step=100)
    assert admin.get(f"/ids/{plain}?count=17").status_code == 200
    r = admin.get(f"/admin/tags/{plain}/decode", params={"value": "17"}, headers=AUTH)
    assert r.json()["sequence"] == 17
    # far above max_id (the next number a claim would take): a prefetch may claim
    # the next range between the listing and the decode (flaky under load)
    above = str(listed(admin, plain)["max_id"] + 10**6)
    never = admin.get(f"/admin/tags/{plain}/decode", params={"value": above}, headers=AUTH)
    assert never.status_code == 400 and never.json()["error"] == "bad_value"
    assert "never issued" in never.json()["message"]


def test_decode_refuses_numbers_never_issued(admin: TestClient, tag: str) -> None:
    """Decode checked the spelling only: a number the tag never handed out (at or
    above its row's max_id, or of a period with no row) decoded as if it had been."""

    def decoded(name: str, value: str) -> Any:
        return admin.get(f"/admin/tags/{name}/decode", params={"value": value}, headers=AUTH)

    add(admin, tag=tag, step=10, format="R{date:%Y%m%d}-{id}", reset="daily")
    issued = admin.get(f"/ids/{tag}?count=3").json()["ids"]  # the period's row claims 1..10
    day = issued[0][1:9]
    r = decoded(tag, issued[2])
    assert r.status_code == 200 and r.json()["sequence"] == 3 and r.json()["period"] == day
    top = listed(admin, tag)["periods"][day]  # the period row's max_id: claimed below it
    assert decoded(tag, f"R{day}-{top - 1}").status_code == 200  # claimed: maybe in a buffer
    # far above it: a prefetch may claim the next range meanwhile (so not max_id itself)
    ahead = top + 10**6
    for value, says in ((f"R{day}-{ahead}", "not issued yet"), ("R20000101-1", "period 20000101")):
        r = decoded(tag, value)
        assert r.status_code == 400 and r.json()["error"] == "bad_value", r.text
        assert "never issued" in r.json()["message"] and says in r.json()["message"]
    hidden = tag + "o"
    add(admin, tag=hidden, step=10, obfuscate=True, max=10**6)
    assert decoded(hidden, admin.get(f"/id/{hidden}").text).status_code == 200
    app = node_of(admin)
    assert app.node is not None
    fmt = format_of(app.node.tags.rows[hidden])
    assert fmt is not None and fmt.obfuscation is not None
    r = decoded(hidden, str(fmt.obfuscation.encode(listed(admin, hidden)["max_id"])))
    assert r.status_code == 400 and "never issued" in r.json()["message"]
    # Below its start: issued before a `tag start` moved it, or never (no telling).
    late = tag + "s"
    add(admin, tag=late, step=10, obfuscate=True, max=10**6)
    first = admin.get(f"/id/{late}").text
    moved = admin.patch(f"/admin/tags/{late}", json={"start": 1000}, headers=AUTH)
    assert moved.status_code == 200, moved.text
    assert decoded(late, first).status_code == 200  # issued: still decodes


def listed(admin: TestClient, tag: str) -> Any:
    """The tag as GET /admin/tags shows it (max_id, and a reset tag's periods)."""
    tags = admin.get("/admin/tags", headers=AUTH).json()["tags"]
    return next(t for t in tags if t["tag"] == tag)


def test_disabling_a_reset_tag_stops_its_period_buffers(admin: TestClient, tag: str) -> None:
    add(admin, tag=tag, step=100, format="{date:%Y%m%d}-{id}", reset="daily")
    assert admin.get(f"/id/{tag}").status_code == 200
    assert admin.get(f"/id/{tag}").status_code == 200  # the fast path, from the period buffer
    r = admin.patch(f"/admin/tags/{tag}", json={"disabled": True}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert admin.get(f"/id/{tag}").status_code == 410
    assert admin.get(f"/ids/{tag}?count=2").status_code == 410
    app = node_of(admin)
    assert app.node is not None
    assert not [name for name in app.node.buffers if name.startswith(f"{tag}@")]
    r = admin.patch(f"/admin/tags/{tag}", json={"disabled": False}, headers=AUTH)
    assert admin.get(f"/id/{tag}").status_code == 200


def test_embedded_mode_serves_formats(sqlite_settings: Settings, tag: str) -> None:
    with TestClient(create_app(sqlite_settings.with_changes(admin_token=TOKEN))) as c:
        clock = Clock(at("2026-11-24 23:59:59"))
        node = node_of(c).node
        assert node is not None
        node.wall_clock = clock
        add(c, tag=tag, step=10, format="E{date:%Y%m%d}-{id:03d}", reset="daily")
        assert c.get(f"/id/{tag}").text == "E20261124-001"
        clock.now = at("2026-11-25 00:00:01")
        assert c.get(f"/ids/{tag}?count=2").json()["ids"] == ["E20261125-001", "E20261125-002"]
        hidden = tag + "h"
        add(c, tag=hidden, obfuscate=True, max=1000)
        values = c.get(f"/ids/{hidden}?count=50").json()["ids"]
        assert len(set(values)) == 50 and all(1 <= v <= 1000 for v in values)


def test_formats_are_for_segment_tags_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from idpool.pool.errors import InvalidInput
    from idpool.service.kinds import KINDS, SegmentKind
    from idpool.service.tag_fields import new_tag

    monkeypatch.setitem(KINDS, "other", SegmentKind)  # a kind of ID of another engineer
    assert new_tag({"tag": "x", "kind": "other"}, 10).kind == "other"
    with pytest.raises(InvalidInput) as refused:
        new_tag({"tag": "x", "kind": "other", "format": "{id}"}, 10)
    assert refused.value.code == "bad_format" and "segment tags only" in str(refused.value)


def test_a_period_row_deleted_by_hand_is_made_again_above_its_mark(
    settings: Settings, tag: str
) -> None:
    import pymysql

    seen: list[str] = []
    for _ in range(2):
        with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
            node = node_of(c).node
            assert node is not None
            node.wall_clock = Clock(at("2026-03-05 10:00:00"))
            if not seen:
                add(c, tag=tag, step=10, format="{date:%Y%m%d}.{id}", reset="daily")
            seen += [c.get(f"/id/{tag}").text for _ in range(12)]
        # the row of that day deleted by hand (the node's remainder went back to its list)
        params = settings.mysql_params()
        conn = pymysql.connect(host=params.host, port=params.port, user=params.user,
                               database=params.database, autocommit=True)  # fmt: skip
        try:
            conn.cursor().execute("DELETE FROM idpool_tags WHERE tag = %s", (f"{tag}@20260305",))
        finally:
            conn.close()
    assert len(seen) == len(set(seen)) == 24  # made again above the mark: nothing repeats
    assert seen[:12] == [f"20260305.{i}" for i in range(1, 13)]


def test_a_format_this_node_cannot_read_is_refused_not_served_bare(
    admin: TestClient, tag: str
) -> None:
    import dataclasses

    add(admin, tag=tag, format="X{id}")
    app = node_of(admin)
    assert app.node is not None
    assert admin.get(f"/id/{tag}").text == "X1"
    tags = app.node.tags
    row = dataclasses.replace(tags.rows[tag], options='{"format": "X{id}", "reset": "hourly"}')
    # As a node reading the row first finds a newer idpool's options (a node that
    # knew the tag refuses any other options as changed: test_format_fence_race.py).
    tags.forget_format(tag)
    tags.added(row)
    assert tags.formats[tag] is None
    for path in (f"/id/{tag}", f"/ids/{tag}?count=2"):
        r = admin.get(path)
        assert r.status_code == 503 and "cannot read" in r.json()["message"], r.text


def test_the_preloader_skips_periods_that_ended() -> None:
    from idpool.pool.values import period_over, period_rows_between

    now = at("2026-11-24 00:00:01")
    assert period_over("inv@20261123", now) and not period_over("inv@20261124", now)
    assert period_over("inv@202610", now) and not period_over("inv@202611", now)
    assert period_over("inv@2025", now) and not period_over("inv@2026", now)
    assert not period_over("inv", now) and not period_over("a@b", now)
    low, high = period_rows_between("inv")
    assert low <= "inv@20261124" <= high and not low <= "inv" <= high
    assert not low <= "inv.x" <= high and not low <= "inv2" <= high


def test_the_preloader_fills_a_reset_tags_periods_not_its_own_row(
    settings: Settings, tag: str
) -> None:
    from idpool.pool.preloader import Preloader
    from idpool.pool.stores import open_stores

    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        add(c, tag=tag, step=10, format="{date:%Y%m%d}-{id}", reset="daily")
        plain = tag + "p"
        add(c, tag=plain, step=10)
        assert c.get(f"/id/{tag}").status_code == 200  # makes today's period row

    async def tick() -> set[str]:
        ledger, pool = await open_stores(settings)
        try:
            reports = await Preloader(settings, ledger, pool).refill_all()
            return {r.tag for r in reports if r.pushed}
        finally:
            await pool.close()
            await ledger.close()

    filled = asyncio.run(tick())
    assert plain in filled and tag not in filled
    assert any(t.startswith(f"{tag}@") for t in filled)


def test_a_reset_tags_lease_is_returned_to_its_period_row_with_the_tags_token(
    admin: TestClient, tag: str
) -> None:
    add(admin, tag=tag, step=100, format="{date:%Y%m%d}-{id}", reset="daily")
    token = admin.post(f"/admin/tags/{tag}/tokens", headers=AUTH).json()["token"]
    bearer = {"authorization": f"Bearer {token}"}
    leased = admin.post(f"/lease/{tag}?count=10", headers=bearer).json()
    (lease,) = leased["leases"]
    row = lease["sequence"]
    assert row.startswith(f"{tag}@") and lease["secret"] and "format" in leased
    back = {"lease": lease["lease"], "secret": lease["secret"], "tag": row, "from": 4}
    # the period row's return needs the tag's token, as the lease did
    assert admin.post("/lease/return", json=back).status_code == 401
    r = admin.post("/lease/return", json=back, headers=bearer)
    assert r.status_code == 200, r.text
    assert r.json()["tag"] == row and r.json()["count"] == 7

    from idpool_client.transport import Lease

    # the Python client sends the token of the tag, not of its period row
    assert Lease("l", row, 1, 11, secret="s").token_tag == tag
    assert Lease("l", tag, 1, 11).token_tag == tag


def _decoded(client: TestClient, tag: str, value: object) -> int:
    r = client.get(f"/admin/tags/{tag}/decode", params={"value": str(value)}, headers=AUTH)
    assert r.status_code == 200, r.text
    sequence: int = r.json()["sequence"]
    return sequence


def test_a_removed_formatted_tag_comes_back_only_with_its_format_and_key(
    admin: TestClient, tag: str
) -> None:
    app = node_of(admin)
    assert app.node is not None
    app.node.tags.min_interval = 0  # a name found unknown is not remembered as such
    add(admin, tag=tag, step=100, format="R-{id}", obfuscate=True, max=1000)
    old = [admin.get(f"/id/{tag}").text for _ in range(2)]  # the routes, then the fast path
    assert all(v.startswith("R-") for v in old)
    r = admin.delete(f"/admin/tags/{tag}", headers=AUTH)
    assert r.status_code == 200, r.text
    assert admin.get(f"/id/{tag}").status_code == 404
    assert admin.get(f"/ids/{tag}?count=2").status_code == 404
    # Another format, or none, could render the strings the removed tag handed out
    # (a new key maps a fresh number onto an old string; plain 1001.. could be an
    # old obfuscated number): refused, saying why and what to do.
    for fields in (
        {},
        {"format": "R-{id}"},
        {"format": "S-{id}", "obfuscate": True, "max": 1000},
        {"format": "R-{id}", "obfuscate": True, "max": 999},
    ):
        r = admin.post("/admin/tags", json={"tag": tag, "step": 100, **fields}, headers=AUTH)
        assert r.status_code == 409, (fields, r.text)
        assert r.json()["error"] == "format_changed"
        assert "choose a new name" in r.json()["message"]
    # The same format: the same key back, going on above all the removed tag claimed.
    add(admin, tag=tag, step=100, format="R-{id}", obfuscate=True, max=1000)
    new = [admin.get(f"/id/{tag}").text for _ in range(50)]
    assert not set(new) & set(old) and len(set(new)) == 50
    assert [_decoded(admin, tag, v) for v in old] == [1, 2]  # old IDs: the same key
    assert min(_decoded(admin, tag, v) for v in new) > 100


def test_a_formatted_row_deleted_by_hand_is_fenced_by_its_fingerprint(
    settings: Settings, tag: str
) -> None:
    import pymysql

    def delete_row(name: str) -> None:
        params = settings.mysql_params()
        conn = pymysql.connect(host=params.host, port=params.port, user=params.user,
                               database=params.database, autocommit=True)  # fmt: skip
        try:
            conn.cursor().execute("DELETE FROM idpool_tags WHERE tag = %s", (name,))
        finally:
            conn.close()

    plain = tag + "p"
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        add(c, tag=tag, step=10, format="H-{id}", obfuscate=True, max=1000)
        old = {c.get(f"/id/{tag}").text for _ in range(5)}
        add(c, tag=plain, step=10)
        assert c.get(f"/id/{plain}").text == "1"
    delete_row(tag)  # no tombstone: only Redis remembers the tag
    delete_row(plain)
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        # the same options make a new key: it would map fresh numbers onto old strings
        for name, fields in (
            (tag, {"format": "H-{id}", "obfuscate": True, "max": 1000}),
            (tag, {}),
            (plain, {"obfuscate": True, "max": 1000}),  # numbers issued bare: never formatted
        ):
            r = c.post("/admin/tags", json={"tag": name, "step": 10, **fields}, headers=AUTH)
            assert r.status_code == 409, (name, fields, r.text)
            assert r.json()["error"] == "format_changed"
        add(c, tag=plain, step=10)  # plain again: fenced by its mark, as before
        assert int(c.get(f"/id/{plain}").text) > 1  # (2-10 went back to its list unused)
    assert len(old) == 5


def test_a_template_row_deleted_by_hand_comes_back_with_the_same_template(
    settings: Settings, tag: str
) -> None:
    import pymysql

    seen: list[str] = []
    for round_ in range(2):
        with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
            if round_:
                r = c.post("/admin/tags", json={"tag": tag, "format": "T{id}0"}, headers=AUTH)
                assert r.status_code == 409 and r.json()["error"] == "format_changed", r.text
            add(c, tag=tag, step=10, format="T-{id:04d}")
            seen += [c.get(f"/id/{tag}").text for _ in range(5)]
        params = settings.mysql_params()
        conn = pymysql.connect(host=params.host, port=params.port, user=params.user,
                               database=params.database, autocommit=True)  # fmt: skip
        try:
            conn.cursor().execute("DELETE FROM idpool_tags WHERE tag = %s", (tag,))
        finally:
            conn.close()
    assert len(set(seen)) == 10 and seen[0] == "T-0001"


def test_the_embedded_tombstone_keeps_the_format(sqlite_settings: Settings, tag: str) -> None:
    with TestClient(create_app(sqlite_settings.with_changes(admin_token=TOKEN))) as c:
        add(c, tag=tag, step=10, format="E{id}", obfuscate=True, max=500)
        old = {c.get(f"/id/{tag}").text for _ in range(3)}
        assert c.delete(f"/admin/tags/{tag}", headers=AUTH).status_code == 200
        r = c.post("/admin/tags", json={"tag": tag, "step": 10}, headers=AUTH)
        assert r.status_code == 409 and r.json()["error"] == "format_changed", r.text
        add(c, tag=tag, step=10, format="E{id}", obfuscate=True, max=500)
        new = {c.get(f"/id/{tag}").text for _ in range(20)}
        assert not old & new


def test_step_on_a_reset_tag_changes_its_periods_and_start_is_refused(
    admin: TestClient, tag: str
) -> None:
    clock = Clock(at("2026-11-24 10:00:00"))
    node_of(admin).node.wall_clock = clock  # type: ignore[union-attr]
    add(admin, tag=tag, step=10, format="{date:%Y%m%d}-{id}", reset="daily")
    assert admin.get(f"/id/{tag}").text == "20261124-1"
    run_ledger = node_of(admin).node.source.claims.ledger  # type: ignore[union-attr]
    period = f"{tag}@20261124"

    async def row(name: str) -> tuple[int, int]:
        found = await run_ledger.get_tag(name)
        return found.step, found.max_id

    assert admin.portal is not None
    before = admin.portal.call(row, period)
    r = admin.patch(f"/admin/tags/{tag}", json={"step": 500}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert admin.portal.call(row, period)[0] == 500  # the period being served takes it
    assert admin.portal.call(row, tag)[0] == 500  # and so the periods to come
    # A start would act on the unused own row (or move a period's max_id): refused.
    r = admin.patch(f"/admin/tags/{tag}", json={"start": 5}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"] == "start_on_reset", r.text
    assert "nothing changed" in r.json()["message"]
    assert admin.portal.call(row, period)[1] == before[1]
    assert admin.get(f"/id/{tag}").text == "20261124-2"


def test_cli_step_and_start_on_a_reset_tag(settings: Settings, tag: str) -> None:
    from .test_cli import idpool

    made = idpool(settings, "tag", "add", tag, "--format", "{date:%Y%m%d}-{id}", "--reset",
                  "daily", "--step", "10")  # fmt: skip
    assert made.returncode == 0, made.stderr
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        assert c.get(f"/id/{tag}").status_code == 200  # today's period row
    stepped = idpool(settings, "tag", "step", tag, "300")
    assert stepped.returncode == 0 and "period rows" in stepped.stdout, stepped.stderr
    moved = idpool(settings, "tag", "start", tag, "1000")
    assert moved.returncode == 2 and "has a reset" in moved.stderr

    async def period_steps() -> list[int]:
        led = await Ledger.connect(settings)
        try:
            return [r.step for r in await led.list_tags() if r.tag.startswith(f"{tag}@")]
        finally:
            await led.close()

    assert asyncio.run(period_steps()) == [300]
    listed = idpool(settings, "tag", "list").stdout
    assert "periods: 1, latest" in listed and f"{tag}@" not in listed


@pytest.mark.parametrize(
    ("template", "value"),
    [
        ("INV-{date:%Y%m%d}-{id:06d}", "INV-20261124-00001"),  # too narrow
        ("INV-{date:%Y%m%d}-{id:06d}", "INV-20261124-0000001"),  # too wide
        ("INV-{date:%Y%m%d}-{id:06d}", "INV-20261324-000001"),  # a 13th month
        ("INV-{date:%Y%m%d}-{id:06d}", "INV-20260230-000001"),  # 30 February
        ("INV-{date:%Y%m%d}-{id:06d}", "INV-2026112x-000001"),
        ("INV-{date:%Y%m%d}-{id:06d}", "INV-20261124-+00001"),
        ("INV-{date:%Y%m%d}-{id:06d}", "INV-20261124-000000"),  # number 0: never made
        ("INV-{date:%Y%m%d}-{id:06d}", "inv-20261124-000001"),
        ("{id:b62}", "01"),  # a leading zero
        ("{id:b62}", "a-b"),  # outside the alphabet
        ("{id:b36}", "Z"),  # base 36 is lower case
        ("{id:,d}", "1234"),  # the grouping is part of the rendering
        ("{date:%Y}-{date:%j}-{id}", "2025-366-1"),  # 2025 has 365 days
        ("{date:%Y}-{id}-{date:%Y}", "2026-1-2027"),  # one date, two years
    ],
)
def test_decode_refuses_what_the_format_never_makes(
    admin: TestClient, tag: str, template: str, value: str
) -> None:
    add(admin, tag=tag, format=template)
    r = admin.get(f"/admin/tags/{tag}/decode", params={"value": value}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"] == "bad_value", r.text
    assert "is not an ID of tag" in r.json()["message"]


def test_decode_refuses_non_canonical_numbers(admin: TestClient, tag: str) -> None:
    add(admin, tag=tag, obfuscate=True, max=1000)
    value = admin.get(f"/id/{tag}").text
    assert _decoded(admin, tag, value) == 1
    plain = tag + "p"
    add(admin, tag=plain, max=100)
    for name, bad in ((tag, "0" + value), (tag, " " + value), (tag, "+" + value),
                      (plain, "017"), (plain, "1_7"), (plain, "\u0661"), (plain, "0"),
                      (plain, "101")):  # fmt: skip
        r = admin.get(f"/admin/tags/{name}/decode", params={"value": bad}, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"] == "bad_value", (name, bad, r.text)


def test_ended_periods_are_emptied_after_a_grace_and_never_restart(
    settings: Settings, tag: str
) -> None:
    import redis

    from idpool.pool.keys import Keys
    from idpool.pool.preloader import Preloader
    from idpool.pool.stores import open_stores

    from .conftest import REDIS_URL

    clock = Clock(at("2026-01-05 10:00:00"))
    seen: list[str] = []
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        node = node_of(c).node
        assert node is not None
        node.wall_clock = clock
        add(c, tag=tag, step=10, format="{date:%Y%m%d}-{id}", reset="daily")
        seen += [c.get(f"/id/{tag}").text for _ in range(3)]
    # the node's remainder went back to the list of 2026-01-05 at its stop
    keys = Keys(settings.redis_prefix)
    old = f"{tag}@20260105"
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        left = [tuple(map(int, t.split("-"))) for t in r.lrange(keys.pool(old), 0, -1)]
        assert left and left[0][0] == 4  # 4-10 (and a prefetched range, maybe)
        ids_left = sum(b - a + 1 for a, b in left)
        top = max(b for _, b in left)

        async def sweep() -> list[str]:
            ledger, pool = await open_stores(settings)
            try:
                pre = Preloader(settings, ledger, pool)
                pre.period_grace = 3600.0
                await pre.refill_all()  # the period ended long ago by the real clock
                found = pre.waste.totals().items()
                return [f"{t}={n} {why}" for (t, why), n in found if t.startswith(tag)]
            finally:
                await pool.close()
                await ledger.close()

        assert asyncio.run(sweep()) == [f"{old}={ids_left} period_ended"]  # counted waste
        assert r.llen(keys.pool(old)) == 0
        assert not r.exists(keys.stats(old)) and not r.exists(keys.clean(old))
        assert r.exists(keys.hwm(old))  # the fence stays, with the ledger row
    finally:
        r.close()
    # A node whose clock is still on that day (far behind) goes on above the period's
    # max_id: the cleanup never lets the period start from 1 again.
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        node = node_of(c).node
        assert node is not None
        node.wall_clock = clock
        seen += [c.get(f"/id/{tag}").text for _ in range(3)]
    assert seen[:3] == [f"20260105-{i}" for i in (1, 2, 3)]
    assert [int(v.split("-")[1]) for v in seen[3:]] == [top + 1, top + 2, top + 3]


def test_a_formatted_answer_the_client_never_got_is_counted_as_waste(
    admin: TestClient, tag: str
) -> None:
    from starlette.types import Message, Scope

    add(admin, tag=tag, step=100, format="W-{id:04d}")
    app = node_of(admin)
    assert admin.get(f"/id/{tag}").text == "W-0001"  # the buffer is made

    async def hung_up(path: str, query: bytes = b"") -> None:
        scope: Scope = {"type": "http", "method": "GET", "path": path, "root_path": ""}
        scope.update(query_string=query, headers=[], http_version="1.1", scheme="http")
        scope["state"] = admin.app_state.copy()

        async def receive() -> Message:
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            raise AssertionError("nothing is sent to a client that is gone")

        await app(scope, receive, send)

    assert admin.portal is not None
    admin.portal.call(hung_up, f"/id/{tag}")  # the fast path: W-0002
    admin.portal.call(hung_up, f"/ids/{tag}", b"count=3")  # W-0003..W-0005
    entry = next(t for t in admin.get("/status.json").json()["tags"] if t["tag"] == tag)
    assert entry["counters"]["ids_wasted"] == {"answer_undelivered": 4}
    assert admin.get(f"/id/{tag}").text == "W-0006"


def test_a_row_edited_by_hand_to_another_format_is_not_served(
    settings: Settings, tag: str
) -> None:
    import pymysql
    import redis

    from idpool.pool.keys import Keys

    from .conftest import REDIS_URL

    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        add(c, tag=tag, step=10, format="M-{id}", obfuscate=True, max=1000)
        first = c.get(f"/id/{tag}").text
    params = settings.mysql_params()
    conn = pymysql.connect(host=params.host, port=params.port, user=params.user,
                           database=params.database, autocommit=True)  # fmt: skip
    cur = conn.cursor()
    try:  # another key, by hand: fresh numbers could map onto strings already out
        cur.execute("SELECT secret FROM idpool_tags WHERE tag = %s", (tag,))
        (secret,) = cur.fetchone()  # type: ignore[misc]
        cur.execute("UPDATE idpool_tags SET secret = %s WHERE tag = %s", ("ab" * 16, tag))
        with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
            for path in (f"/id/{tag}", f"/ids/{tag}?count=2"):
                r = c.get(path)
                assert r.status_code == 503, r.text
                assert "not the one this name" in r.json()["message"]
            assert c.post(f"/lease/{tag}?count=5").status_code == 503
        cur.execute("UPDATE idpool_tags SET secret = %s WHERE tag = %s", (secret, tag))
    finally:
        conn.close()
    # A Redis that lost the record gets it back from the row a node serves.
    key = Keys(settings.redis_prefix).format(tag)
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        fingerprint = r.get(key)
        r.delete(key)
        with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
            assert c.get(f"/id/{tag}").text.startswith("M-")
        assert fingerprint and r.get(key) == fingerprint
    finally:
        r.close()
    assert first.startswith("M-")


def test_a_format_removed_or_added_by_hand_is_not_served_by_a_fresh_node(
    settings: Settings, tag: str
) -> None:
    """A fresh node served a row whose format was removed by hand as plain numbers
    (the old tag's strings were the same numbers, obfuscated: 12 repeats), and
    recorded a format added by hand to a plain tag as the name's first (194
    repeats, leases too). The name's record beside its mark refuses both."""
    import pymysql
    import redis

    from idpool.pool.keys import Keys

    from .conftest import REDIS_URL

    plain = tag + "p"
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        add(c, tag=tag, step=10, format="{id}", obfuscate=True, max=1000)
        add(c, tag=plain, step=10)
        assert c.get(f"/id/{tag}").status_code == 200
        assert c.get(f"/id/{plain}").text.isdigit()
    params = settings.mysql_params()
    conn = pymysql.connect(host=params.host, port=params.port, user=params.user,
                           database=params.database, autocommit=True)  # fmt: skip
    cur = conn.cursor()
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        cur.execute("SELECT options, secret FROM idpool_tags WHERE tag = %s", (tag,))
        options, secret = cur.fetchone()  # type: ignore[misc]
        cur.execute("UPDATE idpool_tags SET options = '', secret = '' WHERE tag = %s", (tag,))
        cur.execute(
            "UPDATE idpool_tags SET options = %s, secret = %s WHERE tag = %s",
            (options, secret, plain),
        )
        with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
            for name in (tag, plain):
                for path in (f"/id/{name}", f"/ids/{name}?count=2"):
                    got = c.get(path)
                    assert got.status_code == 503, (path, got.text)
                    assert "not the one this name" in got.json()["message"]
                assert c.post(f"/lease/{name}?count=5").status_code == 503
        # Edited back: served again, each as it always was.
        cur.execute(
            "UPDATE idpool_tags SET options = %s, secret = %s WHERE tag = %s",
            (options, secret, tag),
        )
        cur.execute("UPDATE idpool_tags SET options = '', secret = '' WHERE tag = %s", (plain,))
        # A plain name with no record (made with Redis down) gets one when first served.
        key = Keys(settings.redis_prefix).format(plain)
        assert r.get(key) == "plain"
        r.delete(key)
        with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
            assert c.get(f"/id/{tag}").status_code == 200
            assert c.get(f"/id/{plain}").text.isdigit()
        assert r.get(key) == "plain"
    finally:
        r.close()
        conn.close()


def test_cli_speaks_of_a_reset_tags_periods_not_its_own_row(settings: Settings, tag: str) -> None:
    """A reset tag's own row is never claimed from: disable, enable and remove named
    its max_id ("the next range claimed starts at 1") as if it said something."""
    from .test_cli import idpool

    fields = ("--format", "D{date:%Y%m%d}-{id}", "--reset", "daily")
    made = idpool(settings, "tag", "add", tag, *fields)
    assert made.returncode == 0, made.stderr
    off = idpool(settings, "tag", "disable", tag)
    assert off.returncode == 0 and "period rows and their max_id are kept" in off.stdout
    assert "max_id 1 " not in off.stdout
    on = idpool(settings, "tag", "enable", tag)
    assert on.returncode == 0 and "each period's numbers go on" in on.stdout
    assert "starts at" not in on.stdout
    asked = idpool(settings, "tag", "remove", tag)
    assert asked.returncode == 2 and "its period rows stay" in asked.stderr
    assert "starts at" not in asked.stderr
    gone = idpool(settings, "tag", "remove", tag, "--yes")
    assert gone.returncode == 0 and "its period rows stay" in gone.stdout, gone.stderr


def test_an_exhausted_period_is_named_as_the_period(admin: TestClient, tag: str) -> None:
    add(admin, tag=tag, step=2, max=2, format="E{date:%Y%m%d}-{id}", reset="daily")
    for _ in range(2):
        assert admin.get(f"/id/{tag}").status_code == 200
    r = admin.get(f"/id/{tag}")
    assert r.status_code == 503 and r.json()["error"] == "tag_exhausted", r.text
    day = datetime.now(UTC).strftime("%Y%m%d")
    assert f"tag {tag!r}, in today's period {day}" in r.json()["message"], r.text


def test_a_running_node_refuses_a_key_or_format_edited_under_it(
    settings: Settings, tag: str
) -> None:
    """At a reload a node took a row's edited key (or a format given to a plain tag)
    unchecked, and leased it to clients: refused now, on every path, until edited back."""
    import pymysql

    def edit(sql: str, *args: object) -> None:
        params = settings.mysql_params()
        conn = pymysql.connect(host=params.host, port=params.port, user=params.user,
                               database=params.database, autocommit=True)  # fmt: skip
        try:
            conn.cursor().execute(sql, args)
        finally:
            conn.close()

    plain = tag + "p"
    with TestClient(create_app(settings.with_changes(admin_token=TOKEN))) as c:
        app = node_of(c)
        assert app.node is not None and c.portal is not None
        add(c, tag=tag, step=10, obfuscate=True, max=1000)
        add(c, tag=plain, step=10)
        # an obfuscated tag's key goes only to a holder of its token
        token = c.post(f"/admin/tags/{tag}/tokens", headers=AUTH).json()["token"]
        holder = {"Authorization": f"Bearer {token}"}
        assert c.get(f"/id/{tag}", headers=holder).status_code == 200
        assert c.post(f"/lease/{tag}?count=2", headers=holder).status_code == 200
        assert c.get(f"/id/{plain}").text == "1"
        edit("UPDATE idpool_tags SET secret = %s WHERE tag = %s", "ab" * 16, tag)
        edit("UPDATE idpool_tags SET options = %s WHERE tag = %s", '{"format": "{id:x}"}', plain)
        c.portal.call(app.node.refresh_tags)
        for name in (tag, plain):
            for path in (f"/id/{name}", f"/ids/{name}?count=2", f"/api/segment/get/{name}"):
                r = c.get(path, headers=holder)
                assert r.status_code == 503 and "changed since" in r.json()["message"], r.text
            r = c.post(f"/lease/{name}?count=2", headers=holder)
            assert r.status_code == 503 and "format" not in r.json(), r.text
        edit("UPDATE idpool_tags SET options = '' WHERE tag = %s", plain)
        c.portal.call(app.node.refresh_tags)
        assert int(c.get(f"/id/{plain}").text) > 1  # edited back: served as it always was


def test_an_obfuscated_tags_key_is_leased_only_with_one_of_its_tokens(
    admin: TestClient, tag: str
) -> None:
    """Issue 28: an anonymous lease of an obfuscated tag without tokens answered its
    key, which undoes the obfuscation of every ID of the tag. Now 403, saying
    what to do; a token holder gets it; /id stays open."""
    add(admin, tag=tag, step=100, format="H-{id}", obfuscate=True, max=10**6)
    r = admin.post(f"/lease/{tag}?count=5")
    assert r.status_code == 403 and r.json()["error"] == "key_needs_token", r.text
    assert f"idpool tag token add {tag}" in r.json()["message"]
    secret = _row(admin, tag).secret
    assert "format" not in r.json() and secret and secret not in r.text
    assert admin.get(f"/id/{tag}").text.startswith("H-")
    token = admin.post(f"/admin/tags/{tag}/tokens", headers=AUTH).json()["token"]
    assert admin.post(f"/lease/{tag}?count=5").status_code == 401
    leased = admin.post(f"/lease/{tag}?count=5", headers={"authorization": f"Bearer {token}"})
    assert leased.status_code == 200 and leased.json()["format"]["key"]
    plain = tag + "f"  # a format without obfuscation has no key: leased as before
    add(admin, tag=plain, step=100, format="P-{id}")
    assert admin.post(f"/lease/{plain}?count=5").status_code == 200


def _values(client: TestClient, tag: str, n: int) -> list[int]:
    """The {id} values of the next n IDs (format 'D{date:%Y%m%d}-{id}')."""
    got = client.get(f"/ids/{tag}?count={n}").json()["ids"]
    return [int(x.rpartition("-")[2]) for x in got]


def test_each_period_of_an_obfuscated_reset_tag_has_its_own_key(
    admin: TestClient, tag: str
) -> None:
    """Issue 28: with one key for every period the n-th ID of every day rendered
    alike (INV-20261127-U0EOMl, INV-20261128-U0EOMl): day 1's values gave day 2's
    volume. A new tag's periods are keyed by HMAC(tag key, period); a lease
    carries its period's key only, and the client renders as the node does."""
    clock = Clock(at("2026-11-27 10:00:00"))
    node_of(admin).node.wall_clock = clock  # type: ignore[union-attr]
    add(admin, tag=tag, step=100, format="D{date:%Y%m%d}-{id}", reset="daily", obfuscate=True)
    day1 = _values(admin, tag, 50)
    clock.now = at("2026-11-28 10:00:00")
    day2 = _values(admin, tag, 50)
    assert day1 != day2 and len(set(day1) & set(day2)) < 5  # not the same permutation
    from idpool_client.formats import TagFormat, period_key

    row = _row(admin, tag)
    fmt = format_of(row)
    assert fmt is not None and fmt.period_keys and row.secret.startswith("period:")
    assert fmt.decode(f"D20261128-{day2[7]}") == 8 and fmt.decode(f"D20261127-{day1[7]}") == 8
    token = admin.post(f"/admin/tags/{tag}/tokens", headers=AUTH).json()["token"]
    body = admin.post(f"/lease/{tag}?count=10", headers={"authorization": f"Bearer {token}"}).json()
    assert "key" not in body["format"] and body["period"]["key"] == "20261128"
    assert fmt.obfuscation is not None
    assert body["format"]["period_key"] == period_key(fmt.obfuscation.key, "20261128").hex()
    client_fmt = TagFormat.from_json(body["format"])
    lease = body["leases"][0]
    for n in range(lease["first"], lease["last"] + 1):
        assert client_fmt.render(n, clock.now) == fmt.render(n, clock.now)


def _row(client: TestClient, tag: str) -> Any:
    """The tag's ledger row, read on the node's loop."""
    app = node_of(client)
    assert app.node is not None and client.portal is not None
    return client.portal.call(app.node.source.claims.ledger.get_tag, tag)


def test_an_obfuscated_reset_tag_from_before_keeps_its_one_key(admin: TestClient, tag: str) -> None:
    """A tag made before period keys (its secret the bare hex) keeps one key for
    every period: a number rendered under a new key could equal a string already
    handed out under the old one in the same period. Node and lease alike."""
    import dataclasses

    add(admin, tag=tag, step=100, format="D{date:%Y%m%d}-{id}", reset="daily", obfuscate=True)
    row = _row(admin, tag)
    old = row.secret.removeprefix("period:")
    fmt = format_of(dataclasses.replace(row, secret=old))
    assert fmt is not None and not fmt.period_keys
    one = fmt.render(5, at("2026-11-27 10:00:00")), fmt.render(5, at("2026-11-28 10:00:00"))
    assert one[0].rpartition("-")[2] == one[1].rpartition("-")[2]  # as it always rendered
    assert fmt.to_json(secret=True, period="20261127")["key"] == old

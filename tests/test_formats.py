"""Formatted tags on a node: templates, period sequences, obfuscation, bad templates.

Against the real MariaDB and Redis, through the admin API and the ID routes
(fast path and routes both), with the node's wall clock injected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from starlette.testclient import TestClient

from idpool.pool.ledger import Ledger
from idpool.pool.settings import Settings
from idpool.service.app import NodeApp, create_app

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
    decoded = idpool(settings, "tag", "decode", tag, "INV-20261124-001234")
    assert decoded.returncode == 0, decoded.stderr
    assert "sequence number 1234" in decoded.stdout
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
    add(admin, tag=plain)
    r = admin.get(f"/admin/tags/{plain}/decode", params={"value": "17"}, headers=AUTH)
    assert r.json()["sequence"] == 17


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
    tags.added(row)  # as a reload would find a newer idpool's options
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


def test_a_removed_formatted_tag_is_unknown_and_added_again_plain_is_plain(
    admin: TestClient, tag: str
) -> None:
    app = node_of(admin)
    assert app.node is not None
    app.node.tags.min_interval = 0  # a name found unknown is not remembered as such
    add(admin, tag=tag, step=100, format="R-{id}", obfuscate=True)
    assert admin.get(f"/id/{tag}").text.startswith("R-")
    assert admin.get(f"/id/{tag}").text.startswith("R-")  # the fast path
    r = admin.delete(f"/admin/tags/{tag}", headers=AUTH)
    assert r.status_code == 200, r.text
    assert admin.get(f"/id/{tag}").status_code == 404
    assert admin.get(f"/ids/{tag}?count=2").status_code == 404
    add(admin, tag=tag, step=100)  # the name again, without a format
    value = admin.get(f"/id/{tag}").text
    assert value.isdigit() and int(value) > 100  # plain, above all the old tag issued


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

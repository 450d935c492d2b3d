"""Rows of formatted tags edited by hand into strict ones, and dates never issued
(issue 24, the third attack on formats; each failed at 537a4e9). A strict tag
has no format: its first serve on a node checks the name's format record
(StrictKind._check_format) as a segment tag's does. Against the real MariaDB
and Redis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime

import pymysql
import pytest
from starlette.testclient import TestClient

from idpool.pool.clock import FakeClock
from idpool.pool.errors import InvalidInput
from idpool.pool.ledger import Ledger
from idpool.pool.settings import Settings
from idpool.service.app import create_app
from idpool.service.kinds.segment import DATE_AHEAD_SECONDS, check_issued, decode_segment
from idpool.service.tag_fields import new_tag

from .test_formats import AUTH, TOKEN, add


def _sql(settings: Settings) -> pymysql.connections.Connection:  # type: ignore[type-arg]
    params = settings.mysql_params()
    return pymysql.connect(host=params.host, port=params.port, user=params.user,
                           database=params.database, autocommit=True)  # fmt: skip


@pytest.fixture
def node_settings(settings: Settings) -> Iterator[Settings]:
    yield settings.with_changes(admin_token=TOKEN, step_seconds=0)


def test_a_formatted_tags_kind_edited_by_hand_to_strict_is_not_served_plain(
    node_settings: Settings, tag: str
) -> None:
    """Finding 1 (medium). The name's format record (idpool:{tag}:format) and the
    node's 'changed' check are only consulted on the segment paths
    (Node.buffer, FormattedTags.take/sequence, the lease route). A strict tag never
    runs check_fence, and NodeApp's strict fast path (and StrictKind) ignore
    `options` entirely. So editing only the row's `kind` to 'strict' (options and
    secret untouched: the fingerprint is the same) makes every node (a fresh one,
    and one that already served the tag) hand out the sequence as bare numbers.
    An obfuscated tag (`--max 200`) handed out P(1..20); the strict counter then
    hands out 41..200 as plain numbers: with real processes 17 of the 20 values
    came out a second time. A `{id:b}` tag edited to strict with options='' does
    the same (binary strings "10000"... are decimal numbers the sequence reaches).
    """
    with TestClient(create_app(node_settings)) as c:
        add(c, tag=tag, step=10, obfuscate=True, max=200)
        first = c.get(f"/ids/{tag}?count=20")
        assert first.status_code == 200, first.text
        issued = set(first.json()["ids"])
    conn = _sql(node_settings)
    try:
        conn.cursor().execute("UPDATE idpool_tags SET kind = 'strict' WHERE tag = %s", (tag,))
    finally:
        conn.close()
    # A fresh node: the row's options and secret are as recorded, only its kind moved.
    with TestClient(create_app(node_settings)) as c:
        again: list[int] = []
        for _ in range(20):
            got = c.get(f"/ids/{tag}?count=10")
            if got.status_code != 200:
                break
            again.extend(got.json()["ids"])
        repeated = sorted(issued.intersection(again))
        assert not repeated, f"handed out twice by {tag!r}: {repeated}"
        assert got.status_code == 503, got.text
        one = c.get(f"/id/{tag}")
        assert one.status_code == 503, one.text
        assert "a strict tag has no format, and its row carries one" in one.json()["message"]


def test_a_binary_formatted_tag_edited_to_strict_without_its_format_is_not_served(
    node_settings: Settings, tag: str
) -> None:
    """Finding 1, second form: the hole that 537a4e9 closed for segment rows
    (options='', secret='' by hand: a fresh node served the name's numbers bare)
    stays open when the same edit also sets kind='strict'. The name's record says
    it is formatted, but no strict path reads it."""
    with TestClient(create_app(node_settings)) as c:
        add(c, tag=tag, step=10, format="{id:b}")
        issued = set(c.get(f"/ids/{tag}?count=20").json()["ids"])  # "1" .. "10100"
    conn = _sql(node_settings)
    try:
        conn.cursor().execute(
            "UPDATE idpool_tags SET kind = 'strict', options = '', secret = '' WHERE tag = %s",
            (tag,),
        )
    finally:
        conn.close()
    with TestClient(create_app(node_settings)) as c:
        again: list[str] = []
        for _ in range(3):  # the strict counter, bare, up to past 10100
            got = c.get(f"/ids/{tag}?count=5000")
            if got.status_code != 200:
                break
            again.extend(str(n) for n in got.json()["ids"])
        repeated = sorted(issued.intersection(again), key=len)
        # "10000" (16), "10001" (17), ... "10100" (20): handed out a second time
        assert not repeated, f"handed out twice by {tag!r}: {repeated}"
        refused = c.get(f"/id/{tag}")
        assert refused.status_code == 503, refused.text
        assert "not the one this name was used with" in refused.json()["message"]


def test_decode_refuses_a_date_no_id_of_the_tag_was_ever_handed_out_with(
    node_settings: Settings, tag: str
) -> None:
    """Decode checked the number against the row's start and max_id, never the
    date: `D-2099-5` decoded as sequence number 5 of the tag. A date over a day
    ahead of the clock was never handed out (a client renders with its own clock,
    which may be ahead of the node's by a little). (A date
    in the past cannot be refuted from the ledger: a name removed and added again
    goes on above the strings its earlier rows made, before its row's created_at.)"""
    with TestClient(create_app(node_settings)) as c:
        add(c, tag=tag, step=10, format="D-{date:%Y}-{id}")
        served = c.get(f"/ids/{tag}?count=5").json()["ids"]
        assert all(s.startswith("D-2") for s in served)
        for value in ("D-2099-5", f"D-{int(served[0][2:6]) + 2}-5"):
            got = c.get(f"/admin/tags/{tag}/decode", params={"value": value}, headers=AUTH)
            assert got.status_code == 400, (value, got.text)
            assert got.json()["error"] == "bad_value"
            assert "(not issued yet): its date is" in got.json()["message"]
        ok = c.get(f"/admin/tags/{tag}/decode", params={"value": served[4]}, headers=AUTH)
        assert ok.status_code == 200 and ok.json()["sequence"] == 5, ok.text
        # A template without a year: any year renders alike, so nothing to refute.
        add(c, tag=tag + "m", step=10, format="M{date:%m}-{id}")
        month = c.get(f"/id/{tag}m").text
        decoded = c.get(f"/admin/tags/{tag}m/decode", params={"value": month}, headers=AUTH)
        assert decoded.status_code == 200, decoded.text


@pytest.mark.anyio
async def test_the_date_check_reads_the_nodes_clock(ledger: Ledger, tag: str) -> None:
    """Over a day ahead of the node's clock (pool/clock.py) a date was never handed
    out; within the day it may have been (a client's clock a little ahead)."""
    spec = new_tag({"tag": tag, "step": 10, "format": "D-{date:%Y}-{id}"}, 10)
    row = await ledger.add_tag(tag, step=10, start=1, options=spec.options)
    row = dataclasses.replace(row, max_id=100)  # numbers below 100 claimed
    found = decode_segment(row, "D-2099-5")
    new_year = datetime(2099, 1, 1, tzinfo=UTC).timestamp()
    ahead = FakeClock(now=new_year - DATE_AHEAD_SECONDS - 1)
    with pytest.raises(InvalidInput, match=r"\(not issued yet\): its date is 2099-01-01"):
        await check_issued(ledger, row, found, ahead)
    await check_issued(ledger, row, found, FakeClock(now=new_year - DATE_AHEAD_SECONDS + 1))


def test_a_strict_tag_given_a_format_by_hand_is_not_served(
    node_settings: Settings, tag: str
) -> None:
    """Finding 1, third form (a plain *strict* name is never recorded by serving).
    A strict tag is made with Redis down, as a plain one is (no record), but where
    a plain segment tag gets its 'plain' record at its first serve (Node.buffer),
    a strict tag never does: serving it never runs check_fence. Its row edited by
    hand to kind='segment' with an obfuscated format (max 200) is then first seen
    with no record: a fresh node writes the edited format as the name's and
    serves P(101..) over the 1..100 the strict tag handed out (24 of 50 repeated
    with real processes). A strict tag is now made only with Redis up (its strict
    state is fenced at add, issue 28), which also writes its 'plain' record: the
    same hand edit is refused by that record."""
    from .test_cli import idpool

    add = ("tag", "add", tag, "--strict", "--step", "10", "--max", "200")
    down = idpool(
        node_settings, *add, IDPOOL_REDIS_URL="redis://127.0.0.1:1/0", IDPOOL_STORE_TIMEOUT="0.5"
    )
    assert down.returncode == 3 and "nothing was made" in down.stderr, down.stderr
    made = idpool(node_settings, *add)
    assert made.returncode == 0, made.stderr
    with TestClient(create_app(node_settings)) as c:
        got = c.get(f"/ids/{tag}?count=100")
        assert got.status_code == 200, got.text
        issued = set(got.json()["ids"])
    options = '{"format": null, "reset": null, "obfuscate": true, "max": 200}'
    conn = _sql(node_settings)
    try:
        conn.cursor().execute(
            "UPDATE idpool_tags SET kind = 'segment', options = %s, secret = %s WHERE tag = %s",
            (options, "00112233445566778899aabbccddeeff", tag),
        )
    finally:
        conn.close()
    with TestClient(create_app(node_settings)) as c:
        got = c.get(f"/ids/{tag}?count=50")
        again = got.json().get("ids", []) if got.status_code == 200 else []
        repeated = sorted(issued.intersection(again))
        assert not repeated, f"handed out twice by {tag!r}: {repeated}"
        assert got.status_code == 503, got.text


def test_a_formatted_tag_edited_to_snowflake_or_a_snowflake_row_given_options_is_refused(
    node_settings: Settings, tag: str
) -> None:
    """A snowflake tag has no format either: a formatted tag whose kind was edited by
    hand to snowflake (options cleared: its record still names the format), and a
    snowflake row given options by hand, get no worker ID on a fresh node (503)."""
    flake = tag + "s"
    with TestClient(create_app(node_settings)) as c:
        add(c, tag=tag, step=10, obfuscate=True, max=10**6)
        assert c.get(f"/id/{tag}").status_code == 200
        add(c, tag=flake, kind="snowflake")
        assert c.get(f"/id/{flake}").status_code == 200
    conn = _sql(node_settings)
    try:
        cur = conn.cursor()
        cur.execute("SELECT layout FROM idpool_tags WHERE tag = %s", (flake,))
        (layout,) = cur.fetchone()  # type: ignore[misc]
        cur.execute(
            "UPDATE idpool_tags SET kind = 'snowflake', layout = %s, options = '', secret = '' "
            "WHERE tag = %s",
            (layout, tag),
        )
        cur.execute(
            "UPDATE idpool_tags SET options = %s, secret = %s WHERE tag = %s",
            ('{"format": "{id:x}", "reset": null, "obfuscate": false}', "", flake),
        )
    finally:
        conn.close()
    with TestClient(create_app(node_settings)) as c:
        for name, says in ((tag, "not the one this name was used with"),
                           (flake, "a snowflake tag has no format")):  # fmt: skip
            for path in (f"/id/{name}", f"/ids/{name}?count=3"):
                got = c.get(path)
                assert got.status_code == 503, (path, got.text)
                assert says in got.json()["message"], got.text
            granted = c.post(f"/worker/{name}?holder=h")
            assert granted.status_code == 503, granted.text


def test_decode_refuses_a_date_from_before_the_tag_was_made_unless_the_name_lived_before(
    node_settings: Settings, tag: str
) -> None:
    """Issue 29: `tag decode` accepted dates before the tag existed (a year-dated
    ID of 2001 for a tag made today). Refused when the date ends over a day before
    the row was made; a name removed and added again keeps them (its earlier
    tag's IDs are older than the row)."""
    with TestClient(create_app(node_settings)) as c:
        add(c, tag=tag, step=10, format="D-{date:%Y%m%d}-{id}")
        served = c.get(f"/ids/{tag}?count=3").json()["ids"]
        old = "D-20010101-2"
        got = c.get(f"/admin/tags/{tag}/decode", params={"value": old}, headers=AUTH)
        assert got.status_code == 400 and got.json()["error"] == "bad_value", got.text
        assert "before the tag was made" in got.json()["message"]
        ok = c.get(f"/admin/tags/{tag}/decode", params={"value": served[1]}, headers=AUTH)
        assert ok.status_code == 200 and ok.json()["sequence"] == 2, ok.text
        assert c.delete(f"/admin/tags/{tag}", headers=AUTH).status_code == 200
        add(c, tag=tag, step=10, format="D-{date:%Y%m%d}-{id}")
        again = c.get(f"/admin/tags/{tag}/decode", params={"value": old}, headers=AUTH)
        assert again.status_code == 200, again.text  # the name lived before: not refuted

"""Rows edited by hand between formatted, plain, strict and snowflake tags (the
fourth attack on "A name keeps its format", issue 24). Each test here failed at
6e8823c, where a snowflake name was recorded "plain" as a plain or strict one;
its record is now "snowflake:" and a hash of its layout (name_fingerprint).
Against the real MariaDB and Redis. What the attack found:

1. (high) The name's record (``idpool:{tag}:format``) reads ``plain`` for a snowflake
   tag as for a plain segment or strict tag, and nothing else tells a node which
   kind of numbers a name handed out. A snowflake tag's IDs are small with a small
   layout (30 bits of 100 ms, 1 worker bit, 1 sequence bit: ``unit << 2``), and its
   row's ``max_id`` counts worker grants (2, 3...). So one hand edit of ``kind``
   gets through every first-serve check (record ``plain`` == row plain):
   - snowflake -> segment: a fresh node serves ``max_id``.. (2, 3, 4...) over the
     generator's 400-odd values, on ``/ids`` and in leases; with real processes
     ``/ids?count=40`` handed out 8, 9, 12, 16, 17, 20, 40 again;
   - snowflake -> strict: the same from the strict counter;
   - segment -> snowflake (``kind`` and a ``layout``): worker grants pass, and the
     generator makes numbers the segment tag handed out (creation refuses such a
     name, ``NameUsedBefore``; the grant does not);
   - on a node that already serves the snowflake tag, after its tag reload: the
     fast path goes on with the generator, the routes (``/ids``, strict requests)
     serve the new kind's numbers over it;
   - a snowflake row deleted by hand: ``idpool tag add NAME`` (plain or ``--strict``)
     is accepted ("first ID 2": its mark counts grants) and repeats its IDs.
2. (medium) A snowflake row's ``layout`` edited by hand (its epoch moved later) is
   taken by a fresh node: the same worker ID makes, from the new epoch, the values it
   made under the old one seconds before (real processes: 7 of 16 repeated). No
   record or check covers the layout.
3. (low) A row's ``end_id`` edited above its obfuscation's ``max``: ``/ids`` answers
   500 (a ValueError in the rendering, the numbers lost), and ``POST /lease`` hands a
   client numbers its format cannot render (241..250 for max 200).
4. (low) Decode of a reset tag's value dated 9999-12-31 answers 500 (OverflowError
   in ``period_bounds``), not 400 ``bad_value``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pymysql
import pytest
import redis
from starlette.testclient import TestClient

from idpool.pool.keys import Keys
from idpool.pool.settings import Settings
from idpool.service.app import create_app
from idpool.service.kinds import SPECS

from .conftest import REDIS_URL
from .test_formats import AUTH, TOKEN, add

# 30 bits of 100 ms (3.4 years), 1 worker bit, 1 sequence bit: IDs are unit << 2 | w << 1 | s
SMALL = {"time_bits": 30, "worker_bits": 1, "sequence_bits": 1, "unit_ms": 100}
# What a snowflake tag's kind may be edited to by hand: every other kind of the registry
NOT_SNOWFLAKE = [name for name in SPECS if name != "snowflake"]


def _sql(settings: Settings) -> pymysql.connections.Connection:  # type: ignore[type-arg]
    params = settings.mysql_params()
    return pymysql.connect(host=params.host, port=params.port, user=params.user,
                           database=params.database, autocommit=True)  # fmt: skip


def _edit(settings: Settings, sql: str, *args: object) -> None:
    conn = _sql(settings)
    try:
        conn.cursor().execute(sql, args)
    finally:
        conn.close()


def _layout(settings: Settings, tag: str) -> str:
    conn = _sql(settings)
    try:
        cur = conn.cursor()
        cur.execute("SELECT layout FROM idpool_tags WHERE tag = %s", (tag,))
        (layout,) = cur.fetchone()  # type: ignore[misc]
        return str(layout)
    finally:
        conn.close()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _flakes(c: TestClient, tag: str, seconds: float) -> list[int]:
    """Snowflake IDs from ``/id`` for about ``seconds`` (2 per 100 ms unit here);
    stops at a refusal."""
    got: list[int] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        r = c.get(f"/id/{tag}")
        if r.status_code != 200:
            break
        got.append(int(r.text))
    return got


def _numbers(c: TestClient, tag: str, rounds: int = 3, count: int = 1000) -> list[int]:
    """What ``/ids`` hands out (up to ``rounds`` batches, until it refuses)."""
    got: list[int] = []
    for _ in range(rounds):
        r = c.get(f"/ids/{tag}?count={count}")
        if r.status_code != 200:
            break
        got.extend(int(v) for v in r.json()["ids"])
    return got


@pytest.fixture
def node_settings(settings: Settings) -> Iterator[Settings]:
    yield settings.with_changes(admin_token=TOKEN, step_seconds=0)


@pytest.mark.parametrize("kind", NOT_SNOWFLAKE)
def test_a_snowflake_tags_kind_edited_by_hand_does_not_repeat_its_ids(
    node_settings: Settings, tag: str, kind: str
) -> None:
    """Finding 1: a snowflake tag's kind edited by hand to segment or strict. Its
    record reads 'plain', as a plain tag's does, so a fresh node's first-serve check
    passes and serves the row's max_id (2: one worker grant) upwards, through the
    values the generator made (here ~400 and up: 10 s of 100 ms units, << 2)."""
    with TestClient(create_app(node_settings)) as c:
        add(c, tag=tag, kind="snowflake", epoch_ms=_now_ms() - 10_000, **SMALL)
        issued = set(_flakes(c, tag, 0.6))
    assert issued and max(issued) < 1000, issued
    _edit(node_settings, "UPDATE idpool_tags SET kind = %s WHERE tag = %s", kind, tag)
    with TestClient(create_app(node_settings)) as c:
        again = _numbers(c, tag)
        if SPECS[kind].leasable:
            leased = c.post(f"/lease/{tag}?count=1000")
            if leased.status_code == 200:
                for one in leased.json()["leases"]:
                    again.extend(range(one["first"], one["last"] + 1))
    repeated = sorted(issued.intersection(again))
    assert not repeated, f"handed out twice by {tag!r} ({kind}): {repeated}"


@pytest.mark.parametrize("kind", NOT_SNOWFLAKE)
def test_a_node_serving_a_snowflake_tag_does_not_serve_its_kind_edited_by_hand(
    node_settings: Settings, tag: str, kind: str
) -> None:
    """Finding 1 on a node that already serves the snowflake tag: after its tag
    reload the row reads segment (or strict); its fast path goes on making snowflake
    IDs from the generator, while what the fast path leaves to the routes (``/ids``
    of a count the generator cannot make at once, and every strict request) goes to
    the new kind: max_id (2) upwards, through the generator's values (real
    processes: 15 of the 15 snowflake IDs, on the node that made them)."""
    s = node_settings.with_changes(tag_reload_seconds=0.2, report_seconds=0.2)
    with TestClient(create_app(s)) as c:
        add(c, tag=tag, kind="snowflake", epoch_ms=_now_ms() - 10_000, **SMALL)
        issued = set(_flakes(c, tag, 0.6))
        _edit(s, "UPDATE idpool_tags SET kind = %s WHERE tag = %s", kind, tag)
        time.sleep(1.0)  # a few tag reloads
        again = _numbers(c, tag)
        again.extend(_flakes(c, tag, 0.3))
    repeated = sorted(issued.intersection(again))
    assert not repeated, f"handed out twice by {tag!r} ({kind}): {repeated}"


def test_a_plain_tags_kind_edited_by_hand_to_snowflake_does_not_repeat_its_ids(
    node_settings: Settings, tag: str
) -> None:
    """Finding 1, the other way: a plain segment tag that handed out 1..2000 edited by
    hand to kind snowflake with a small layout whose epoch is 10 s back. Creation
    refuses a snowflake tag under a used name (NameUsedBefore); the worker grant
    checks only that the row has no options and the name's record reads 'plain',
    which it does, so the generator makes ~400.. again."""
    with TestClient(create_app(node_settings)) as c:
        add(c, tag=tag, step=1000)
        issued = set(_numbers(c, tag, rounds=2))
    assert len(issued) == 2000
    layout = f"t30.w1.s1.u100.e{_now_ms() - 10_000}.l1000"
    _edit(
        node_settings,
        "UPDATE idpool_tags SET kind = 'snowflake', layout = %s WHERE tag = %s",
        layout,
        tag,
    )
    fast = node_settings.with_changes(worker_lease_seconds=1.0, worker_margin_seconds=0.2)
    with TestClient(create_app(fast)) as c:
        again: list[int] = []
        until = time.monotonic() + 4  # a new hash waits one quarantine (the 1 s lease)
        while time.monotonic() < until and len(again) < 6:
            r = c.get(f"/id/{tag}")
            if r.status_code == 200:
                again.append(int(r.text))
            else:
                time.sleep(0.2)
        granted = c.post(f"/worker/{tag}?holder=client")
    repeated = sorted(issued.intersection(again))
    assert not repeated, f"handed out twice by {tag!r}: {repeated}"
    assert not again and granted.status_code == 503, granted.text


@pytest.mark.parametrize("strict", [False, True])
def test_a_snowflake_name_whose_row_was_deleted_by_hand_is_not_added_again_plain(
    node_settings: Settings, tag: str, strict: bool
) -> None:
    """Finding 1, by the front door: a snowflake row deleted by hand (no tombstone),
    then `idpool tag add NAME` (or --strict). The name's record is 'plain' and its
    mark counts worker grants (2), so the add passes ("first ID 2") and the tag
    serves 2, 3, 4... through the snowflake IDs. (Added again as a snowflake it is
    refused: NameUsedBefore; formatted, FormatChanged.)"""
    with TestClient(create_app(node_settings)) as c:
        add(c, tag=tag, kind="snowflake", epoch_ms=_now_ms() - 10_000, **SMALL)
        issued = set(_flakes(c, tag, 0.6))
    _edit(node_settings, "DELETE FROM idpool_tags WHERE tag = %s", tag)
    with TestClient(create_app(node_settings)) as c:
        fields: dict[str, object] = {"tag": tag, "step": 1000}
        if strict:
            fields["kind"] = "strict"
        made = c.post("/admin/tags", json=fields, headers=AUTH)
        again = _numbers(c, tag) if made.status_code == 201 else []
    repeated = sorted(issued.intersection(again))
    assert not repeated, f"handed out twice by {tag!r}: {repeated}"
    assert made.status_code == 409, made.text


def test_a_snowflake_tags_epoch_edited_by_hand_does_not_repeat_its_ids(
    node_settings: Settings, tag: str
) -> None:
    """Finding 2: the layout of a snowflake tag edited by hand, its epoch moved 3 s
    later. Node A makes IDs for 4 s with worker 0 and stops (worker 0 released with
    its last time); a fresh node B is granted worker 0 again (lowest free, once its
    last unit has passed) and makes,
    from the new epoch, the units A made 3 s before: the same values. The floor of
    a worker ID is wall-clock ms, which an epoch moved later does not lift."""
    with TestClient(create_app(node_settings)) as a:
        add(a, tag=tag, kind="snowflake", epoch_ms=_now_ms() - 20_000, **SMALL)
        issued = set(_flakes(a, tag, 4.0))
    layout = _layout(node_settings, tag)
    parts = layout.split(".")
    epoch = next(int(p[1:]) for p in parts if p.startswith("e"))
    moved = ".".join(f"e{epoch + 3000}" if p.startswith("e") else p for p in parts)
    _edit(node_settings, "UPDATE idpool_tags SET layout = %s WHERE tag = %s", moved, tag)
    time.sleep(0.3)  # past the released worker's last unit: worker 0 is free again
    with TestClient(create_app(node_settings)) as b:
        again: list[int] = []
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            r = b.get(f"/id/{tag}")
            if r.status_code != 200:
                break
            again.append(int(r.text))
    repeated = sorted(issued.intersection(again))
    assert not repeated, f"handed out twice by {tag!r}: {repeated}"


def test_an_end_edited_above_the_obfuscations_max_is_refused_not_a_500(
    node_settings: Settings, tag: str
) -> None:
    """Finding 3 (low): end_id is not in the fingerprint. Raised by hand above the
    obfuscation's max, the node claims numbers its format cannot render: /ids
    answered 500 (ValueError: 201 is outside 1..200; the numbers are lost, uncounted),
    and a lease handed the client 201.. with the format (max 200), which cannot
    render them either."""
    with TestClient(create_app(node_settings)) as c:
        add(c, tag=tag, step=10, obfuscate=True, max=200)
        assert len(c.get(f"/ids/{tag}?count=200").json()["ids"]) == 200
        _edit(node_settings, "UPDATE idpool_tags SET end_id = 1000 WHERE tag = %s", tag)
    with TestClient(create_app(node_settings)) as c:
        got = c.get(f"/ids/{tag}?count=10")
        assert got.status_code != 500, got.text
        leased = c.post(f"/lease/{tag}?count=10")
        if leased.status_code == 200:
            top = leased.json()["format"]["max"]
            past = [one for one in leased.json()["leases"] if one["last"] > top]
            assert not past, f"leased numbers above the format's max {top}: {past}"


def test_decode_of_a_reset_tags_value_on_the_last_day_is_a_bad_value_not_a_500(
    node_settings: Settings, tag: str
) -> None:
    """Finding 4 (low): `D99991231-1` on a daily tag: period_bounds adds a day past
    datetime's range (OverflowError), answered 500 instead of 400 bad_value."""
    with TestClient(create_app(node_settings)) as c:
        add(c, tag=tag, step=10, format="D{date:%Y%m%d}-{id}", reset="daily")
        assert c.get(f"/id/{tag}").status_code == 200
        got = c.get(f"/admin/tags/{tag}/decode", params={"value": "D99991231-1"}, headers=AUTH)
        assert got.status_code == 400, got.text
        assert got.json()["error"] == "bad_value"


def test_a_snowflake_name_from_before_records_deleted_by_hand_is_not_added_again_plain(
    node_settings: Settings,
    tag: str,
) -> None:
    """Upgrade: a snowflake tag made and served before records (no record beside its
    mark), its row deleted by hand, was added again plain (the script found no
    record, and a plain add does not look at the mark) and repeated its IDs. Its
    worker keys in Redis tell the name was a snowflake tag's. Simulated by
    deleting the record the new code wrote."""
    with TestClient(create_app(node_settings)) as c:
        add(c, tag=tag, kind="snowflake", epoch_ms=_now_ms() - 10_000, **SMALL)
        issued = set(_flakes(c, tag, 0.6))
    assert issued
    # As the old version left the name: no record beside the mark.
    r = redis.Redis.from_url(REDIS_URL)
    try:
        assert r.delete(Keys(node_settings.redis_prefix).format(tag)) == 1
    finally:
        r.close()
    _edit(node_settings, "DELETE FROM idpool_tags WHERE tag = %s", tag)
    with TestClient(create_app(node_settings)) as c:
        made = c.post("/admin/tags", json={"tag": tag, "step": 1000}, headers=AUTH)
        again = _numbers(c, tag) if made.status_code == 201 else []
    repeated = sorted(issued.intersection(again))
    assert not repeated, f"handed out twice by {tag!r}: {repeated[:20]} ({len(repeated)})"
    assert made.status_code == 409, made.text

"""idpool_client/formats.py: rendering, periods, the obfuscation bijection."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from idpool_client.formats import (
    FormatError,
    Obfuscation,
    TagFormat,
    period_bounds,
    period_of_row,
    period_row,
)

MAX = 2**63 - 2  # the default bound: IDs below 2^63 - 1
keys = st.binary(min_size=16, max_size=16)
tops = st.one_of(st.integers(2, 5000), st.sampled_from([2**53 - 1, MAX, 2**40, 2**40 + 1]))


@settings(max_examples=300, deadline=None)
@given(key=keys, top=tops, data=st.data())
def test_obfuscation_is_a_bijection_of_1_to_top(key: bytes, top: int, data: st.DataObject) -> None:
    ob = Obfuscation(key, top)
    n = data.draw(st.integers(1, top))
    value = ob.encode(n)
    assert 1 <= value <= top  # in range
    assert ob.decode(value) == n  # decode(encode(x)) == x: one-to-one
    m = data.draw(st.integers(1, top))
    assert (ob.encode(m) == value) == (m == n)


@settings(max_examples=30, deadline=None)
@given(key=keys, top=st.integers(2, 3000))
def test_small_domains_are_permuted_whole(key: bytes, top: int) -> None:
    ob = Obfuscation(key, top)
    assert sorted(ob.encode(n) for n in range(1, top + 1)) == list(range(1, top + 1))


def test_obfuscated_numbers_do_not_ascend_and_the_key_is_hidden() -> None:
    ob = Obfuscation(b"k" * 16, MAX)
    values = [ob.encode(n) for n in range(1, 101)]
    assert values != sorted(values) and len(set(values)) == 100
    assert "kkkk" not in repr(ob) and "6b6b" not in repr(ob)
    assert "6b6b" not in repr(TagFormat("{id}", obfuscation=ob))
    other = Obfuscation(b"j" * 16, MAX)
    assert [other.encode(n) for n in range(1, 101)] != values  # the key matters


NOW = datetime(2026, 11, 24, 9, 5, 7, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("template", "n", "text"),
    [
        ("INV-{date:%Y%m%d}-{id:06d}", 1, "INV-20261124-000001"),
        ("INV-{date:%Y%m%d}-{id:06d}", 1234567, "INV-20261124-1234567"),
        ("{id}", 42, "42"),
        ("{id:b36}", 35, "z"),
        ("{id:b36}", 36, "10"),
        ("{id:b62}", 61, "z"),
        ("{id:b62}", 62, "10"),
        ("{id:06b62}", 62, "000010"),
        ("{id:,}", 1234567, "1,234,567"),
        ("{id:x}", 255, "ff"),
        ("T{date:%H:%M:%S}/{date:%j}/{id}", 7, "T09:05:07/328/7"),
        ("{date:%Y}%{id}", 3, "2026%3"),
    ],
)
def test_render(template: str, n: int, text: str) -> None:
    fmt = TagFormat(template)
    assert fmt.render(n, NOW) == text
    assert fmt.render_many([n, n], NOW) == [text, text]
    assert fmt.decode(text) == n
    if "b36" not in template and "b62" not in template:  # Python's own str.format agrees
        assert template.format(id=n, date=datetime.fromtimestamp(NOW, UTC)) == text


@settings(max_examples=200, deadline=None)
@given(
    a=st.integers(1, 10**12),
    b=st.integers(1, 10**12),
    spec=st.sampled_from(["", "06d", "b36", "04b36", "b62", "x", ",", "_"]),
    day_a=st.integers(0, 400),
    day_b=st.integers(0, 400),
)
def test_distinct_numbers_or_days_give_distinct_strings(
    a: int, b: int, spec: str, day_a: int, day_b: int
) -> None:
    fmt = TagFormat("{date:%Y%m%d}{id:" + spec + "}{date:%d}", reset="daily")
    ta, tb = NOW + 86400 * day_a, NOW + 86400 * day_b
    if (a, day_a) != (b, day_b):
        assert fmt.render(a, ta) != fmt.render(b, tb)


def test_the_date_cache_follows_the_clock() -> None:
    fmt = TagFormat("{date:%Y%m%d%H%M%S}-{id}")
    assert fmt.render(1, NOW) == "20261124090507-1"
    assert fmt.render(2, NOW + 1) == "20261124090508-2"
    assert fmt.render(3, NOW - 86400) == "20261123090507-3"


def test_periods() -> None:
    assert period_bounds("daily", NOW)[0] == "20261124"
    assert period_bounds("monthly", NOW)[0] == "202611"
    key, start, end = period_bounds("monthly", datetime(2026, 12, 31, tzinfo=UTC).timestamp())
    assert key == "202612" and end == datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    assert period_bounds("yearly", NOW)[0] == "2026"
    assert period_of_row(period_row("inv", "20261124")) == ("inv", "20261124")
    assert period_of_row("inv") is None


def test_json_round_trip_carries_the_key_only_when_asked() -> None:
    fmt = TagFormat("{id:b62}", None, Obfuscation(b"s" * 16, 2**53 - 1))
    assert "key" not in fmt.to_json(secret=False)
    again = TagFormat.from_json(fmt.to_json(secret=True))
    assert again.render(5, NOW) == fmt.render(5, NOW)


@pytest.mark.parametrize(
    "template", ["INV-{date:%Y\x00%m%d}-{id}", "A\n{id}", "{id}\r", "\u200b{id}"]
)
def test_control_characters_are_refused(template: str) -> None:
    # strftime stopped at the NUL: every day rendered 'INV-2026-1', a daily reset repeated
    with pytest.raises(FormatError, match="is not allowed"):
        TagFormat(template, reset="daily")


def test_bad_bounds() -> None:
    with pytest.raises(FormatError):
        Obfuscation(b"k" * 16, 1)
    with pytest.raises(FormatError):
        Obfuscation(b"k" * 16, 2**63)


class FakeTransport:
    """Leases of a daily tag: one per call, from the period ``period_of()`` names."""

    def __init__(self, fmt: TagFormat, now: list[float]) -> None:
        self.fmt, self.now = fmt, now
        self.timeout, self.servers = 1.0, ["x"]
        self.calls = {"lease": 0, "return": 0}
        self.returned: list[tuple[str, int, int]] = []
        self.next = {}  # period key -> next number

    def lease(self, tag: str, count: int) -> list[object]:
        from idpool_client import Lease

        key, since, until = self.fmt.period(self.now[0])
        first = self.next.get(key, 1)
        self.next[key] = first + 10
        self.calls["lease"] += 1
        return [Lease(f"l{key}{first}", period_row(tag, key), first, first + 10,
                      self.fmt, since, until)]  # fmt: skip

    def give_back(self, lease: object, start: int) -> int:
        self.returned.append((lease.tag, start, lease.end))  # type: ignore[attr-defined]
        return lease.end - start  # type: ignore[attr-defined]


def test_the_client_never_renders_a_number_outside_its_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import idpool_client.aio
    import idpool_client.sync
    from idpool_client import AsyncIdPoolClient, IdPoolClient

    fmt = TagFormat("{date:%Y%m%d}-{id}", reset="daily")
    now = [datetime(2026, 11, 24, 23, 59, 59, tzinfo=UTC).timestamp()]
    monkeypatch.setattr(idpool_client.sync.time, "time", lambda: now[0])
    client = IdPoolClient("http://127.0.0.1:9", return_at_exit=False)
    transport = FakeTransport(fmt, now)
    client.transport = transport  # type: ignore[assignment]
    assert [client.next_id("inv") for _ in range(3)] == [f"20261124-{i}" for i in (1, 2, 3)]
    now[0] += 2  # midnight: the lease of the 24th is cut off, one of the 25th leased
    assert client.next_id("inv") == "20261125-1"
    assert list(client.next_ids("inv", 2)) == ["20261125-2", "20261125-3"]
    client.close()
    assert ("inv@20261124", 4, 11) in transport.returned  # the old period's tail, to its row

    async def run() -> list[object]:
        now[0] = datetime(2026, 11, 26, 23, 59, 59, tzinfo=UTC).timestamp()
        aclient = AsyncIdPoolClient("http://127.0.0.1:9", return_at_exit=False)
        aclient.transport = FakeTransport(fmt, now)  # type: ignore[assignment]
        got = [await aclient.next_id("inv")]
        now[0] += 2
        got += [await aclient.next_id("inv"), *await aclient.next_ids("inv", 2)]
        await aclient.aclose()
        return got

    assert asyncio.run(run()) == ["20261126-1", "20261127-1", "20261127-2", "20261127-3"]


def test_threads_drawing_a_formatted_tag_never_get_one_id_twice() -> None:
    import threading

    from idpool_client import IdPoolClient, Lease

    fmt = TagFormat("F{id:08d}")

    class Counter:
        timeout, servers = 1.0, ["x"]

        def __init__(self) -> None:
            self.calls = {"lease": 0, "return": 0}
            self.next = 1
            self.lock = threading.Lock()

        def lease(self, tag: str, count: int) -> list[Lease]:
            with self.lock:
                first, self.next = self.next, self.next + 37
                self.calls["lease"] += 1
            return [Lease(f"l{first}", tag, first, first + 37, fmt)]

        def give_back(self, lease: Lease, start: int) -> int:
            return lease.end - start

    client = IdPoolClient("http://127.0.0.1:9", return_at_exit=False, max_count=37)
    client.transport = Counter()  # type: ignore[assignment]
    got: list[list[object]] = [[] for _ in range(8)]

    def draw(k: int) -> None:
        ids, one = client.ids("f"), client.next_id_for("f")
        for i in range(500):
            form = i % 4
            if form == 0:
                got[k].append(next(ids))
            elif form == 1:
                got[k].append(one())
            elif form == 2:
                got[k].append(client.next_id("f"))
            else:
                got[k].extend(client.next_ids("f", 3))

    threads = [threading.Thread(target=draw, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()
    everything = [v for part in got for v in part]
    assert len(everything) == 8 * 125 * 6
    assert len(set(everything)) == len(everything)  # no ID twice
    assert all(isinstance(v, str) and v.startswith("F") for v in everything)
    numbers = sorted(int(str(v)[1:]) for v in everything)
    assert numbers == list(range(1, len(numbers) + 1))  # none skipped while drawn


class LaggingTransport(FakeTransport):
    """A node whose clock is five seconds behind the client's; it refuses to lease
    more than 20 times (a client that kept asking would otherwise never stop)."""

    def lease(self, tag: str, count: int) -> list[object]:
        if self.calls["lease"] >= 20:
            raise RuntimeError("leased 20 times: the client keeps asking")
        real = self.now[0]
        self.now[0] = real - 5
        try:
            return super().lease(tag, count)
        finally:
            self.now[0] = real


def test_a_node_clock_behind_at_midnight_costs_one_lease_not_a_storm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The client's clock is past midnight, the node's not yet: the node's leases are
    # of the old period. They are used, rendered at its last moment (unique: numbers
    # of that period's row), rather than cut off and leased again until the clocks
    # agree (a lease storm, each one twice the last, that stalled next_id and used up
    # a bounded tag's period).
    import idpool_client.aio
    import idpool_client.sync
    from idpool_client import AsyncIdPoolClient, IdPoolClient

    fmt = TagFormat("{date:%Y%m%d}-{id}", reset="daily")
    now = [datetime(2026, 11, 25, 0, 0, 1, tzinfo=UTC).timestamp()]
    monkeypatch.setattr(idpool_client.sync.time, "time", lambda: now[0])
    client = IdPoolClient("http://127.0.0.1:9", return_at_exit=False)
    transport = LaggingTransport(fmt, now)
    client.transport = transport  # type: ignore[assignment]
    assert client.next_id("inv") == "20261124-1"
    assert list(client.next_ids("inv", 2)) == ["20261124-2", "20261124-3"]
    assert transport.calls["lease"] <= 2  # the lease and the prefetch of the next
    client.close()

    async def run() -> tuple[list[object], int]:
        now[0] = datetime(2026, 11, 27, 0, 0, 1, tzinfo=UTC).timestamp()
        aclient = AsyncIdPoolClient("http://127.0.0.1:9", return_at_exit=False)
        aclient.transport = atransport = LaggingTransport(fmt, now)  # type: ignore[assignment]
        got = [await aclient.next_id("inv"), *await aclient.next_ids("inv", 2)]
        await aclient.aclose()
        return got, atransport.calls["lease"]

    got, leases = asyncio.run(run())
    assert got == ["20261126-1", "20261126-2", "20261126-3"] and leases <= 2


class MidnightAnswer(FakeTransport):
    """A lease asked for at 23:59:59 whose answer comes in after midnight."""

    def lease(self, tag: str, count: int) -> list[object]:
        leases = super().lease(tag, count)
        self.now[0] += 2 if self.calls["lease"] == 1 else 0
        return leases


def test_a_lease_asked_before_midnight_and_answered_after_is_still_cut_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not late (the node's clock is not behind): its numbers are not rendered with
    # yesterday's date for the rest of its life; the next lease is of the new day.
    import idpool_client.sync
    from idpool_client import IdPoolClient

    fmt = TagFormat("{date:%Y%m%d}-{id}", reset="daily")
    now = [datetime(2026, 11, 24, 23, 59, 59, tzinfo=UTC).timestamp()]
    monkeypatch.setattr(idpool_client.sync.time, "time", lambda: now[0])
    client = IdPoolClient("http://127.0.0.1:9", return_at_exit=False)
    client.transport = MidnightAnswer(fmt, now)  # type: ignore[assignment]
    # Asked for at 23:59:59, handed out once its lease came in, after midnight:
    # that lease is not late, so it is cut off, never rendered with the new date
    # nor used for the rest of its life with the old one; the ID is the new day's.
    assert client.next_id("inv") == "20261125-1"
    assert client.next_id("inv") == "20261125-2"
    client.close()
    # the cut-off lease went back whole to yesterday's row: none of it was used
    assert ("inv@20261124", 1, 11) in client.transport.returned  # type: ignore[attr-defined]


TEMPLATES = [
    "INV-{date:%Y%m%d}-{id:06d}",
    "{id:b62}",
    "K{id:04b36}",
    "{date:%Y}-{date:%j}.{id:,d}",
    "{date:%y%m}/{id:x}",
    "{id:8d}|{date:%H:%M:%S}%",
    "{date:%Y%m%d%%}{id:_b}",
]


@settings(max_examples=300, deadline=None)
@given(
    template=st.sampled_from(TEMPLATES),
    n=st.integers(1, 10**12),
    moment=st.integers(0, 4_102_444_799),  # 1970 to 2099
    edit=st.tuples(st.integers(0, 40), st.sampled_from("0123456789aZ -_,%|/:")),
    obfuscate=st.booleans(),
)
def test_decode_takes_back_only_what_render_makes(
    template: str, n: int, moment: int, edit: tuple[int, str], obfuscate: bool
) -> None:
    ob = Obfuscation(b"k" * 16, 2**63 - 2) if obfuscate else None
    fmt = TagFormat(template, None, ob)
    text = fmt.render(n, moment)
    assert isinstance(text, str)
    assert fmt.decode(text) == n
    # Any string decode accepts renders back to itself: changed by one character
    # (replaced, inserted or removed), it is refused or is another ID of the format.
    at, char = edit
    at %= len(text) + 1
    for changed in (text[:at] + char + text[at + 1 :], text[:at] + char + text[at:],
                    text[:at] + text[at + 1 :]):  # fmt: skip
        try:
            m = fmt.decode(changed)
        except ValueError:
            continue
        moment_of_changed = fmt._split(changed)[1]
        assert fmt.render(m, moment_of_changed) == changed


@pytest.mark.parametrize(
    ("template", "text", "says"),
    [
        ("INV-{date:%Y%m%d}-{id:06d}", "INV-20261124-00001", "renders as"),
        ("INV-{date:%Y%m%d}-{id:06d}", "INV-20261324-000001", "no UTC date"),
        ("INV-{date:%Y%m%d}-{id:06d}", "INX-20261124-000001", "lacks 'INV-'"),
        ("INV-{date:%Y%m%d}-{id:06d}", "INV-2026", "not the 2 digits of %m"),
        ("{id}-{date:%Y}", "202", "too short"),
        ("{id:b62}", "0z", "renders as"),
        ("{id:b36}", "A", "not a base-36 number"),
        ("{date:%Y}{id}", "1969" + "5", "before any ID was made"),
    ],
)
def test_decode_says_what_does_not_match(template: str, text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        TagFormat(template).decode(text)


def test_decode_of_a_bare_number_is_canonical() -> None:
    plain = TagFormat()
    assert plain.decode("17") == 17 and plain.decode(17) == 17
    for bad in ("017", "+17", " 17", "1_7", "\u0661\u0667", "0", "-1", ""):
        with pytest.raises(ValueError):
            plain.decode(bad)
    ob = TagFormat(None, None, Obfuscation(b"k" * 16, 1000))
    value = ob.render(3, 0)
    assert ob.decode(value) == 3 and ob.decode(str(value)) == 3
    for bad in ("0" + str(value), "1001", "0"):
        with pytest.raises(ValueError):
            ob.decode(bad)


def test_the_last_float_before_midnight_renders_and_chooses_its_own_day() -> None:
    """fromtimestamp rounds to the microsecond: the last float before a UTC midnight
    rendered as the next day, while the period compared the raw float (old day)."""
    import math

    from idpool_client.formats import period_bounds, whole_second

    midnight = datetime(2026, 11, 25, tzinfo=UTC).timestamp()
    last = math.nextafter(midnight, 0)
    assert whole_second(last) == midnight - 1
    fmt = TagFormat("D{date:%Y%m%d}-{id}", "daily")
    assert fmt.period(last)[0] == period_bounds("daily", last)[0] == "20261124"
    assert fmt.render(7, last) == "D20261124-7"  # cold cache
    assert fmt.render(8, midnight) == "D20261125-8"
    assert fmt.render_many([9], last) == ["D20261124-9"]  # the cache window, from the other side
    seconds = TagFormat("{date:%H%M%S}-{id}")
    assert seconds.render(1, last) == "235959-1" and seconds.render(2, midnight) == "000000-2"

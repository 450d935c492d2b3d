"""Formatted tags with real `idpool serve` processes: the Python client renders
as the nodes do, and no formatted ID repeats through node restarts (SIGTERM and
kill -9)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from idpool_client import AsyncIdPoolClient, IdPoolClient

from idpool.pool.claims import create_tag
from idpool.pool.ledger import Ledger
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.tokens import hash_token
from idpool.service.formats import format_of
from idpool.service.tag_fields import new_tag
from ops.toolkit import NodeProcess, env_with

from .conftest import MYSQL_URL, REDIS_URL, new_name


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[Settings, dict[str, str]]]:
    settings = Settings(mysql_url=MYSQL_URL, redis_url=REDIS_URL, redis_prefix=new_name("idpf"))
    env = env_with(
        IDPOOL_MYSQL_URL=settings.mysql_url,
        IDPOOL_REDIS_URL=settings.redis_url,
        IDPOOL_REDIS_PREFIX=settings.redis_prefix,
    )
    yield settings, env
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{settings.redis_prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def make_tag(settings: Settings, token: str | None = None, **fields: object) -> str:
    """A new tag; with ``token``, guarded by it (an obfuscated tag's key is leased
    only to a holder of one of its tokens)."""
    tag = new_name("ftag")

    async def go() -> None:
        spec = new_tag({"tag": tag, **fields}, 1000)
        ledger = await Ledger.connect(settings)
        pool = RedisPool.from_settings(settings)
        try:
            await create_tag(
                ledger,
                pool,
                tag,
                step=spec.step,
                start=spec.start,
                end_id=spec.end_id,
                options=spec.options,
                secret=spec.secret,
            )
            if token is not None:
                await ledger.add_token(tag, "t1", hash_token(token))
        finally:
            await pool.close()
            await ledger.close()

    asyncio.run(go())
    return tag


async def _read_row(settings: Settings, tag: str) -> Any:
    ledger = await Ledger.connect(settings)
    try:
        return await ledger.get_tag(tag)
    finally:
        await ledger.close()


def get(url: str, token: str | None = None) -> str:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return str(r.read().decode())


def draw(node: NodeProcess, tag: str, n: int, token: str | None = None) -> list[object]:
    out: list[object] = [get(f"{node.base_url}/id/{tag}", token) for _ in range(n)]
    out += json.loads(get(f"{node.base_url}/ids/{tag}?count={n}", token))["ids"]
    return out


def test_obfuscated_and_daily_ids_never_repeat_through_restarts(
    stores: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    settings, env = stores
    hidden = make_tag(settings, step=40, obfuscate=True, max=2**53 - 1)
    daily = make_tag(settings, step=40, format="D{date:%Y%m%d}-{id:05d}", reset="daily")
    node = NodeProcess(env, tmp_path / "node").start()
    seen: dict[str, list[object]] = {hidden: [], daily: []}
    try:
        for restart in ("term", "kill9", "term"):
            for tag in seen:
                seen[tag] += draw(node, tag, 30)
            if restart == "kill9":
                node.kill9()
            else:
                node.stop()
            node.start()
        for tag in seen:
            seen[tag] += draw(node, tag, 30)
    finally:
        node.stop()
    numbers = [int(str(v)) for v in seen[hidden]]
    assert len(numbers) == len(set(numbers)) == 240  # unique
    assert all(1 <= v <= 2**53 - 1 for v in numbers)
    assert numbers != sorted(numbers)  # not ascending
    strings = [str(v) for v in seen[daily]]
    assert len(strings) == len(set(strings)) == 240
    assert all(re.fullmatch(r"D\d{8}-\d{5}", s) for s in strings)


def test_the_client_renders_as_the_node_does(
    stores: tuple[Settings, dict[str, str]], tmp_path: Path
) -> None:
    settings, env = stores
    invoices = make_tag(settings, step=50, format="INV-{date:%Y%m%d}-{id:06d}", reset="daily")
    short = make_tag(settings, step=50, format="{id:b62}", obfuscate=True, token="short-token")
    # a reset tag with period keys: the lease carries its period's key only
    daily = make_tag(
        settings,
        token="daily-token",
        step=50,
        format="H{date:%Y%m%d}-{id:b62}",
        reset="daily",
        obfuscate=True,
    )
    tokens = {short: "short-token", daily: "daily-token"}
    node = NodeProcess(env, tmp_path / "node").start()
    try:
        over_http = draw(node, invoices, 5)
        hidden = draw(node, daily, 5, tokens[daily])
        with IdPoolClient(node.base_url, return_at_exit=False, tokens=tokens) as client:
            mine = [client.next_id(invoices) for _ in range(5)]
            mine += list(client.next_ids(invoices, 5))
            coded = [client.next_id(short) for _ in range(20)]
            hidden += [client.next_id(daily) for _ in range(20)]
        report = client.report
        assert not report.lost and report.returned > 0  # tails back to their period's row

        async def async_client() -> list[object]:
            async with AsyncIdPoolClient(node.base_url, return_at_exit=False) as aclient:
                return [await aclient.next_id(invoices) for _ in range(3)] + list(
                    await aclient.next_ids(invoices, 3)
                )

        mine += asyncio.run(async_client())
        more_http = draw(node, invoices, 5)
        coded += draw(node, short, 10, tokens[short])
        hidden += draw(node, daily, 5, tokens[daily])
    finally:
        node.stop()
    everything = [str(v) for v in over_http + mine + more_http]
    assert len(set(everything)) == len(everything) == 36
    day = everything[0][4:12]
    numbers = sorted(int(s[13:]) for s in everything)
    assert all(s.startswith(f"INV-{day}-") and len(s) == 19 for s in everything)
    assert numbers[0] == 1  # a daily sequence starts at 1
    assert len(set(coded)) == len(coded) == 40
    assert all(isinstance(v, str) and re.fullmatch(r"[0-9A-Za-z]+", v) for v in coded)
    # node and client render alike: every string decodes to a distinct number of its day
    assert len(set(hidden)) == len(hidden) == 40
    fmt = format_of(asyncio.run(_read_row(settings, daily)))
    assert fmt is not None and fmt.period_keys
    assert len({fmt.decode_period(str(v)) for v in hidden}) == 40

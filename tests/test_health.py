"""The node's view of its stores (service/health.py): what marks a store down."""

from __future__ import annotations

from typing import Any, cast

from idpool.pool.errors import StoreUnavailable, StrictNotConfirmed
from idpool.pool.stores import LedgerStore
from idpool.service.health import StoreHealth


def test_a_strict_take_not_confirmed_is_not_redis_down() -> None:
    """A cluster shard's replica down makes its strict takes unconfirmed while Redis
    answers: counted as down, every strict request logged store_down, then
    store_up at the next answer (an adversarial run saw it flap)."""
    health = StoreHealth(cast(LedgerStore, cast(Any, object())), None)
    health.failed(StrictNotConfirmed("a replica of that shard is down"))
    assert health.is_up("redis")
    health.failed(StoreUnavailable("redis", "no answer"))
    assert not health.is_up("redis")

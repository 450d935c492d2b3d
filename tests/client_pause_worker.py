"""A client process for the pause test: one thread draws snowflake IDs through a
SnowflakeClient (its node faked in-process: no network) for ``SECONDS`` of wall
time, reading the wall clock just before each call. The test SIGSTOPs it in the
middle. Prints one JSON line: how many IDs, how many carried a time unit that had
ended before the call began (``stale``), the worst by how much, and whether the
IDs rose throughout.

    python -m tests.client_pause_worker SECONDS
"""

from __future__ import annotations

import json
import sys
import time

from idpool_client.snowflake import SnowflakeClient

WORKER_BITS, SEQUENCE_BITS = 6, 16


def fake_node(client: SnowflakeClient, epoch_ms: int) -> None:
    def post(kind: str, path: str, payload: object, what: str, sent: object = None) -> object:
        if "/renew" in path or "/release" in path:
            return {}
        layout = {"time_bits": 41, "worker_bits": WORKER_BITS, "sequence_bits": SEQUENCE_BITS}
        return {
            "worker": 7,
            "generation": 1,
            "secret": "s",
            "floor_ms": 0,
            "ttl_ms": 60_000,
            "margin_ms": 2_000,
            "layout": {**layout, "unit_ms": 1, "epoch_ms": epoch_ms},
        }

    client.transport._post = post  # type: ignore[method-assign,assignment]


def main(argv: list[str]) -> int:
    seconds = float(argv[0])
    epoch = time.time_ns() // 1_000_000 - 1000
    count = stale = worst = 0
    rising, previous = True, 0
    with SnowflakeClient("http://127.0.0.1:1") as ids:
        fake_node(ids, epoch)
        f, now = ids.next_id, time.time_ns
        ids.next_id("t")
        print("ready", flush=True)
        until = now() + int(seconds * 1e9)
        while True:
            before_ms = now() // 1_000_000
            if before_ms * 1_000_000 >= until:
                break
            value = f("t")
            made_ms = epoch + (value >> (WORKER_BITS + SEQUENCE_BITS))
            # unit 1 ms: the ID's unit ends at made_ms + 1; it must not have ended
            # before the call began
            if made_ms + 1 <= before_ms:
                stale += 1
                worst = max(worst, before_ms - made_ms)
            rising = rising and value > previous
            previous = value
            count += 1
    print(json.dumps({"count": count, "stale": stale, "worst_ms": worst, "rising": rising}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

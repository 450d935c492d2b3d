"""A client process that is still taking IDs when it exits (issue 28).

    python -m tests.client_exit_worker async|async-warm|sync URL TAG OUT_FILE SECONDS

``async``: an AsyncIdPoolClient whose event loop runs in a daemon thread, fed by
``run_coroutine_threadsafe`` (a sync app's pattern); ``async-warm``: the same,
first warmed up by ``asyncio.run`` in the main thread (a loop closed since), then
served by ``next_id`` alone (the fast path, which records no loop); ``sync``: an IdPoolClient
drawn from by daemon threads. The main thread returns after SECONDS, so the
client's atexit hook gives the unused tails back while the takers still take.
An atexit handler registered before the client (so it runs after the client's)
waits for the takers to stop, then writes OUT_FILE: ``{"handed": [...],
"returned": [[first, end), ...], "errors": [...]}``: every ID handed out and
every tail given back.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import sys
import threading
from typing import Any

from idpool_client import AsyncIdPoolClient, IdPoolClient, IdPoolError, Lease

LEASE = 200_000  # a lease outlasts the exit: the takers take while the hook cuts


def main(argv: list[str]) -> None:
    mode, url, tag, out, seconds = argv[0], argv[1], argv[2], argv[3], float(argv[4])
    sys.setswitchinterval(1e-5)  # the GIL changes hands often: many interleavings
    handed: list[Any] = []
    returned: list[list[int]] = []
    errors: list[str] = []
    takers: list[threading.Thread] = []

    def write() -> None:
        for thread in takers:
            thread.join(5)
        with open(out, "w") as f:
            json.dump({"handed": handed, "returned": returned, "errors": errors}, f)

    atexit.register(write)  # first registered, last run: after the client's hook
    options: dict[str, Any] = {"initial_count": LEASE, "max_count": LEASE, "timeout": 2.0}
    client: IdPoolClient | AsyncIdPoolClient
    if mode == "async":
        client = AsyncIdPoolClient(url, **options)
    else:
        client = IdPoolClient(url, **options)
    give_back = client.transport.give_back

    def recording(lease: Lease, start: int) -> int:
        returned.append([start, lease.end])  # before the node can serve it again
        return give_back(lease, start)

    client.transport.give_back = recording  # type: ignore[method-assign]
    if isinstance(client, AsyncIdPoolClient):
        if mode == "async-warm":
            handed.extend(asyncio.run(client.next_ids(tag, 3)))
        takers.append(_loop_taker(client, tag, handed, errors, slow=mode == "async"))
    else:
        takers += [_sync_taker(client, tag, handed, errors) for _ in range(2)]
    threading.Event().wait(seconds)


def _loop_taker(
    client: AsyncIdPoolClient, tag: str, handed: list[Any], errors: list[str], slow: bool
) -> threading.Thread:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def take() -> None:
        k = 0
        try:
            while True:
                k += 1
                if slow and k % 3 == 0:  # next_ids: the slow path, a cut could land mid-take
                    handed.extend(await client.next_ids(tag, 7))
                else:
                    handed.append(await client.next_id(tag))
                if k % (50 if slow else 5) == 0:  # warm: stays under the prefetch mark
                    await asyncio.sleep(0)  # other tasks (and callbacks) get the loop
        except IdPoolError:
            pass  # closed, or no lease once the interpreter is shutting down
        except Exception as e:  # noqa: BLE001  (recorded for the test to show)
            errors.append("".join(__import__("traceback").format_exception(e)))

    done = asyncio.run_coroutine_threadsafe(take(), loop)
    waiter = threading.Thread(target=done.result, daemon=True)
    waiter.start()
    return waiter


def _sync_taker(
    client: IdPoolClient, tag: str, handed: list[Any], errors: list[str]
) -> threading.Thread:
    def take() -> None:
        k = 0
        try:
            while True:
                k += 1
                if k % 3 == 0:  # next_ids: the slow path, where a cut could land mid-take
                    handed.extend(client.next_ids(tag, 7))
                else:
                    handed.append(client.next_id(tag))
        except IdPoolError:
            pass  # closed, or no lease once the interpreter is shutting down
        except Exception as e:  # noqa: BLE001
            errors.append("".join(__import__("traceback").format_exception(e)))

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread


if __name__ == "__main__":
    main(sys.argv[1:])

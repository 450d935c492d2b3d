"""A client process for the snowflake tests: threads draw IDs through one
SnowflakeClient (made in-process from a leased worker ID) and append them to a
file, until SIGTERM (then close() releases the worker ID).

    python -m tests.snowflake_worker URL[,URL...] TAG OUT_FILE [THREADS]

OUT_FILE gets the IDs as native 8-byte integers, flushed in chunks, so a run
killed with -9 leaves what it flushed.
"""

from __future__ import annotations

import array
import signal
import sys
import threading

from idpool_client import IdPoolError
from idpool_client.snowflake import SnowflakeClient


def main(argv: list[str]) -> int:
    urls, tag, out = argv[0].split(","), argv[1], argv[2]
    threads = int(argv[3]) if len(argv) > 3 else 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    client = SnowflakeClient(urls, timeout=2.0)
    lock = threading.Lock()
    with open(out, "ab") as f:

        def draw() -> None:
            chunk: array.array[int] = array.array("q")
            while not stop.is_set():
                try:
                    chunk.append(client.next_id(tag))
                except IdPoolError:  # no worker ID for a moment (a node or Redis down)
                    stop.wait(0.05)
                if len(chunk) >= 200:
                    with lock:
                        chunk.tofile(f)
                        f.flush()
                    chunk = array.array("q")
            with lock:
                chunk.tofile(f)

        workers = [threading.Thread(target=draw) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

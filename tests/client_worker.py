"""A client process for the conservation test: several threads draw IDs through
one IdPoolClient and append them to a file, until SIGTERM; then close() returns
the unused tails and the process writes its report.

    python -m tests.client_worker URL[,URL...] TAG OUT_FILE [THREADS [MAX_COUNT]]

OUT_FILE gets the IDs as native 8-byte integers, flushed in chunks, so a run
killed with -9 leaves what it flushed; OUT_FILE.done gets "returned lost errors
most_held" after a graceful stop (most_held: the most IDs of the tag the client
held, sampled every 20 ms).
"""

from __future__ import annotations

import array
import signal
import sys
import threading

from idpool_client import IdPoolClient, IdPoolError


def main(argv: list[str]) -> int:
    urls, tag, out = argv[0].split(","), argv[1], argv[2]
    threads = int(argv[3]) if len(argv) > 3 else 4
    max_count = int(argv[4]) if len(argv) > 4 else 2000
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    client = IdPoolClient(urls, max_count=max_count, timeout=2.0)
    most_held = 0
    lock = threading.Lock()
    errors: list[str] = []
    with open(out, "ab") as f:

        def flush(chunk: array.array[int]) -> None:
            with lock:
                chunk.tofile(f)
                f.flush()

        def draw(n: int) -> None:
            chunk: array.array[int] = array.array("q")
            k = 0
            while not stop.is_set():
                try:
                    if k % 5 == n % 5:
                        chunk.extend(client.next_ids(tag, 50))
                    else:
                        chunk.append(client.next_id(tag))
                except IdPoolError as e:  # every node down for a moment: try again
                    errors.append(str(e))
                    stop.wait(0.05)
                k += 1
                if len(chunk) >= 500:
                    flush(chunk)
                    chunk = array.array("q")
                    stop.wait(0.01)  # ~50k IDs/s a thread: a few million to account, not 50
            flush(chunk)

        workers = [threading.Thread(target=draw, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        while not stop.wait(0.02):
            most_held = max(most_held, client.held(tag))
        for w in workers:
            w.join()
    report = client.close()
    with open(out + ".done", "w") as f:
        f.write(f"{report.returned} {len(report.lost)} {len(errors)} {most_held}\n")
        for lost in report.lost:
            f.write(lost + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A client process for the conservation test: several threads draw IDs through
one IdPoolClient and append them to a file, until SIGTERM; then close() returns
the unused tails and the process writes its report.

    python -m tests.client_worker URL[,URL...] TAG OUT_FILE [THREADS [MAX_COUNT]]

OUT_FILE gets the IDs as native 8-byte integers, each written into a shared
file mapping as soon as it is drawn: the kernel keeps a killed process's writes
to a MAP_SHARED mapping, so a run killed with -9 leaves every ID it drew (a slot
taken but not yet written reads 0, which is never an ID). Buffered in chunks
instead, the IDs a killed client had drawn but not flushed looked like lost
leases. OUT_FILE.done gets "returned lost errors most_held" after a graceful
stop (most_held: the most IDs of the tag the client held, sampled every 20 ms).
"""

from __future__ import annotations

import itertools
import mmap
import signal
import struct
import sys
import threading

from idpool_client import IdPoolClient, IdPoolError

SLOTS = 4_000_000  # IDs one client process can record (32 MB, sparse)


def main(argv: list[str]) -> int:
    urls, tag, out = argv[0].split(","), argv[1], argv[2]
    threads = int(argv[3]) if len(argv) > 3 else 4
    max_count = int(argv[4]) if len(argv) > 4 else 2000
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    client = IdPoolClient(urls, max_count=max_count, timeout=2.0)
    most_held = 0
    errors: list[str] = []
    with open(out, "w+b") as f:
        f.truncate(SLOTS * 8)  # sparse: only the pages written take room
        slots = mmap.mmap(f.fileno(), SLOTS * 8)
        next_slot = itertools.count()  # one C call under the GIL: each slot once

        def record(ids: list[int]) -> None:
            for i in ids:
                struct.pack_into("q", slots, next(next_slot) * 8, i)

        def draw(n: int) -> None:
            k = 0
            while not stop.is_set():
                try:
                    if k % 5 == n % 5:
                        record(list(client.next_ids(tag, 50)))
                    else:
                        record([client.next_id(tag)])
                except IdPoolError as e:  # every node down for a moment: try again
                    errors.append(str(e))
                    stop.wait(0.05)
                k += 1
                if k % 100 == 0:
                    stop.wait(0.01)  # ~25k IDs/s a thread: a few million to account, not 50

        workers = [threading.Thread(target=draw, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        while not stop.wait(0.02):
            most_held = max(most_held, client.held(tag))
        for w in workers:
            w.join()
        slots.flush()
    report = client.close()
    with open(out + ".done", "w") as f:
        f.write(f"{report.returned} {len(report.lost)} {len(errors)} {most_held}\n")
        for lost in report.lost:
            f.write(lost + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

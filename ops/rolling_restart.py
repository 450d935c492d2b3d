"""Restart idpool nodes one at a time while a client keeps drawing IDs, then
account for every ID of the tag it drew from.

Each node in turn: SIGTERM (a stop command, the PID in a file, or the process
itself in local mode), wait until it has exited (it logs
``event=node_stopped returned=N abandoned=M`` after pushing its remainders back
to the head of the Redis list), start it again, wait for ``GET /readyz`` = 200.

Meanwhile client threads draw IDs from every node. A request that fails
(connection refused or reset, 503 ``draining``, any non-200) is retried on the
next node: a failed request hands out nothing, so an ID request is safe to
retry. The report counts the errors the client saw and retried past, and the
requests it could not recover (``failed``).

At the end every ID in [start_id, max_id) of the tag must be handed out exactly
once, still in the Redis list ``<prefix>:{<tag>}:pool``, or held in a node's
buffer (read from its ``/status.json``); anything else is waste. The tag is
created by the run, so no one else draws from it.

Exit status: 0 when nothing failed, nothing was wasted and no ID was seen
twice; 1 otherwise; 2 for a usage error; 3 when a store cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from idpool.pool.claims import create_tag, remove_tag
from idpool.pool.errors import ConfigError, StoreUnavailable, TagExists
from idpool.pool.ledger import Ledger
from idpool.pool.ranges import IdRange
from idpool.pool.redis_pool import RedisPool
from idpool.pool.settings import Settings
from idpool.pool.stores import open_stores

from .toolkit import NodeConnections, NodeProcess, node_stopped, wait_port_closed, wait_ready

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
REST_SECONDS = 0.5  # the client leaves a node that just failed alone this long


# --- the nodes ---------------------------------------------------------------


@dataclass
class Stopped:
    seconds: float  # from the signal to the exit
    returned: int | None  # ranges pushed back, from the node's log (None: no log)
    abandoned: int | None
    problem: str = ""  # what went wrong, if anything did


class Target(Protocol):
    name: str
    base_url: str

    def stop(self, timeout: float) -> Stopped: ...

    def start(self, timeout: float) -> None: ...


class LocalTarget:
    """A node this script started (``--local N``)."""

    def __init__(self, node: NodeProcess, kill: bool = False) -> None:
        self.node = node
        self.kill = kill  # SIGKILL instead of SIGTERM: shows what a crash costs
        self.name = f"127.0.0.1:{node.port}"
        self.base_url = node.base_url

    def stop(self, timeout: float) -> Stopped:
        started = time.monotonic()
        if self.kill:
            self.node.kill9()
            return Stopped(time.monotonic() - started, None, None)
        clean = self.node.stop(timeout)
        seconds = time.monotonic() - started
        counts = node_stopped(self.node.logs[-1].read_text(errors="replace"))
        if counts is None or not clean:
            return Stopped(seconds, None, None, f"unclean_exit_see_{self.node.logs[-1]}")
        return Stopped(seconds, *counts)

    def start(self, timeout: float) -> None:
        self.node.start(ready_timeout=timeout)


class RemoteTarget:
    """A node given as host:port, stopped and started by operator-supplied means.

    ``stop_cmd``/``start_cmd`` are shell templates with ``{host}``, ``{port}`` and
    ``{index}`` (1 for the first node given, e.g. ``docker compose stop node{index}``);
    without ``stop_cmd`` the node is sent SIGTERM via the PID in ``pid_file``
    (same machine). ``log_file`` (optional) is read for the ``node_stopped`` line.
    """

    def __init__(
        self,
        index: int,
        address: str,
        start_cmd: str,
        stop_cmd: str | None,
        pid_file: str | None,
        log_file: str | None,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        self.name = f"{self.host}:{self.port}"
        self.base_url = f"http://{self.name}"
        fill = {"host": self.host, "port": str(self.port), "index": str(index)}
        self.start_cmd = start_cmd.format(**fill)
        self.stop_cmd = None if stop_cmd is None else stop_cmd.format(**fill)
        self.pid_file = None if pid_file is None else Path(pid_file.format(**fill))
        self.log_file = None if log_file is None else Path(log_file.format(**fill))

    def stop(self, timeout: float) -> Stopped:
        offset = self.log_file.stat().st_size if self.log_file and self.log_file.exists() else 0
        started = time.monotonic()
        if self.stop_cmd is not None:
            subprocess.run(self.stop_cmd, shell=True, check=True, timeout=timeout)
        else:
            assert self.pid_file is not None
            pid = int(self.pid_file.read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
            _wait_pid_gone(pid, timeout)
        wait_port_closed(self.host, self.port, timeout)
        seconds = time.monotonic() - started
        counts = None
        if self.log_file is not None:
            deadline = time.monotonic() + 5  # the log may be flushed a little later
            while counts is None and time.monotonic() < deadline:
                with open(self.log_file, "rb") as f:
                    f.seek(offset)
                    counts = node_stopped(f.read().decode(errors="replace"))
                time.sleep(0.1)
        if counts is None:
            problem = "" if self.log_file is None else f"no_node_stopped_line_in_{self.log_file}"
            return Stopped(seconds, None, None, problem)
        return Stopped(seconds, *counts)

    def start(self, timeout: float) -> None:
        subprocess.run(self.start_cmd, shell=True, check=True, timeout=timeout)
        wait_ready(self.base_url, timeout)


def _wait_pid_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise TimeoutError(f"process {pid} still running {timeout}s after SIGTERM")


# --- the client --------------------------------------------------------------


@dataclass
class Tally:
    ids: list[int] = field(default_factory=list)
    requests: int = 0  # requests answered with IDs
    retried: Counter[str] = field(default_factory=Counter)  # errors seen, retried elsewhere
    failed: Counter[str] = field(default_factory=Counter)  # requests no node could answer


class Client:
    """Threads drawing IDs from every node; a failed attempt moves on to the next node."""

    def __init__(
        self,
        urls: list[str],
        tag: str,
        *,
        threads: int,
        count: int,
        max_ids: int,
        retry_seconds: float,
        rate: float,
    ) -> None:
        self.urls = urls
        self.tag = tag
        self.count = count
        self.max_ids = max_ids
        self.retry_seconds = retry_seconds
        self.rate = rate  # requests per second, all threads together (0: no limit)
        self.tally = Tally()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> Tally:
        self.stopping.set()
        for t in self.threads:
            t.join(30)
        return self.tally

    def drawn(self) -> int:
        with self.lock:
            return len(self.tally.ids)

    def _run(self, n: int) -> None:
        conns = NodeConnections(timeout=10)
        resting: dict[str, float] = {}  # node -> until when this thread leaves it alone
        interval = len(self.threads) / self.rate if self.rate > 0 else 0.0
        next_at = time.monotonic()
        i = n
        while not self.stopping.is_set() and self.drawn() < self.max_ids:
            path = f"/id/{self.tag}" if i % 10 == 0 else f"/ids/{self.tag}?count={self.count}"
            self._request(conns, resting, i, path)
            i += 1
            next_at += interval
            if (pause := next_at - time.monotonic()) > 0:
                time.sleep(pause)
        conns.close()

    def _request(
        self,
        conns: NodeConnections,
        resting: dict[str, float],
        i: int,
        path: str,
    ) -> None:
        """One request, tried on node after node until one answers or time runs out.

        A node that failed is left alone for a moment, as a balancer would."""
        give_up = time.monotonic() + self.retry_seconds
        while True:
            now = time.monotonic()
            order = [self.urls[(i + k) % len(self.urls)] for k in range(len(self.urls))]
            url = next((u for u in order if resting.get(u, 0.0) <= now), order[0])
            answer = conns.get_ids(url, path)
            outcome = answer.status
            if answer.ids is not None:
                with self.lock:
                    self.tally.ids.extend(answer.ids)
                    self.tally.requests += 1
                return
            resting[url] = now + REST_SECONDS
            if time.monotonic() >= give_up:
                with self.lock:
                    self.tally.failed[outcome] += 1
                return
            with self.lock:
                self.tally.retried[outcome] += 1
            if all(resting.get(u, 0.0) > now for u in order):
                time.sleep(0.05)  # every node failed just now: give them a moment


# --- the accounting ----------------------------------------------------------


@dataclass
class Accounting:
    start_id: int
    max_id: int
    handed_out: int  # distinct IDs the client received
    in_pool: int  # IDs in ranges of the Redis list
    held: int  # IDs in node buffers
    duplicates: int  # IDs received twice, or received and also pooled or held
    wasted: list[IdRange]  # [start_id, max_id) minus all of the above

    @property
    def wasted_ids(self) -> int:
        return sum(map(len, self.wasted))


def account(
    start_id: int,
    max_id: int,
    ids: Sequence[int],
    pooled: Sequence[IdRange],
    held: Sequence[IdRange],
) -> Accounting:
    """Each ID in [start_id, max_id) must be in exactly one place.

    Works on ranges, not sets of IDs: a pool sized for 10 minutes may hold many
    millions. Ranges at or past ``max_id`` (claimed after it was read) are ignored.
    """
    ordered = sorted(ids)
    # An ID outside the ledger's claims is as bad as a repeat: count it with them.
    duplicates = sum(1 for a, b in zip(ordered, ordered[1:], strict=False) if a == b)
    duplicates += sum(1 for i in ordered if not start_id <= i < max_id)
    handed = _runs(sorted({i for i in ordered if start_id <= i < max_id}))
    in_pool = _clip(pooled, start_id, max_id)
    in_buffers = _clip(held, start_id, max_id)
    wasted: list[IdRange] = []
    covered = start_id  # every ID below this is somewhere
    for r in sorted(handed + in_pool + in_buffers, key=lambda r: r.start):
        if r.start < covered:
            duplicates += min(r.end, covered) - r.start
        elif r.start > covered:
            wasted.append(IdRange(covered, r.start))
        covered = max(covered, r.end)
    if covered < max_id:
        wasted.append(IdRange(covered, max_id))
    return Accounting(
        start_id,
        max_id,
        sum(map(len, handed)),
        sum(map(len, in_pool)),
        sum(map(len, in_buffers)),
        duplicates,
        wasted,
    )


def _runs(distinct: list[int]) -> list[IdRange]:
    """Sorted distinct IDs as ranges of consecutive IDs."""
    bounds: list[list[int]] = []
    for i in distinct:
        if bounds and bounds[-1][1] == i:
            bounds[-1][1] = i + 1
        else:
            bounds.append([i, i + 1])
    return [IdRange(first, end) for first, end in bounds]


def _clip(ranges: Sequence[IdRange], start: int, end: int) -> list[IdRange]:
    clipped = [(max(r.start, start), min(r.end, end)) for r in ranges]
    return [IdRange(s, e) for s, e in clipped if s < e]


def held_by(base_url: str, tag: str) -> tuple[list[IdRange], bool]:
    """The unused part of a node's buffers for the tag, and whether a fetch is under way."""
    with urllib.request.urlopen(base_url + "/status.json", timeout=5) as r:
        status = json.load(r)
    entry = next((t for t in status["tags"] if t["tag"] == tag), None)
    if entry is None or entry["buffer"] is None:
        return [], False
    buf = entry["buffer"]
    ranges = []
    if buf["current"] and buf["remaining"] > 0:
        current = IdRange.from_text(buf["current"])
        ranges.append(IdRange(current.end - buf["remaining"], current.end))
    ranges += [IdRange.from_text(text) for text in buf["ready"]]
    return ranges, bool(buf["fetching"])


async def settle_and_account(
    settings: Settings, tag: str, ids: Sequence[int], urls: list[str], wait: float
) -> Accounting:
    """Account, again and again for up to ``wait`` seconds while IDs look missing:
    a preloader may have claimed a range (max_id moved) it has not pushed yet."""
    ledger = await Ledger.connect(settings)
    pool = RedisPool.from_settings(settings)
    try:
        deadline = time.monotonic() + wait
        while True:
            row = await ledger.get_tag(tag)  # first: later claims lie past max_id
            held: list[IdRange] = []
            busy = False
            for url in urls:
                ranges, fetching = held_by(url, tag)
                held += ranges
                busy |= fetching
            pooled = await pool.ranges(tag)
            result = account(row.start_id, row.max_id, ids, pooled, held)
            if (not result.wasted and not busy) or time.monotonic() >= deadline:
                return result
            await asyncio.sleep(0.5)
    finally:
        await pool.close()
        await ledger.close()


async def new_tag(settings: Settings, tag: str, step: int) -> None:
    ledger, pool = await open_stores(settings)  # both must answer: StoreUnavailable if not
    try:
        await create_tag(ledger, pool, tag, step=step, start=1, description="rolling-restart")
    finally:
        await pool.close()
        await ledger.close()


async def drop_tag(settings: Settings, tag: str) -> int:
    """Remove the run's tag (`idpool tag remove`): the IDs still pooled for it are
    wasted, and its tombstone keeps the name from ever issuing them again."""
    ledger, pool = await open_stores(settings)
    try:
        _, drained = await remove_tag(ledger, pool, tag)
    finally:
        await pool.close()
        await ledger.close()
    return sum(map(len, drained))


# --- the run -----------------------------------------------------------------


def restart_all(targets: Sequence[Target], client: Client, args: argparse.Namespace) -> bool:
    """Restart each target in turn, printing a line per node; whether all went well."""
    ok = True
    for target in targets:
        before = client.drawn()
        stopped = target.stop(args.stop_timeout)
        started = time.monotonic()
        target.start(args.start_timeout)
        ready = time.monotonic() - started
        during = client.drawn() - before
        problem = f" problem={stopped.problem}" if stopped.problem else ""
        print(
            f"restarted node={target.name} stop_s={stopped.seconds:.2f} "
            f"returned={_or_unknown(stopped.returned)} abandoned={_or_unknown(stopped.abandoned)} "
            f"ready_s={ready:.2f} ids_drawn_meanwhile={during}{problem}",
            flush=True,
        )
        ok &= not stopped.abandoned and not stopped.problem
        time.sleep(args.pause)
    return ok


def _or_unknown(n: int | None) -> str:
    return "?" if n is None else str(n)


def _counts(c: Counter[str]) -> str:
    return ",".join(f"{why.replace(' ', '_')}:{n}" for why, n in c.most_common()) or "-"


def run(args: argparse.Namespace, settings: Settings) -> int:
    tag = args.tag or "rolling-" + datetime.now(UTC).strftime("%Y%m%d%H%M%S") + f"-{os.getpid()}"
    try:
        asyncio.run(new_tag(settings, tag, args.step))
    except TagExists:
        print(f"rolling-restart: tag {tag!r} exists; name a new one (--tag)", file=sys.stderr)
        return EXIT_USAGE
    local: list[NodeProcess] = []
    targets: list[Target] = []
    try:
        if args.local:
            log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="idpool-rolling-"))
            log_dir.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ)
            for n in range(args.local):
                local.append(NodeProcess(env, log_dir / f"node{n}").start())
                targets.append(LocalTarget(local[-1], kill=args.stop_signal == "KILL"))
            print(f"local nodes={args.local} logs={log_dir}", flush=True)
        else:
            targets = [
                RemoteTarget(i, a, args.start, args.stop, args.pid_file, args.log)
                for i, a in enumerate(args.nodes, 1)
            ]
        return _drive(args, settings, tag, targets)
    finally:
        for node in local:
            if node.proc is not None:
                node.stop()
        if args.local:  # a demo's tag: removed once its nodes (and preloaders) stopped
            try:
                drained = asyncio.run(drop_tag(settings, tag))
                print(f"removed tag={tag} pooled_ids_wasted={drained}", flush=True)
            except StoreUnavailable as e:
                print(f"rolling-restart: tag {tag!r} not removed: {e}", file=sys.stderr)


def _drive(args: argparse.Namespace, settings: Settings, tag: str, targets: list[Target]) -> int:
    urls = [t.base_url for t in targets]
    client = Client(
        [args.via] if args.via else urls,
        tag,
        threads=args.threads,
        count=args.count,
        max_ids=args.max_ids,
        retry_seconds=args.retry_seconds,
        rate=args.rate,
    )
    client.start()
    try:
        time.sleep(args.pause)  # load first, then restarts
        clean = restart_all(targets, client, args)
        time.sleep(args.pause)
    finally:
        tally = client.stop()
    acc = asyncio.run(settle_and_account(settings, tag, tally.ids, urls, args.settle))
    failed = sum(tally.failed.values())
    ok = clean and failed == 0 and acc.wasted_ids == 0 and acc.duplicates == 0
    print(
        f"client tag={tag} via={args.via or 'nodes'} "
        f"requests={tally.requests} ids={len(tally.ids)} "
        f"errors_retried={sum(tally.retried.values())} ({_counts(tally.retried)}) "
        f"failed={failed} ({_counts(tally.failed)})"
    )
    wasted = " ".join(r.to_text() for r in acc.wasted[:5]) or "-"
    print(
        f"accounting range={acc.start_id}-{acc.max_id - 1} handed_out={acc.handed_out} "
        f"in_pool={acc.in_pool} held_by_nodes={acc.held} wasted={acc.wasted_ids} "
        f"duplicates={acc.duplicates} wasted_ranges={wasted}"
    )
    print(f"result={'ok' if ok else 'FAILED'}", flush=True)
    return 0 if ok else EXIT_FAILED


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rolling-restart",
        description="Restart idpool nodes one at a time under load; report failed requests "
        "and wasted IDs. Reads IDPOOL_MYSQL_URL, IDPOOL_REDIS_URL and IDPOOL_REDIS_PREFIX "
        "like the nodes do.",
    )
    p.add_argument("nodes", nargs="*", metavar="HOST:PORT", help="the nodes, restarted in order")
    p.add_argument("--local", type=int, metavar="N", help="start N `idpool serve` nodes here")
    p.add_argument("--start", help="shell command starting a node: {host} {port} {index} filled in")
    p.add_argument("--stop", help="shell command stopping a node, returning once it has exited")
    p.add_argument("--pid-file", help="without --stop: SIGTERM the PID in this file ({port})")
    p.add_argument("--log", help="node log file ({port}), read for event=node_stopped")
    p.add_argument("--via", metavar="URL", help="draw IDs through this balancer, not the nodes")
    p.add_argument(
        "--stop-signal",
        choices=["TERM", "KILL"],
        default="TERM",
        help="--local: KILL shows what a crash costs",
    )
    p.add_argument("--log-dir", help="--local: where node logs go (default: a new temp dir)")
    p.add_argument("--tag", help="tag to create and draw from (default: rolling-<time>-<pid>)")
    p.add_argument("--step", type=int, default=1000, help="step of that tag (default 1000)")
    p.add_argument("--threads", type=int, default=4, help="client threads (default 4)")
    p.add_argument("--count", type=int, default=50, help="IDs per /ids request (default 50)")
    p.add_argument(
        "--rate", type=float, default=1000, help="requests/s, all threads (0: no limit; 1000)"
    )
    p.add_argument(
        "--max-ids", type=int, default=2_000_000, help="stop drawing after this many IDs"
    )
    p.add_argument("--retry-seconds", type=float, default=5.0, help="give a request up after (5)")
    p.add_argument("--pause", type=float, default=1.0, help="seconds of load between restarts")
    p.add_argument("--stop-timeout", type=float, default=60.0)
    p.add_argument("--start-timeout", type=float, default=60.0)
    p.add_argument(
        "--settle",
        type=float,
        default=10.0,
        help="seconds the accounting waits for claims in flight",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.local) == bool(args.nodes):
        parser.error("give either HOST:PORT nodes or --local N")
    if args.nodes and (args.start is None or (args.stop is None and args.pid_file is None)):
        parser.error("real nodes need --start and one of --stop or --pid-file")
    if args.stop_signal == "KILL" and not args.local:
        parser.error("--stop-signal KILL is for --local demos only")
    try:
        settings = Settings.from_env()
    except ConfigError as e:
        print(f"rolling-restart: configuration error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run(args, settings)
    except StoreUnavailable as e:
        print(f"rolling-restart: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except (subprocess.SubprocessError, TimeoutError, RuntimeError, OSError) as e:
        print(f"rolling-restart: {e}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())

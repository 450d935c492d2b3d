"""The embedded pool: the Redis pool's lists, stats, marks and leases as SQLite tables.

It lives in the same file as the embedded ledger (``pool/sqlite_file.py`` has the
tables), so a graceful restart of an embedded node wastes nothing: the ranges
the preloader made ready and the remainders the node returned at shutdown are
still there for the next start. Every pop and push is one transaction, durable
(fsynced) before it returns, so a range popped and used is never in the table
again, even after ``kill -9``.

Differences from Redis: there is no incarnation to check (the pool cannot lose
writes while the ledger keeps them: they share one file and one journal), so
``dropped`` is always empty.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence

from .ranges import IdRange
from .settings import Settings
from .sqlite_file import SqliteFile
from .tag_rules import PLAIN_RECORD, format_record, record_kind
from .values import MAX_POP_RANGES, Moved, PoolSummary, PopResult, PushResult, summary

_UPSERT_STAT = (
    "INSERT INTO idpool_pool_stats (tag, field, value) VALUES (?, ?, ?) "
    # skip unchanged values: no page written, no fsync
    "ON CONFLICT (tag, field) DO UPDATE SET value = excluded.value WHERE value != excluded.value"
)


def _depth(conn: sqlite3.Connection, tag: str) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM idpool_pool WHERE tag = ?", (tag,)).fetchone()[0])


def _ranges(conn: sqlite3.Connection, tag: str) -> list[IdRange]:
    rows = conn.execute(
        "SELECT first_id, last_id FROM idpool_pool WHERE tag = ? ORDER BY seq", (tag,)
    ).fetchall()
    return [IdRange(first, last + 1) for first, last in rows]


def _stats(conn: sqlite3.Connection, tag: str) -> dict[str, str]:
    rows = conn.execute("SELECT field, value FROM idpool_pool_stats WHERE tag = ?", (tag,))
    return {field: value for field, value in rows.fetchall()}


class SqlitePool:
    name = "sqlite_pool"  # in /status, /metrics and 503 messages

    def __init__(self, file: SqliteFile) -> None:
        self.file = file

    @classmethod
    async def open(cls, settings: Settings) -> SqlitePool:
        return cls(await SqliteFile.from_settings(settings, cls.name))

    async def close(self) -> None:
        await self.file.close()

    async def check(self) -> None:
        await self.file.read(lambda conn: conn.execute("SELECT 1").fetchone())

    async def pop(self, tag: str, ids: int = 1) -> PopResult:
        """Take head ranges holding at least ``ids`` IDs (at least one range), or
        none when the pool is empty."""

        def op(conn: sqlite3.Connection) -> PopResult:
            # One write transaction: no other pop (any process) can take the same rows.
            rows = conn.execute(
                "SELECT seq, first_id, last_id FROM idpool_pool WHERE tag = ? ORDER BY seq",
                (tag,),
            )
            taken: list[IdRange] = []
            got = 0
            for seq, first, last in rows:
                if got >= ids or len(taken) >= MAX_POP_RANGES:
                    break
                taken.append(IdRange(first, last + 1))
                got += last + 1 - first
                last_seq = seq
            if taken:
                conn.execute("DELETE FROM idpool_pool WHERE tag = ? AND seq <= ?", (tag, last_seq))
            conn.execute("INSERT OR IGNORE INTO idpool_moved (tag) VALUES (?)", (tag,))
            target = _stats(conn, tag).get("target_depth", "0")
            return PopResult(taken, [], _depth(conn, tag), int(target))

        return await self.file.write(op)

    async def push(
        self, tag: str, ranges: Sequence[IdRange], *, head: bool, leader: str = ""
    ) -> PushResult:
        """Append fresh ranges (tail) or return remainders (head), in serving order;
        with ``leader``, only while that preloader holds the leadership (as in Redis)."""

        def op(conn: sqlite3.Connection) -> PushResult:
            # In the push's transaction: a preloader frozen past its lease pushes nothing.
            if leader and not _holds_lease(conn, leader):
                return PushResult(0, [], lease_lost=True)
            # seq is read and written in one write transaction: no push interleaves.
            low, high = conn.execute(
                "SELECT MIN(seq), MAX(seq) FROM idpool_pool WHERE tag = ?", (tag,)
            ).fetchone()
            first = (0 if low is None else low) - len(ranges) if head else (high or 0) + 1
            conn.executemany(
                "INSERT INTO idpool_pool (tag, seq, first_id, last_id) VALUES (?, ?, ?, ?)",
                [(tag, first + i, r.start, r.end - 1) for i, r in enumerate(ranges)],
            )
            return PushResult(_depth(conn, tag), [])

        return await self.file.write(op)

    async def depth(self, tag: str) -> int:
        return await self.file.read(lambda conn: _depth(conn, tag))

    async def ranges(self, tag: str) -> list[IdRange]:
        return await self.file.read(lambda conn: _ranges(conn, tag))

    async def summaries(self, tags: Sequence[str]) -> dict[str, PoolSummary]:
        def op(conn: sqlite3.Connection) -> dict[str, PoolSummary]:
            found = {}
            for tag in tags:
                head = conn.execute(
                    "SELECT first_id, last_id FROM idpool_pool WHERE tag = ? ORDER BY seq LIMIT 1",
                    (tag,),
                ).fetchone()
                text = None if head is None else f"{head[0]}-{head[1]}"
                found[tag] = summary(_depth(conn, tag), text, _stats(conn, tag))
            return found

        return await self.file.read(op)

    async def tags(self) -> list[str]:
        def op(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT tag FROM idpool_pool UNION SELECT tag FROM idpool_pool_stats ORDER BY tag"
            ).fetchall()
            return [tag for (tag,) in rows]

        return await self.file.read(op)

    async def take_all(self, tag: str) -> list[IdRange]:
        """Remove every ready range of ``tag`` and return them (see RedisPool.take_all)."""

        def op(conn: sqlite3.Connection) -> list[IdRange]:
            # One write transaction: no pop or push lands between the read and the delete.
            found = _ranges(conn, tag)
            conn.execute("DELETE FROM idpool_pool WHERE tag = ?", (tag,))
            return found

        return await self.file.write(op)

    async def high_water_to_claim(self, tag: str) -> int:
        return await self.high_water(tag)  # one file: no replica to wait for

    async def forget_periods(self, tags: Sequence[str]) -> None:
        """Delete ended period rows' figures (see RedisPool.forget_periods)."""

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany("DELETE FROM idpool_pool_stats WHERE tag = ?", [(t,) for t in tags])

        if tags:
            await self.file.write(op)

    async def high_water(self, tag: str) -> int:
        def op(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT high_water FROM idpool_high_water WHERE tag = ?", (tag,)
            ).fetchone()
            return 0 if row is None else int(row[0])

        return await self.file.read(op)

    async def fence_format(self, tag: str, fingerprint: str, *, serving: bool = False) -> str:
        """Record or check a tag's format fingerprint (see RedisPool.fence_format)."""

        record = format_record(fingerprint)

        def op(conn: sqlite3.Connection) -> str:
            row = conn.execute(
                "SELECT fingerprint FROM idpool_formats WHERE tag = ?", (tag,)
            ).fetchone()
            if row is not None:
                if row[0] == record:
                    return "same"
                if row[0] == PLAIN_RECORD:
                    return "unformatted"
                return record_kind(row[0]) or "other"  # a kind's record: its name
            mark = conn.execute(
                "SELECT high_water FROM idpool_high_water WHERE tag = ?", (tag,)
            ).fetchone()
            used = mark is not None and int(mark[0]) > 0
            if fingerprint and not serving and used:
                return "unformatted"
            conn.execute(
                "INSERT INTO idpool_formats (tag, fingerprint) VALUES (?, ?)", (tag, record)
            )
            return "set"

        return await self.file.write(op)

    async def fence_state(self, tag: str, floor: int) -> int:
        """Nothing to fence: the embedded mode's strict take is the ledger row's own
        (pool/sqlite_strict.py, SqliteStrict), made again with the row."""
        return floor

    async def unfence_format(self, tag: str, fingerprint: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM idpool_formats WHERE tag = ? AND fingerprint = ?",
                (tag, format_record(fingerprint)),
            )

        await self.file.write(op)

    async def raise_high_water(self, tag: str, value: int) -> int:
        def op(conn: sqlite3.Connection) -> int:
            # MAX() in the upsert: the mark is only ever raised.
            conn.execute(
                "INSERT INTO idpool_high_water (tag, high_water) VALUES (?, ?) "
                "ON CONFLICT (tag) DO UPDATE SET high_water = MAX(high_water, excluded.high_water)",
                (tag, value),
            )
            row = conn.execute(
                "SELECT high_water FROM idpool_high_water WHERE tag = ?", (tag,)
            ).fetchone()
            return int(row[0])

        return await self.file.write(op)

    async def report_issued(self, counts: Mapping[str, int]) -> None:
        """Add IDs a node handed out to each tag's ``issued`` count; mark them moved."""

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO idpool_pool_stats (tag, field, value) VALUES (?, 'issued', ?) "
                "ON CONFLICT (tag, field) DO UPDATE "
                "SET value = CAST(CAST(value AS INTEGER) + excluded.value AS TEXT)",
                [(tag, str(ids)) for tag, ids in counts.items()],
            )
            conn.executemany(
                "INSERT OR IGNORE INTO idpool_moved (tag) VALUES (?)", [(t,) for t in counts]
            )

        if counts:
            await self.file.write(op)

    async def take_moved(self) -> Moved:
        def op(conn: sqlite3.Connection) -> Moved:
            tags = [t for (t,) in conn.execute("SELECT tag FROM idpool_moved ORDER BY tag")]
            conn.execute("DELETE FROM idpool_moved")
            return Moved(tags, [])

        return await self.file.write(op)

    async def depths(self, tags: Sequence[str]) -> dict[str, int]:
        return await self.file.read(lambda conn: {tag: _depth(conn, tag) for tag in tags})

    async def report_lifetime(self, tag: str, ids: int, seconds: float) -> None:
        await self.write_stats(tag, {"lifetime_ids": str(ids), "lifetime_s": f"{seconds:.3f}"})

    async def read_stats(self, tag: str) -> dict[str, str]:
        return await self.file.read(lambda conn: _stats(conn, tag))

    async def write_stats(self, tag: str, fields: dict[str, str]) -> None:
        await self.write_stats_many({tag: fields})

    async def write_stats_many(self, figures: Mapping[str, dict[str, str]]) -> None:
        def op(conn: sqlite3.Connection) -> None:
            rows = [(tag, k, v) for tag, fields in figures.items() for k, v in fields.items()]
            conn.executemany(_UPSERT_STAT, rows)

        if figures:
            await self.file.write(op)

    async def take_lifetime(self, tag: str) -> tuple[int, float] | None:
        """Read and clear the last reported range lifetime: one observation, one decision."""

        def op(conn: sqlite3.Connection) -> tuple[int, float] | None:
            stats = _stats(conn, tag)
            if "lifetime_ids" not in stats or "lifetime_s" not in stats:
                return None
            conn.execute(
                "DELETE FROM idpool_pool_stats WHERE tag = ? "
                "AND field IN ('lifetime_ids', 'lifetime_s')",
                (tag,),
            )
            return int(stats["lifetime_ids"]), float(stats["lifetime_s"])

        return await self.file.write(op)

    async def add_stats(self, increments: Mapping[str, Mapping[str, int]]) -> None:
        """Add to each tag's running totals (see RedisPool.add_stats)."""

        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO idpool_pool_stats (tag, field, value) VALUES (?, ?, ?) "
                "ON CONFLICT (tag, field) DO UPDATE "
                "SET value = CAST(CAST(value AS INTEGER) + excluded.value AS TEXT)",
                [(tag, k, str(n)) for tag, fields in increments.items() for k, n in fields.items()],
            )

        if increments:
            await self.file.write(op)

    async def heartbeat(self, node_id: str, fields: Mapping[str, str], ttl: float) -> None:
        def op(conn: sqlite3.Connection) -> None:
            now = time.time()
            record = json.dumps({**fields, "seen_at": f"{now:.3f}"})
            conn.execute(
                "INSERT OR REPLACE INTO idpool_nodes (node_id, fields, seen_at) VALUES (?, ?, ?)",
                (node_id, record, now),
            )
            conn.execute("DELETE FROM idpool_nodes WHERE seen_at < ?", (now - ttl,))

        await self.file.write(op)

    async def leave(self, node_id: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM idpool_nodes WHERE node_id = ?", (node_id,))

        await self.file.write(op)

    async def live_nodes(self, ttl: float) -> list[dict[str, str]]:
        def op(conn: sqlite3.Connection) -> list[dict[str, str]]:
            rows = conn.execute(
                "SELECT node_id, fields FROM idpool_nodes WHERE seen_at >= ? ORDER BY node_id",
                (time.time() - ttl,),
            ).fetchall()
            return [{**json.loads(fields), "id": node_id} for node_id, fields in rows]

        return await self.file.read(op)

    async def lead(self, owner: str, seconds: float) -> bool:
        """Become (or stay) the one active preloader, like the Redis lease."""

        def op(conn: sqlite3.Connection) -> bool:
            now = time.time()
            held = _lease_holder(conn)
            if held is not None and held != owner:
                return False
            conn.execute(
                "INSERT OR REPLACE INTO idpool_leases (tag, owner, expires_at) VALUES ('', ?, ?)",
                (owner, now + seconds),
            )
            return True

        return await self.file.write(op)

    async def resign(self, owner: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM idpool_leases WHERE tag = '' AND owner = ?", (owner,))

        await self.file.write(op)


def _lease_holder(conn: sqlite3.Connection) -> str | None:
    # "" is no tag's name: the preloader's own row in the leases table.
    held = conn.execute(
        "SELECT owner FROM idpool_leases WHERE tag = '' AND expires_at > ?", (time.time(),)
    ).fetchone()
    return None if held is None else str(held[0])


def _holds_lease(conn: sqlite3.Connection, owner: str) -> bool:
    return _lease_holder(conn) == owner

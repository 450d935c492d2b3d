from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from idpool.pool.errors import StoreUnavailable
from idpool.pool.sqlite_file import SqliteFile

pytestmark = pytest.mark.anyio


async def _open(path: Path, timeout: float = 2.0, create: bool = True) -> SqliteFile:
    return await SqliteFile.open(path, timeout, "sqlite", create=create)


def _insert_tag(conn: sqlite3.Connection, tag: str) -> None:
    conn.execute(
        "INSERT INTO idpool_tags (tag, max_id, step, min_step, max_step, start_id, "
        "created_at, updated_at) VALUES (?, 1, 1, 1, 1, 1, 0, 0)",
        (tag,),
    )


def _tags(conn: sqlite3.Connection) -> list[str]:
    return [t for (t,) in conn.execute("SELECT tag FROM idpool_tags ORDER BY tag").fetchall()]


async def test_commits_are_fsynced_in_wal_mode(tmp_path: Path) -> None:
    file = await _open(tmp_path / "x.db")
    try:
        assert await file.read(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0]) == "wal"
        # 2 = FULL: every COMMIT waits for the WAL to reach the disk
        assert await file.read(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]) == 2
    finally:
        await file.close()


async def test_a_failed_transaction_leaves_nothing_behind(tmp_path: Path) -> None:
    file = await _open(tmp_path / "x.db")

    def insert_then_fail(conn: sqlite3.Connection) -> None:
        _insert_tag(conn, "a")
        raise ValueError("domain error after a write")

    try:
        with pytest.raises(ValueError):
            await file.write(insert_then_fail)
        await file.write(lambda c: _insert_tag(c, "b"))
        assert await file.read(_tags) == ["b"]
    finally:
        await file.close()


async def test_a_timed_out_transaction_still_runs_whole(tmp_path: Path) -> None:
    """The caller learns nothing (outcome unknown), but the transaction is never
    left half done, and the connection is not stuck inside it."""
    file = await _open(tmp_path / "x.db", timeout=0.2)

    def slow_insert(conn: sqlite3.Connection) -> None:
        _insert_tag(conn, "slow")
        time.sleep(0.5)

    try:
        with pytest.raises(StoreUnavailable, match="no answer in time"):
            await file.write(slow_insert)
        await asyncio.sleep(0.5)  # operations queue behind it in the file's thread
        await file.write(lambda c: _insert_tag(c, "next"))
        assert await file.read(_tags) == ["next", "slow"]
    finally:
        await file.close()


async def test_a_write_lock_held_elsewhere_is_a_store_error(tmp_path: Path) -> None:
    file = await _open(tmp_path / "x.db", timeout=0.3)
    other = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holding the write lock
        with pytest.raises(StoreUnavailable) as info:
            await file.write(lambda c: _insert_tag(c, "a"))
        assert info.value.store == "sqlite"
        assert await file.read(_tags) == []  # readers are not blocked (WAL)
        other.execute("ROLLBACK")
        await file.write(lambda c: _insert_tag(c, "a"))
        assert await file.read(_tags) == ["a"]
    finally:
        other.close()
        await file.close()


async def test_writes_survive_reopening(tmp_path: Path) -> None:
    file = await _open(tmp_path / "x.db")
    await file.write(lambda c: _insert_tag(c, "kept"))
    await file.close()
    again = await _open(tmp_path / "x.db", create=False)
    try:
        assert await again.read(_tags) == ["kept"]
    finally:
        await again.close()


async def test_cannot_open_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable, match="IDPOOL_MYSQL_URL") as info:
        await _open(tmp_path / "no-such-dir" / "x.db")
    assert info.value.store == "sqlite"
    with pytest.raises(StoreUnavailable, match="IDPOOL_CREATE_DATABASE=0"):
        await _open(tmp_path / "absent.db", create=False)
    assert not (tmp_path / "absent.db").exists()


async def test_close_twice_is_harmless_and_later_calls_fail(tmp_path: Path) -> None:
    file = await _open(tmp_path / "x.db")
    await file.close()
    await file.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await file.read(_tags)

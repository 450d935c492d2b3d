"""The MySQL ledger's tables: their schema, the columns added in place, the database.

Three tables: ``idpool_tags`` (one row per tag: the range claim's counter),
``idpool_tokens`` (per-tag token hashes) and ``idpool_removed_tags`` (the
tombstones of removed tags, never deleted). ``Ledger.ensure_schema``
(``pool/ledger.py``) creates them and adds, in place, every column a table made
by an older idpool lacks (``_MIGRATIONS``), each only after looking: an ALTER
waits for an exclusive metadata lock that every query would queue behind.
The error codes name what an older or absent table lacks.
"""

from __future__ import annotations

from typing import Any

import aiomysql
import pymysql

from .kind_rules import DEFAULT_KIND
from .settings import MysqlParams

TABLE = "idpool_tags"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    tag         VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    max_id      BIGINT       NOT NULL COMMENT 'first ID not yet claimed',
    step        INT          NOT NULL COMMENT 'IDs per range (adapted by the preloader)',
    min_step    INT          NOT NULL COMMENT 'dynamic step never goes below',
    max_step    INT          NOT NULL COMMENT 'dynamic step never goes above',
    start_id    BIGINT       NOT NULL COMMENT 'first ID the tag hands out',
    end_id      BIGINT       NOT NULL DEFAULT 9223372036854775807
                             COMMENT 'first ID never handed out: the tag bound (--max) + 1',
    disabled    TINYINT(1)   NOT NULL DEFAULT 0 COMMENT '1: no claim until enabled',
    kind        VARCHAR(16)  NOT NULL DEFAULT '{DEFAULT_KIND}' COMMENT 'how its IDs are made',
    layout      VARCHAR(64)  NOT NULL DEFAULT '' COMMENT 'bit layout of a snowflake tag',
    options     VARCHAR(1024) NOT NULL DEFAULT '' COMMENT 'JSON: format, reset, obfuscate',
    secret      VARCHAR(64)  NOT NULL DEFAULT '' COMMENT 'obfuscation key (hex); never shown',
    description VARCHAR(255) NOT NULL DEFAULT '',
    created_at  TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at  TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
                             ON UPDATE CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
"""

TOKENS = "idpool_tokens"
TOKENS_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TOKENS} (
    tag        VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    token_id   VARCHAR(16)  NOT NULL COMMENT 'names the token; not secret',
    token_hash CHAR(64)     NOT NULL COMMENT 'hex SHA-256 of the token (never the token)',
    created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (tag, token_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4
"""

REMOVED = "idpool_removed_tags"
REMOVED_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {REMOVED} (
    tag        VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    max_id     BIGINT       NOT NULL COMMENT 'the removed row max_id: nothing above was claimed',
    options    VARCHAR(1024) NOT NULL DEFAULT '' COMMENT 'its format: kept by the name added again',
    secret     VARCHAR(64)  NOT NULL DEFAULT '' COMMENT 'its obfuscation key (hex)',
    kind       VARCHAR(16)  NOT NULL DEFAULT '' COMMENT 'its kind: kept by the name added again',
    removed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
                            ON UPDATE CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COMMENT 'tombstones of removed tags, never deleted'
"""

# Tables made before a column existed get it here, in place (ensure_schema).
# ADD COLUMN IF NOT EXISTS: two nodes starting at once both run it harmlessly.
_MIGRATIONS = [
    (
        TABLE,
        "end_id",
        "BIGINT NOT NULL DEFAULT 9223372036854775807 "
        "COMMENT 'first ID never handed out: the tag bound (--max) + 1'",
    ),
    (TABLE, "disabled", "TINYINT(1) NOT NULL DEFAULT 0 COMMENT '1: no claim until enabled'"),
    (
        TABLE,
        "kind",
        f"VARCHAR(16) NOT NULL DEFAULT '{DEFAULT_KIND}' COMMENT 'how its IDs are made'",
    ),
    (TABLE, "layout", "VARCHAR(64) NOT NULL DEFAULT '' COMMENT 'bit layout of a snowflake tag'"),
    (
        TABLE,
        "options",
        "VARCHAR(1024) NOT NULL DEFAULT '' COMMENT 'JSON: format, reset, obfuscate'",
    ),
    (
        TABLE,
        "secret",
        "VARCHAR(64) NOT NULL DEFAULT '' COMMENT 'obfuscation key (hex); never shown'",
    ),
    # A tombstone keeps the removed tag's format: the name added again may only
    # keep it (tombstones made before: '', as if plain).
    (
        REMOVED,
        "options",
        "VARCHAR(1024) NOT NULL DEFAULT '' COMMENT 'its format: kept by the name added again'",
    ),
    (REMOVED, "secret", "VARCHAR(64) NOT NULL DEFAULT '' COMMENT 'its obfuscation key (hex)'"),
    # And its kind (tombstones made before: '', taken as any kind).
    (
        REMOVED,
        "kind",
        "VARCHAR(16) NOT NULL DEFAULT '' COMMENT 'its kind: kept by the name added again'",
    ),
]
_DUPLICATE_COLUMN = 1060
_UNKNOWN_DATABASE = 1049
_BAD_FIELD = 1054  # a column an older table lacks
_NO_SUCH_TABLE = 1146


async def _exact_tag_names(cur: Any, table: str) -> None:
    """Make ``tag`` compare byte for byte in a table made before it did.

    With the database's default collation (case-insensitive) ``tag = 'ORDERS'``
    found the row ``orders``: a node then served ``ORDERS`` as a tag of its own,
    with its own token set (none), disabled flag and high-water mark, all while
    claiming from ``orders``'s row. Rows cannot clash: the old collation already
    refused two names that differ only in case.
    """
    await cur.execute(
        "SELECT COLLATION_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = 'tag'",
        (table,),
    )
    row = await cur.fetchone()
    if row is not None and row[0] != "utf8mb4_bin":
        await cur.execute(
            f"ALTER TABLE {table} MODIFY tag VARCHAR(64) "
            "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
        )


async def _add_column(cur: Any, table: str, column: str, definition: str) -> None:
    """Add a column a table made by an older idpool lacks. Look first: any ALTER,
    even one that changes nothing, waits for an exclusive metadata lock, and every
    query on the table queues behind it, so no node start may run one needlessly."""
    await cur.execute(
        "SELECT 1 FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = %s",
        (table, column),
    )
    if await cur.fetchone() is not None:
        return
    try:
        await cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
    except pymysql.err.MySQLError as dup:
        if dup.args[0] != _DUPLICATE_COLUMN:  # a node that added it meanwhile
            raise


async def _create_database(params: MysqlParams, timeout: float) -> None:
    conn = await aiomysql.connect(
        host=params.host,
        port=params.port,
        user=params.user,
        password=params.password,
        connect_timeout=timeout,
        autocommit=True,
    )
    try:
        async with conn.cursor() as cur:
            # database name was checked to be letters, digits and _ in Settings
            await cur.execute(f"CREATE DATABASE IF NOT EXISTS `{params.database}`")
    finally:
        conn.close()

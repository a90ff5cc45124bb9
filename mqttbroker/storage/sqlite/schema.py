"""The database's schema, its migrations, and what counts as a damaged file."""

from __future__ import annotations

import errno
import logging
import sqlite3
from pathlib import Path

import aiosqlite

from .. import StoreError

log = logging.getLogger("mqttbroker.storage")

SYNC_LEVELS = {"off": 0, "normal": 1, "full": 2}
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024  # bytes of write-ahead log kept once it starts over

# Each entry upgrades the schema by one version; the database records the version it has.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        client_id TEXT PRIMARY KEY,
        expiry_interval INTEGER NOT NULL,
        expires_at REAL,                    -- wall clock; NULL while the client is connected
        username TEXT                       -- as last authenticated (for its will's ACL check)
    );
    CREATE TABLE subscriptions (
        client_id TEXT NOT NULL,
        topic_filter TEXT NOT NULL,
        qos INTEGER NOT NULL,
        no_local INTEGER NOT NULL,
        retain_as_published INTEGER NOT NULL,
        retain_handling INTEGER NOT NULL,
        identifier INTEGER,
        PRIMARY KEY (client_id, topic_filter)
    ) WITHOUT ROWID;
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        topic TEXT NOT NULL,
        payload BLOB NOT NULL,
        qos INTEGER NOT NULL,
        retain INTEGER NOT NULL,
        properties BLOB NOT NULL,
        expires_at REAL
    );
    CREATE TABLE deliveries (
        client_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        message_id INTEGER NOT NULL,
        qos INTEGER NOT NULL,
        retain INTEGER NOT NULL,
        sub_ids TEXT NOT NULL,
        packet_id INTEGER,                  -- NULL while queued
        released INTEGER NOT NULL,
        PRIMARY KEY (client_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE releases (
        client_id TEXT NOT NULL,
        packet_id INTEGER NOT NULL,
        PRIMARY KEY (client_id, packet_id)
    ) WITHOUT ROWID;
    CREATE TABLE retained (
        topic TEXT PRIMARY KEY,
        payload BLOB NOT NULL,
        qos INTEGER NOT NULL,
        properties BLOB NOT NULL,
        expires_at REAL
    );
    CREATE TABLE wills (
        client_id TEXT PRIMARY KEY,
        topic TEXT NOT NULL,
        payload BLOB NOT NULL,
        qos INTEGER NOT NULL,
        retain INTEGER NOT NULL,
        properties BLOB NOT NULL,
        version INTEGER NOT NULL,
        due_at REAL                         -- wall clock; NULL while the client is connected
    );
    """,
    # 2: the shared subscription a queued or in-flight message came through ("$share/g/f"; NULL:
    # none), so that after a restart it still goes to another member when its session ends.
    """
    ALTER TABLE deliveries ADD COLUMN share TEXT;
    """,
]

PER_CLIENT = ("sessions", "subscriptions", "deliveries", "releases", "wills")

# What SQLite reports as a damaged file (primary result codes). Anything else that stops the
# database from opening (permission, read-only, locked, full, I/O error) is not damage.
DAMAGE_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


class Damaged(Exception):
    """The database is damaged; the message says how."""


def denied(exc: BaseException) -> bool:
    """A permission problem: the file or its directory may not be read or written."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        return code in (sqlite3.SQLITE_PERM, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN)
    return isinstance(exc, PermissionError) or getattr(exc, "errno", None) == errno.EROFS


async def prepare(db: aiosqlite.Connection, path: Path, sync: str) -> None:
    """WAL mode and the sync level; check the file (``Damaged`` if SQLite finds it corrupt)
    and upgrade its schema to the current version, one migration per transaction."""
    await db.execute("PRAGMA journal_mode=WAL")
    await db.execute(f"PRAGMA synchronous={SYNC_LEVELS[sync]}")
    # Checkpoints are the store's own, off the commit path (SQLiteStore._checkpoint_loop);
    # a log that grew under a burst is cut back to this size once it starts over.
    await db.execute("PRAGMA wal_autocheckpoint=0")
    await db.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
    async with db.execute("PRAGMA quick_check") as cur:
        row = await cur.fetchone()
    if row is None or row[0] != "ok":
        raise Damaged(f"integrity check failed: {row[0] if row else '?'}")
    async with db.execute("PRAGMA user_version") as cur:
        row = await cur.fetchone()
    version = row[0] if row else 0
    if version > len(MIGRATIONS):
        raise StoreError(
            f"{path}: written by a newer mqttbroker (schema {version}, this one "
            f"knows {len(MIGRATIONS)}); upgrade mqttbroker or point --data-dir elsewhere"
        )
    for number in range(version, len(MIGRATIONS)):
        await db.executescript(
            f"BEGIN; {MIGRATIONS[number]} PRAGMA user_version={number + 1}; COMMIT;"
        )
        log.info("store %s: schema upgraded to version %d", path, number + 1)

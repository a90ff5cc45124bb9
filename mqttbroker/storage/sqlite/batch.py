"""The write batcher's data: the changes recorded since the last commit, newest value per row,
and the one transaction that writes them."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiosqlite

from ...broker.message import Message
from ...protocol.fastpath import encode_properties
from .. import describe
from .schema import PER_CLIENT

log = logging.getLogger("mqttbroker.storage")


class Batch:
    """Changes recorded since the last commit, newest value per row (None: delete the row)."""

    __slots__ = (
        "wiped",
        "sessions",
        "subs",
        "deliveries",
        "new_deliveries",
        "releases",
        "retained",
        "wills",
        "messages",
        "dead_messages",
        "waiters",
    )

    def __init__(self) -> None:
        self.wiped: list[str] = []
        self.sessions: dict[str, tuple[Any, ...]] = {}
        self.subs: dict[tuple[str, str], tuple[Any, ...] | None] = {}
        self.deliveries: dict[tuple[str, int], tuple[Any, ...] | None] = {}
        self.new_deliveries: set[tuple[str, int]] = set()
        self.releases: dict[tuple[str, int], bool] = {}
        self.retained: dict[str, tuple[Any, ...] | None] = {}
        self.wills: dict[str, tuple[Any, ...] | None] = {}
        self.messages: dict[int, Message] = {}
        self.dead_messages: set[int] = set()
        self.waiters: list[Callable[[], None]] = []

    def empty(self) -> bool:
        return not (
            self.wiped
            or self.sessions
            or self.subs
            or self.deliveries
            or self.releases
            or self.retained
            or self.wills
            or self.messages
            or self.dead_messages
        )


async def apply(
    db: aiosqlite.Connection, b: Batch, wall: Callable[[float | None], float | None], path: Path
) -> None:
    """Write one batch in one transaction (rolled back if any of it fails)."""
    await db.execute("BEGIN")
    try:
        if b.wiped:
            rows = [(client_id,) for client_id in b.wiped]
            for table in PER_CLIENT:
                await db.executemany(f"DELETE FROM {table} WHERE client_id = ?", rows)
        if b.messages:
            await db.executemany(
                "INSERT OR REPLACE INTO messages VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        mid,
                        m.topic,
                        m.payload,
                        m.qos,
                        int(m.retain),
                        encode_properties(m.properties),
                        wall(m.expires_at),
                    )
                    for mid, m in b.messages.items()
                ],
            )
        if b.sessions:
            await db.executemany(
                "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?)", list(b.sessions.values())
            )
        await _upsert(db, "subscriptions", "client_id = ? AND topic_filter = ?", b.subs, 7)
        await _upsert(db, "deliveries", "client_id = ? AND seq = ?", b.deliveries, 9)
        if b.releases:
            await db.executemany(
                "INSERT OR REPLACE INTO releases VALUES (?, ?)",
                [k for k, keep in b.releases.items() if keep],
            )
            await db.executemany(
                "DELETE FROM releases WHERE client_id = ? AND packet_id = ?",
                [k for k, keep in b.releases.items() if not keep],
            )
        await _upsert(db, "retained", "topic = ?", b.retained, 5)
        await _upsert(db, "wills", "client_id = ?", b.wills, 8)
        if b.dead_messages:
            await db.executemany(
                "DELETE FROM messages WHERE id = ?", [(mid,) for mid in b.dead_messages]
            )
        await db.execute("COMMIT")
    except BaseException:
        # SQLite may have rolled the transaction back itself (disk full, I/O error): a
        # ROLLBACK then fails and must not hide the error that caused it.
        if db.in_transaction:
            try:
                await db.execute("ROLLBACK")
            except sqlite3.Error as exc:
                log.debug("store %s: rollback failed: %s", path, describe(exc))
        raise


async def _upsert(
    db: aiosqlite.Connection,
    table: str,
    where: str,
    rows: dict[Any, tuple[Any, ...] | None],
    width: int,
) -> None:
    if not rows:
        return
    put = [row for row in rows.values() if row is not None]
    gone = [key if isinstance(key, tuple) else (key,) for key, row in rows.items() if row is None]
    if put:
        marks = ", ".join("?" * width)
        await db.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({marks})", put)
    if gone:
        await db.executemany(f"DELETE FROM {table} WHERE {where}", gone)

"""The write batcher's data: the changes recorded since the last commit, newest value per row,
and the one transaction that writes them."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterable
from itertools import chain
from pathlib import Path
from typing import Any

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


Statements = list[tuple[str, list[tuple[Any, ...]]]]


def statements(b: Batch, wall: Callable[[float | None], float | None]) -> Statements:
    """The batch as SQL and its rows, in the order they must run (built on the event loop)."""
    todo: Statements = []
    if b.wiped:
        rows = [(client_id,) for client_id in b.wiped]
        todo += [(f"DELETE FROM {table} WHERE client_id = ?", rows) for table in PER_CLIENT]
    if b.messages:
        _insert(
            todo,
            "messages",
            7,
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
        _insert(todo, "sessions", 4, list(b.sessions.values()))
    _upsert(todo, "subscriptions", "client_id = ? AND topic_filter = ?", b.subs, 7)
    _upsert(todo, "deliveries", "client_id = ? AND seq BETWEEN ? AND ?", b.deliveries, 9, True)
    if b.releases:
        todo.append(
            (
                "INSERT OR REPLACE INTO releases VALUES (?, ?)",
                [k for k, keep in b.releases.items() if keep],
            )
        )
        todo.append(
            (
                "DELETE FROM releases WHERE client_id = ? AND packet_id = ?",
                [k for k, keep in b.releases.items() if not keep],
            )
        )
    _upsert(todo, "retained", "topic = ?", b.retained, 5)
    _upsert(todo, "wills", "client_id = ?", b.wills, 8)
    if b.dead_messages:
        runs = [(first, last) for _, first, last in _runs((0, mid) for mid in b.dead_messages)]
        todo.append(("DELETE FROM messages WHERE id BETWEEN ? AND ?", runs))
    return todo


def _runs(keys: Iterable[tuple[Any, int]]) -> list[tuple[Any, int, int]]:
    """Keys (owner, number) as runs of consecutive numbers per owner, (owner, first, last):
    what is acknowledged in order is deleted a range at a time."""
    runs: list[tuple[Any, int, int]] = []
    for owner, number in sorted(keys):
        if runs and runs[-1][2] == number - 1 and runs[-1][0] == owner:
            runs[-1] = (owner, runs[-1][1], number)
        else:
            runs.append((owner, number, number))
    return runs


# Rows per INSERT statement: each statement is one step, and the database's thread gives up and
# takes back the GIL (which the event loop holds meanwhile) once per step, not once per row.
# 64 rows of 9 columns stay within SQLite's oldest default limit of 999 parameters.
ROWS_PER_INSERT = 64


def _insert(todo: Statements, table: str, width: int, rows: list[tuple[Any, ...]]) -> None:
    """INSERT OR REPLACE ``rows`` into ``table``, ROWS_PER_INSERT to a statement."""
    one = "(" + ", ".join("?" * width) + ")"
    for start in range(0, len(rows), ROWS_PER_INSERT):
        part = rows[start : start + ROWS_PER_INSERT]
        values = ", ".join([one] * len(part))
        todo.append(
            (f"INSERT OR REPLACE INTO {table} VALUES {values}", [tuple(chain.from_iterable(part))])
        )


def _upsert(
    todo: Statements,
    table: str,
    where: str,
    rows: dict[Any, tuple[Any, ...] | None],
    width: int,
    ranges: bool = False,
) -> None:
    """Rows to put and keys to delete (None); ``ranges``: keys (owner, number), deleted as
    ``_runs`` (``where`` then ends in BETWEEN)."""
    if not rows:
        return
    put = [row for row in rows.values() if row is not None]
    gone: list[tuple[Any, ...]]
    if ranges:
        gone = list(_runs(key for key, row in rows.items() if row is None))
    else:
        gone = [
            key if isinstance(key, tuple) else (key,) for key, row in rows.items() if row is None
        ]
    if put:
        _insert(todo, table, width, put)
    if gone:
        todo.append((f"DELETE FROM {table} WHERE {where}", gone))


def write(db: sqlite3.Connection, todo: Statements, path: Path, checkpoint: bool) -> None:
    """Run ``todo`` in one transaction (rolled back if any of it fails), in the database's
    thread: one call per commit, however many statements (SQLite keeps them prepared).
    ``checkpoint``: first copy what the log holds beyond the last checkpoint into the database
    (a few pages: see SQLiteStore._checkpoint_loop), so that this commit restarts the log."""
    if checkpoint:
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:
            log.debug("store %s: checkpoint failed: %s", path, describe(exc))
    db.execute("BEGIN")
    try:
        for sql, rows in todo:
            db.executemany(sql, rows)
        db.execute("COMMIT")
    except BaseException:
        # SQLite may have rolled the transaction back itself (disk full, I/O error): a
        # ROLLBACK then fails and must not hide the error that caused it.
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error as exc:
                log.debug("store %s: rollback failed: %s", path, describe(exc))
        raise

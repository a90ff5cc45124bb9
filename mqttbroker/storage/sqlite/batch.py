"""The durable store's record keeping, compiled with the hot path (see mqttbroker/compiled.py):
the changes recorded since the last commit, newest value per row (:class:`Batch`), the calls
that record the changes made for every message (:class:`Recorder`), and the one transaction
that writes a batch (:func:`statements`, :func:`write`)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Iterable
from itertools import chain
from pathlib import Path
from typing import Any

from mypy_extensions import mypyc_attr

from ...broker.message import Message
from ...broker.session import Delivery, Session
from ...broker.topics import Subscription
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
        "first_new",
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
        # Client id -> the first delivery key given out in this batch: the keys of a session
        # only grow (until it is deleted: then its rows are wiped first), so a delivery with
        # this key or a later one has never reached the disk.
        self.first_new: dict[str, int] = {}
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


@mypyc_attr(allow_interpreted_subclasses=True)
class Recorder:
    """The calls of the Store interface (broker/store.py) made for every message, recorded in
    the current batch: the SQLite store (store.py) is a Recorder; these run compiled.

    The handles: a message's ``stored`` is its row id in ``messages``, a delivery's its ``seq``
    in ``deliveries``, a session's the next such ``seq`` (1 once saved). How many deliveries
    refer to a stored message: its ``store_refs``."""

    def __init__(self) -> None:
        self.writes = 0  # changes recorded (Store.writes)
        self._batch = Batch()
        self._wake = asyncio.Event()  # the writer's: something was recorded
        self._woken = False  # _wake is set (cleared with it by the writer): set() is a call
        # The writer is woken once ``writes`` reaches this: 0, at the first change; while it
        # gathers, a count to come (SQLiteStore._write_loop).
        self._wake_at = 0
        self._next_message_id = 1
        # Changes no acknowledgement waits for (see _defer) are committed after at most this
        # many seconds (SQLiteStore's defer_wait; 0: as the others), on the loop given at load.
        self.defer_wait = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._defer_timer: asyncio.TimerHandle | None = None

    def _defer(self) -> None:
        """Record a change that no acknowledgement waits for: it is not counted in ``writes``,
        so no connection holds its output for it, and it wakes no commit of its own. The next
        commit takes it with the rest of the batch, ``defer_wait`` seconds later at the latest.
        These are the removal of a QoS 1 or 2 delivery (acknowledged, expired, dropped), the
        packet id a queued QoS 1 message goes out under, and the clock of a session that left
        or came back early in its expiry interval (SQLiteStore.save_session).
        Losing one in a crash sends a QoS 1 message again (at least once) or a PUBREL again,
        or starts a session's clock at the restart: never loses what was acknowledged, as a
        commit writes the whole batch, so the disk holds the broker's state as of a moment no
        earlier than its last acknowledgement."""
        loop = self._loop
        if loop is None or not self.defer_wait:
            self._changed()
        elif self._defer_timer is None and not self._woken:  # (else a commit is coming)
            self._defer_timer = loop.call_later(self.defer_wait, self._defer_due)

    def _defer_due(self) -> None:
        self._defer_timer = None
        self._wake_writer()

    def _wake_writer(self) -> None:
        if not self._woken:
            self._woken = True
            self._wake.set()

    def _changed(self) -> None:
        writes = self.writes + 1
        self.writes = writes
        if writes >= self._wake_at:
            self._wake_writer()

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._batch.waiters.append(callback)
        if self.writes >= self._wake_at:
            self._wake_writer()

    def save_subscription(self, session: Session, sub: Subscription) -> None:
        self._batch.subs[(session.client_id, sub.topic_filter)] = (
            session.client_id,
            sub.topic_filter,
            sub.qos,
            int(sub.no_local),
            int(sub.retain_as_published),
            sub.retain_handling,
            sub.identifier or 0,  # NULL (SUBSCRIPTION_ROW): identifiers start at 1
        )
        self._changed()

    def delete_subscription(self, session: Session, topic_filter: str) -> None:
        self._batch.subs[(session.client_id, topic_filter)] = None
        self._changed()

    def save_delivery(self, session: Session, delivery: Delivery) -> None:
        batch = self._batch
        msg = delivery.message
        client_id = session.client_id
        seq = delivery.stored
        fresh = not seq
        if fresh:
            seq = session.stored or 1
            delivery.stored = seq
            session.stored = seq + 1
            if client_id not in batch.first_new:
                batch.first_new[client_id] = seq
            mid = msg.stored
            if not mid:
                mid = self._next_message_id
                msg.stored = mid
                self._next_message_id = mid + 1
                batch.messages[mid] = msg
                msg.store_refs = 1
            else:
                msg.store_refs += 1
        sub_ids = delivery.sub_ids
        packet_id = delivery.packet_id
        share = delivery.share
        if sub_ids or delivery.released or share:
            row: tuple[Any, ...] = (
                client_id,
                seq,
                msg.stored,
                delivery.qos,
                1 if delivery.retain else 0,
                ",".join([str(i) for i in sub_ids]) if sub_ids else "",
                packet_id or 0,  # NULL (DELIVERY_ROW)
                1 if delivery.released else 0,
                share or "",  # NULL
            )
        elif packet_id:  # in flight (see SENT_ROW)
            row = (client_id, seq, msg.stored, delivery.qos, 1 if delivery.retain else 0, packet_id)
        else:  # queued (the common row: see QUEUED_ROW)
            row = (client_id, seq, msg.stored, delivery.qos, 1 if delivery.retain else 0)
        batch.deliveries[(client_id, seq)] = row
        if fresh or delivery.qos != 1:
            self._changed()  # a message accepted, or a step of a QoS 2 exchange
        else:
            self._defer()  # a QoS 1 message sent: lost, it is sent again as a new one

    def delete_delivery(self, session: Session, delivery: Delivery) -> None:
        seq = delivery.stored
        if not seq:
            return
        batch = self._batch
        client_id = session.client_id
        key = (client_id, seq)
        delivery.stored = 0
        first = batch.first_new.get(client_id)
        if first is not None and seq >= first:  # never reached the disk
            batch.deliveries.pop(key, None)
        else:
            batch.deliveries[key] = None
        msg = delivery.message
        mid = msg.stored
        left = msg.store_refs - 1
        msg.store_refs = left
        if not left:
            if batch.messages.pop(mid, None) is None:
                batch.dead_messages.add(mid)
            msg.stored = 0
        if delivery.qos:
            self._defer()  # delivered (or expired, dropped): lost, it is delivered again
        else:
            self._changed()  # a QoS 0 message sent from the queue: at most once

    def save_release(self, session: Session, packet_id: int) -> None:
        self._batch.releases[(session.client_id, packet_id)] = True
        self._changed()

    def delete_release(self, session: Session, packet_id: int) -> None:
        self._batch.releases[(session.client_id, packet_id)] = False
        self._changed()


Statements = list[tuple[str, list[tuple[Any, ...]]]]


def statements(b: Batch, shift: float) -> Statements:
    """The batch as SQL and its rows, in the order they must run (built on the event loop);
    ``shift``: wall clock minus broker clock, for the times stored."""
    todo: Statements = []
    if b.wiped:
        rows = [(client_id,) for client_id in b.wiped]
        todo += [(f"DELETE FROM {table} WHERE client_id = ?", rows) for table in PER_CLIENT]
    if b.messages:
        plain: list[tuple[Any, ...]] = []
        rich: list[tuple[Any, ...]] = []
        for mid, m in b.messages.items():
            if m.retain or m.properties or m.expires_at is not None:
                rich.append(
                    (
                        mid,
                        m.topic,
                        bytearray(m.payload),  # see MESSAGE_ROW
                        m.qos,
                        1 if m.retain else 0,
                        bytearray(encode_properties(m.properties))
                        if m.properties
                        else NO_PROPERTIES,
                        0.0 if m.expires_at is None else m.expires_at + shift,
                    )
                )
            else:
                plain.append((mid, m.topic, bytearray(m.payload), m.qos))
        if plain:
            _insert(todo, "messages", PLAIN_MESSAGE_ROW, plain)
        if rich:
            _insert(todo, "messages", MESSAGE_ROW, rich)
    if b.sessions:
        _insert(todo, "sessions", _row(4), list(b.sessions.values()))
    _upsert(todo, "subscriptions", "client_id = ? AND topic_filter = ?", b.subs, SUBSCRIPTION_ROW)
    _upsert(
        todo,
        "deliveries",
        "client_id = ? AND seq BETWEEN ? AND ?",
        b.deliveries,
        DELIVERY_ROW,
        True,
        SHORT_DELIVERY_ROWS,
    )
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
    _upsert(todo, "retained", "topic = ?", b.retained, _row(5))
    _upsert(todo, "wills", "client_id = ?", b.wills, _row(8))
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
# 64 rows of 9 columns stay within SQLite's oldest default limit of 999 parameters. Fewer rows
# go in statements of 32, 16, ... 1 rows: a handful of distinct statements per table, all of
# which stay in the connection's cache of prepared statements.
ROWS_PER_INSERT = 64

# The VALUES of one row, per table with rows written per message or subscription. The sqlite3
# module binds None and bytes only after looking for an adapter (sqlite3.register_adapter), a
# lookup that fails and costs more than the row's other columns together: a column that is
# mostly NULL is bound as 0 (or "") and turned into NULL by SQLite, and BLOBs are bound as
# bytearrays, which need no adapter (the copy costs less than the lookup).
#
# Binding the values is most of the processor time of a commit (the sqlite3 module spends about
# 65 ns on an integer and 120-130 ns on a string or BLOB, empty or not): the common rows, a
# queued or in-flight delivery and a message with no properties, retain flag or expiry, have
# their constant columns in the SQL (PLAIN_MESSAGE_ROW, QUEUED_ROW, SENT_ROW), so a commit binds
# only the values that vary.
NO_PROPERTIES = bytearray(encode_properties({}))  # never changed
MESSAGE_ROW = "(?, ?, ?, ?, ?, ?, NULLIF(?, 0.0))"  # expires_at: 0.0 = NULL (no expiry)
PLAIN_MESSAGE_ROW = f"(?, ?, ?, ?, 0, X'{NO_PROPERTIES.hex()}', NULL)"  # id, topic, payload, qos
DELIVERY_ROW = "(?, ?, ?, ?, ?, ?, NULLIF(?, 0), ?, NULLIF(?, ''))"  # packet_id 0, share ""
# client_id, seq, message_id, qos, retain; no sub_ids, packet id, release or share
QUEUED_ROW = "(?, ?, ?, ?, ?, '', NULL, 0, NULL)"
# the same and the packet id it is in flight under (not released: QoS 1, or QoS 2 before PUBREC)
SENT_ROW = "(?, ?, ?, ?, ?, '', ?, 0, NULL)"
# A delivery's row as recorded, by its length: these short forms, or every column (DELIVERY_ROW).
SHORT_DELIVERY_ROWS = {5: QUEUED_ROW, 6: SENT_ROW}
SUBSCRIPTION_ROW = "(?, ?, ?, ?, ?, ?, NULLIF(?, 0))"  # identifier 0


def _row(width: int) -> str:
    return "(" + ", ".join("?" * width) + ")"


def _insert(todo: Statements, table: str, row: str, rows: list[tuple[Any, ...]]) -> None:
    """INSERT OR REPLACE ``rows`` into ``table`` (``row``: one row's VALUES), ROWS_PER_INSERT
    to a statement, then the rest in statements of powers of two rows."""
    start, left = 0, len(rows)
    size = ROWS_PER_INSERT
    while left:
        if left >= size:
            part = rows[start : start + size]
            values = ", ".join([row] * size)
            todo.append(
                (
                    f"INSERT OR REPLACE INTO {table} VALUES {values}",
                    [tuple(chain.from_iterable(part))],
                )
            )
            start += size
            left -= size
        else:
            size //= 2


def _upsert(
    todo: Statements,
    table: str,
    where: str,
    rows: dict[Any, tuple[Any, ...] | None],
    row: str,
    ranges: bool = False,
    short_rows: dict[int, str] | None = None,
) -> None:
    """Rows to put (``row``: one row's VALUES) and keys to delete (None); ``ranges``: keys
    (owner, number), deleted as ``_runs`` (``where`` then ends in BETWEEN). ``short_rows``: the
    VALUES of rows recorded short, by their length (a row of another length has every column)."""
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
    if put and short_rows:
        forms: dict[int, list[tuple[Any, ...]]] = {}
        for values in put:
            width = len(values)
            same = forms.get(width)
            if same is None:
                forms[width] = [values]
            else:
                same.append(values)
        put = []
        for width, same in forms.items():
            form = short_rows.get(width)
            if form is None:
                put += same
            else:
                _insert(todo, table, form, same)
    if put:
        _insert(todo, table, row, put)
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

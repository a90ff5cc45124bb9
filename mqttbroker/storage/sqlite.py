"""The durable store: SQLite through aiosqlite, WAL mode, group commit.

Changes the broker reports are coalesced in memory per row (a QoS 1 message queued and
acknowledged within one batch never touches the disk) and written in one transaction per batch.
A batch starts as soon as the previous one is committed, so under load each fsync carries many
messages; idle, a change is written at once. Connections hold their acknowledgements until the
batch with their changes has committed (see broker/store.py).

Payloads routed to many sessions are stored once (``messages``) and referenced (``deliveries``).
Times are stored as wall-clock seconds, so deadlines survive a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from time import perf_counter  # the commit timer (``time`` is the wall clock, faked in tests)
from typing import TYPE_CHECKING, Any

import aiosqlite

from ..broker.message import Message
from ..broker.session import NEVER, Delivery, Session
from ..broker.store import Store
from ..broker.topics import Subscription
from ..protocol.fastpath import decode_properties, encode_properties
from ..protocol.packets import MQTT_5, PacketType, Will
from ..protocol.properties import WILL, PropertyId
from . import StoreError, describe

if TYPE_CHECKING:
    from ..broker.core import Broker

log = logging.getLogger("mqttbroker.storage")

SYNC_LEVELS = {"off": 0, "normal": 1, "full": 2}


class CommitTimes:
    """A histogram of commit durations (seconds): counts per upper bound, the last bucket
    unbounded, as Prometheus histograms count them; one observation per commit."""

    BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(self.BOUNDS) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        index = 0
        for bound in self.BOUNDS:
            if seconds <= bound:
                break
            index += 1
        self.counts[index] += 1
        self.total += seconds
        self.count += 1


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

_PER_CLIENT = ("sessions", "subscriptions", "deliveries", "releases", "wills")

# What SQLite reports as a damaged file (primary result codes). Anything else that stops the
# database from opening (permission, read-only, locked, full, I/O error) is not damage.
_DAMAGE_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


class _Damaged(Exception):
    """The database is damaged; the message says how."""


def _denied(exc: BaseException) -> bool:
    """A permission problem: the file or its directory may not be read or written."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        return code in (sqlite3.SQLITE_PERM, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN)
    return isinstance(exc, PermissionError) or getattr(exc, "errno", None) == errno.EROFS


class _Batch:
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


class SQLiteStore(Store):
    RETRY_FIRST = 0.25  # seconds before the first retry of a failed commit; doubled each time
    RETRY_MAX = 5.0  # up to this

    def __init__(
        self,
        path: str | Path,
        sync: str = "full",
        on_corrupt: str = "move",
        commit_interval: float = 0.0,
    ) -> None:
        if sync not in SYNC_LEVELS:
            raise ValueError(f"sync must be one of {', '.join(SYNC_LEVELS)}")
        if on_corrupt not in ("move", "refuse"):
            raise ValueError("on_corrupt must be 'move' or 'refuse'")
        self.path = Path(os.path.abspath(path))
        self.sync = sync
        self.on_corrupt = on_corrupt
        self.commit_interval = commit_interval
        self.writes = 0
        self.commits = 0
        self.commit_times = CommitTimes()  # seconds per commit, for /metrics
        self._db: aiosqlite.Connection | None = None
        self._batch = _Batch()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._loading = False
        self._restoring = ""  # the table being restored, for an error
        self._stopped = asyncio.Event()  # set by close(): a retry waits no longer
        self._failing_since: float | None = None  # when commits began to fail (None: they work)
        self._next_message_id = 1
        self._clock: Callable[[], float] = time.monotonic

    @property
    def failing(self) -> bool:
        """Commits fail at present (the disk refuses): /readyz says so."""
        return self._failing_since is not None

    # -- time -------------------------------------------------------------------------------

    def _wall(self, t: float | None) -> float | None:
        return None if t is None else t + (time.time() - self._clock())

    def _local(self, t: float | None) -> float | None:
        return None if t is None else t - (time.time() - self._clock())

    # -- opening ----------------------------------------------------------------------------

    async def _connect(self) -> aiosqlite.Connection:
        """Open, check and upgrade the database. ``_Damaged`` if SQLite finds it corrupt; any
        other error (permission, read-only, locked, disk full, I/O) propagates as it is."""
        connecting = asyncio.ensure_future(aiosqlite.connect(self.path, isolation_level=None))
        try:
            db = await asyncio.shield(connecting)
        except asyncio.CancelledError:
            # Stopped while the connection's thread opens the file: let it finish and close
            # it, so that no thread outlives the event loop.
            with contextlib.suppress(Exception):
                await (await connecting).close()
            raise
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute(f"PRAGMA synchronous={SYNC_LEVELS[self.sync]}")
            async with db.execute("PRAGMA quick_check") as cur:
                row = await cur.fetchone()
            if row is None or row[0] != "ok":
                raise _Damaged(f"integrity check failed: {row[0] if row else '?'}")
            async with db.execute("PRAGMA user_version") as cur:
                row = await cur.fetchone()
            version = row[0] if row else 0
            if version > len(MIGRATIONS):
                raise StoreError(
                    f"{self.path}: written by a newer mqttbroker (schema {version}, this one "
                    f"knows {len(MIGRATIONS)}); upgrade mqttbroker or point --data-dir elsewhere"
                )
            for number in range(version, len(MIGRATIONS)):
                await db.executescript(
                    f"BEGIN; {MIGRATIONS[number]} PRAGMA user_version={number + 1}; COMMIT;"
                )
                log.info("store %s: schema upgraded to version %d", self.path, number + 1)
        except sqlite3.Error as exc:
            await db.close()
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _DAMAGE_CODES:
                raise _Damaged(describe(exc)) from None
            raise
        except BaseException:  # cancelled while starting, too: the connection's thread ends
            await db.close()
            raise
        return db

    async def _open(self) -> aiosqlite.Connection:
        """The database, checked: only real damage may move it aside (``on_corrupt``); a
        database that cannot be used for another reason is a StoreError naming the path and
        the cause, and the file is left as it is."""
        directory = self.path.parent
        if directory.exists() and not directory.is_dir():
            raise StoreError(f"{self.path}: {directory} is not a directory")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            return await self._connect()
        except _Damaged as exc:
            damage = str(exc)
        except (sqlite3.Error, OSError) as exc:
            hint = ""
            if _denied(exc):
                hint = "; the broker's user must be able to read and write it and its directory"
            raise StoreError(
                f"{self.path}: cannot open the database: {describe(exc)}{hint}"
            ) from None
        if self.on_corrupt == "refuse":
            raise StoreError(
                f"{self.path}: the database is damaged ({damage}). Move it aside (or restore a "
                f'backup) and start again, or set storage.on_corrupt = "move" to let the '
                f"broker move it aside and start empty."
            )
        try:
            moved = self._move_aside()
            db = await self._connect()
        except (_Damaged, sqlite3.Error, OSError) as exc:
            raise StoreError(
                f"{self.path}: the database is damaged ({damage}) and cannot be moved aside "
                f"and replaced: {describe(exc)}"
            ) from None
        log.error(
            "STORE DAMAGED: %s could not be used (%s). It was moved to %s and the broker starts "
            "with an EMPTY store: sessions, queued and retained messages are not restored. "
            'Inspect or restore the moved file; set storage.on_corrupt = "refuse" to stop '
            "instead.",
            self.path,
            damage,
            moved,
        )
        return db

    def _move_aside(self) -> Path:
        """Rename the database (and its -wal and -shm files) to ``<name>.damaged-<stamp>``."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        moved = self.path.with_name(f"{self.path.name}.damaged-{stamp}")
        count = 1
        while moved.exists():  # never overwrite an earlier damaged copy
            count += 1
            moved = self.path.with_name(f"{self.path.name}.damaged-{stamp}-{count}")
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{self.path}{suffix}")
            if source.exists():
                os.replace(source, f"{moved}{suffix}")
        return moved

    # -- loading ----------------------------------------------------------------------------

    async def load(self, broker: Broker) -> None:
        """Open the database and restore its state into ``broker``; StoreError (naming the path
        and the cause) if it cannot. The caller closes the store either way."""
        self._clock = broker.clock
        log.info("store %s: opening (SQLite, sync %s)", self.path, self.sync)
        db = self._db = await self._open()
        self._loading = True
        try:
            await self._restore(db, broker)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{self.path}: cannot read the database: {describe(exc)}") from None
        except Exception as exc:  # a row that does not make sense (written by something else?)
            raise StoreError(
                f"{self.path}: cannot restore the stored state ({self._restoring}: "
                f"{type(exc).__name__}: {exc}). Move the file aside (or restore a backup) to "
                "start with an empty store."
            ) from None
        finally:
            self._loading = False
        for session in broker.sessions.values():
            self.save_session(session)  # records the expiry deadline now running
        self._writer = asyncio.create_task(self._write_loop())

    async def _rows(self, db: aiosqlite.Connection, sql: str) -> list[Any]:
        async with db.execute(sql) as cur:
            return list(await cur.fetchall())

    async def _restore(self, db: aiosqlite.Connection, broker: Broker) -> None:
        now = broker.clock()
        await db.execute("DELETE FROM messages WHERE id NOT IN (SELECT message_id FROM deliveries)")
        messages: dict[int, Message] = {}
        self._restoring = "table messages"
        for mid, topic, payload, qos, retain, props, expires_at in await self._rows(
            db, "SELECT id, topic, payload, qos, retain, properties, expires_at FROM messages"
        ):
            msg = Message(
                topic,
                payload,
                qos,
                bool(retain),
                _props(props, PacketType.PUBLISH),
                self._local(expires_at),
            )
            msg.store_id = mid
            messages[mid] = msg
            self._next_message_id = max(self._next_message_id, mid + 1)
        sessions = broker.sessions
        self._restoring = "table sessions"
        for client_id, expiry, expires_at, username in await self._rows(
            db, "SELECT client_id, expiry_interval, expires_at, username FROM sessions"
        ):
            session = Session(client_id, broker.options, self)
            session.username = username
            session.stored = True
            session.expiry_interval = expiry
            if expires_at is not None:
                session.expires_at = self._local(expires_at)
            elif expiry != NEVER:  # connected when the broker stopped: its expiry starts now
                session.expires_at = now + expiry
            sessions[client_id] = session
        self._restoring = "table subscriptions"
        for client_id, topic_filter, qos, no_local, rap, rh, ident in await self._rows(
            db,
            "SELECT client_id, topic_filter, qos, no_local, retain_as_published, "
            "retain_handling, identifier FROM subscriptions",
        ):
            owner = sessions.get(client_id)
            if owner is None:
                continue
            sub = Subscription(
                owner,
                topic_filter,
                qos,
                no_local=bool(no_local),
                retain_as_published=bool(rap),
                retain_handling=rh,
                identifier=ident,
            )
            broker.router.subscribe(sub)
            owner.subscriptions[topic_filter] = sub
        self._restoring = "table deliveries"
        for row in await self._rows(
            db,
            "SELECT client_id, seq, message_id, qos, retain, sub_ids, packet_id, released, "
            "share FROM deliveries ORDER BY client_id, seq",
        ):
            client_id, seq, mid, qos, retain, sub_ids, packet_id, released, share = row
            owner = sessions.get(client_id)
            stored = messages.get(mid)
            if owner is None or stored is None:
                continue
            msg = stored
            ids = tuple(int(i) for i in sub_ids.split(",")) if sub_ids else ()
            delivery = Delivery(msg, qos, bool(retain), ids, share)
            delivery.seq = seq
            delivery.stored = True
            delivery.released = bool(released)
            msg.store_refs += 1
            owner.seq = max(owner.seq, seq)
            if packet_id is not None:
                delivery.packet_id = packet_id
                owner.inflight[packet_id] = delivery
                owner.next_packet_id = packet_id % 65535 + 1
            else:
                delivery.queued_at = now  # its age counts from the restart
                owner.queue.append(delivery)
                owner.queued_bytes += msg.size
        self._restoring = "table releases"
        for client_id, packet_id in await self._rows(
            db, "SELECT client_id, packet_id FROM releases"
        ):
            owner = sessions.get(client_id)
            if owner is not None:
                owner.awaiting_release.add(packet_id)
        self._restoring = "table retained"
        for topic, payload, qos, props, expires_at in await self._rows(
            db, "SELECT topic, payload, qos, properties, expires_at FROM retained"
        ):
            broker.router.retained.store(
                Message(
                    topic,
                    payload,
                    qos,
                    True,
                    _props(props, PacketType.PUBLISH),
                    self._local(expires_at),
                )
            )
        self._restoring = "table wills"
        for client_id, topic, payload, qos, retain, props, version, due_at in await self._rows(
            db,
            "SELECT client_id, topic, payload, qos, retain, properties, version, due_at FROM wills",
        ):
            owner = sessions.get(client_id)
            if owner is None:
                continue
            will = Will(topic, payload, qos, bool(retain), _props(props, WILL))
            if due_at is None:  # connected when the broker stopped: the connection is gone
                delay = will.properties.get(PropertyId.WILL_DELAY_INTERVAL, 0)
                owner.will_due = now + (delay if version == MQTT_5 else 0)
            else:
                owner.will_due = self._local(due_at)
            owner.will = will
        log.info(
            "store %s: restored %d sessions, %d queued or in-flight messages, %d retained",
            self.path,
            len(sessions),
            sum(m.store_refs for m in messages.values()),
            len(broker.router.retained),
        )

    # -- recording changes (called by the broker, synchronously) ----------------------------

    def _changed(self) -> None:
        self.writes += 1
        self._wake.set()

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._batch.waiters.append(callback)
        self._wake.set()

    def save_session(self, session: Session) -> None:
        if self._loading:
            return
        session.stored = True
        self._batch.sessions[session.client_id] = (
            session.client_id,
            session.expiry_interval,
            self._wall(session.expires_at),
            session.username,
        )
        self._changed()

    def delete_session(self, session: Session) -> None:
        if self._loading or not session.stored:
            return  # never written: a clean session costs the store nothing
        session.stored = False
        client_id = session.client_id
        for delivery in list(session.inflight.values()) + list(session.queue):
            if delivery.stored:
                self.delete_delivery(session, delivery)
        batch = self._batch
        batch.wiped.append(client_id)
        batch.sessions.pop(client_id, None)
        batch.wills.pop(client_id, None)
        for sub_key in [k for k in batch.subs if k[0] == client_id]:
            del batch.subs[sub_key]
        for release_key in [k for k in batch.releases if k[0] == client_id]:
            del batch.releases[release_key]
        self._changed()

    def save_subscription(self, session: Session, sub: Subscription) -> None:
        if self._loading:
            return
        self._batch.subs[(session.client_id, sub.topic_filter)] = (
            session.client_id,
            sub.topic_filter,
            sub.qos,
            int(sub.no_local),
            int(sub.retain_as_published),
            sub.retain_handling,
            sub.identifier,
        )
        self._changed()

    def delete_subscription(self, session: Session, topic_filter: str) -> None:
        self._batch.subs[(session.client_id, topic_filter)] = None
        self._changed()

    def save_delivery(self, session: Session, delivery: Delivery) -> None:
        if self._loading:
            return
        batch = self._batch
        msg = delivery.message
        key = (session.client_id, delivery.seq)
        if not delivery.stored:
            delivery.stored = True
            if msg.store_id is None:
                msg.store_id = self._next_message_id
                self._next_message_id += 1
                batch.messages[msg.store_id] = msg
            msg.store_refs += 1
            batch.new_deliveries.add(key)
        batch.deliveries[key] = (
            session.client_id,
            delivery.seq,
            msg.store_id,
            delivery.qos,
            int(delivery.retain),
            ",".join(map(str, delivery.sub_ids)),
            delivery.packet_id,
            int(delivery.released),
            delivery.share,
        )
        self._changed()

    def delete_delivery(self, session: Session, delivery: Delivery) -> None:
        if not delivery.stored:
            return
        delivery.stored = False
        batch = self._batch
        key = (session.client_id, delivery.seq)
        if key in batch.new_deliveries:  # never reached the disk
            batch.new_deliveries.discard(key)
            del batch.deliveries[key]
        else:
            batch.deliveries[key] = None
        msg = delivery.message
        msg.store_refs -= 1
        if msg.store_refs <= 0 and msg.store_id is not None:
            if batch.messages.pop(msg.store_id, None) is None:
                batch.dead_messages.add(msg.store_id)
            msg.store_id = None
        self._changed()

    def save_release(self, session: Session, packet_id: int) -> None:
        self._batch.releases[(session.client_id, packet_id)] = True
        self._changed()

    def delete_release(self, session: Session, packet_id: int) -> None:
        self._batch.releases[(session.client_id, packet_id)] = False
        self._changed()

    def save_retained(self, message: Message) -> None:
        if self._loading:
            return
        self._batch.retained[message.topic] = (
            message.topic,
            message.payload,
            message.qos,
            encode_properties(message.properties),
            self._wall(message.expires_at),
        )
        self._changed()

    def delete_retained(self, topic: str) -> None:
        if self._loading:
            return
        self._batch.retained[topic] = None
        self._changed()

    def save_will(self, session: Session, will: Will, due: float | None) -> None:
        if self._loading:
            return
        version = session.connection.version if session.connection is not None else MQTT_5
        self._batch.wills[session.client_id] = (
            session.client_id,
            will.topic,
            will.payload,
            will.qos,
            int(will.retain),
            encode_properties(will.properties),
            version,
            self._wall(due),
        )
        self._changed()

    def delete_will(self, session: Session) -> None:
        if self._loading:
            return
        self._batch.wills[session.client_id] = None
        self._changed()

    # -- writing ----------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.commit_interval and not self._closing:
                await asyncio.sleep(self.commit_interval)
            await self._commit_pending()
            if self._closing:
                return

    async def _commit_pending(self) -> None:
        """Commit the current batch, then release what waited for it. While the disk refuses
        (full, read-only, I/O error) the batch is retried with backoff and its waiters (held
        acknowledgements) stay held; one ERROR when that starts, one WARNING when it ends.
        Closing, a batch that still fails is given up, its waiters never called."""
        batch = self._batch
        self._batch = _Batch()
        delay = self.RETRY_FIRST
        while not batch.empty():
            try:
                started = perf_counter()
                await self._apply(batch)
                self.commit_times.observe(perf_counter() - started)
            except (sqlite3.Error, OSError) as exc:
                if self._closing:
                    log.error(
                        "store %s: stopping with changes that could not be written (%s): "
                        "their acknowledgements were never sent",
                        self.path,
                        describe(exc),
                    )
                    return
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    log.error(
                        "store %s: cannot commit: %s. Acknowledgements of what is not stored "
                        "are held; retrying until it can be written",
                        self.path,
                        describe(exc),
                    )
                else:
                    log.debug("store %s: commit failed again: %s", self.path, describe(exc))
                try:
                    await asyncio.wait_for(self._stopped.wait(), delay)
                except TimeoutError:
                    pass
                delay = min(delay * 2, self.RETRY_MAX)
            else:
                self.commits += 1
                if self._failing_since is not None:
                    log.warning(
                        "store %s: commits succeed again, after %.1f s",
                        self.path,
                        time.monotonic() - self._failing_since,
                    )
                    self._failing_since = None
                break
        for callback in batch.waiters:
            try:
                callback()
            except Exception:
                log.exception("error in a post-commit callback")

    async def _apply(self, b: _Batch) -> None:
        db = self._db
        assert db is not None
        await db.execute("BEGIN")
        try:
            if b.wiped:
                rows = [(client_id,) for client_id in b.wiped]
                for table in _PER_CLIENT:
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
                            self._wall(m.expires_at),
                        )
                        for mid, m in b.messages.items()
                    ],
                )
            if b.sessions:
                await db.executemany(
                    "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?)", list(b.sessions.values())
                )
            await self._upsert(db, "subscriptions", "client_id = ? AND topic_filter = ?", b.subs, 7)
            await self._upsert(db, "deliveries", "client_id = ? AND seq = ?", b.deliveries, 9)
            if b.releases:
                await db.executemany(
                    "INSERT OR REPLACE INTO releases VALUES (?, ?)",
                    [k for k, keep in b.releases.items() if keep],
                )
                await db.executemany(
                    "DELETE FROM releases WHERE client_id = ? AND packet_id = ?",
                    [k for k, keep in b.releases.items() if not keep],
                )
            await self._upsert(db, "retained", "topic = ?", b.retained, 5)
            await self._upsert(db, "wills", "client_id = ?", b.wills, 8)
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
                    log.debug("store %s: rollback failed: %s", self.path, describe(exc))
            raise

    @staticmethod
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
        gone = [
            key if isinstance(key, tuple) else (key,) for key, row in rows.items() if row is None
        ]
        if put:
            marks = ", ".join("?" * width)
            await db.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({marks})", put)
        if gone:
            await db.executemany(f"DELETE FROM {table} WHERE {where}", gone)

    async def close(self) -> None:
        """Write what is pending (one more attempt if commits are failing) and close. Safe to
        call after a failed ``load``, and more than once."""
        self._closing = True
        self._stopped.set()
        if self._writer is not None:
            self._wake.set()
            await self._writer
            self._writer = None
        db = self._db
        if db is not None:
            await self._commit_pending()  # what was recorded while the writer's last commit ran
            self._db = None
            await db.close()


def _props(data: bytes, packet_type: int) -> dict[int, Any]:
    return decode_properties(data, 0, len(data), packet_type)[0] if data != b"\x00" else {}

"""The durable store: SQLite through aiosqlite, WAL mode, group commit.

Changes the broker reports are coalesced in memory per row (a QoS 1 message queued and
acknowledged within one batch never touches the disk) and written in one transaction per batch.
Idle, a change is written at once; while one commit runs, the next batch fills (the publishers
it will acknowledge wait, the others go on). Under load, with ``sync = "full"``, the writer
gathers: after a large commit it waits, briefly, for as many changes again, which the
acknowledgements it has just released bring back, so that each fsync carries the publishers'
whole window rather than half of it (see ``_write_loop``). Each commit is one call into the
database's thread (``batch.write``). Connections hold their acknowledgements until the batch
with their changes has committed (see broker/store.py).

Changes that no acknowledgement waits for (a delivered message's removal, a QoS 1 message's
packet id, a known session's clock) neither hold output nor start a commit: they go with the
next one, ``defer_wait`` seconds later at the latest (``Recorder._defer``). A storm of
reconnecting clients thus costs a commit per few dozen clients, not per few.

WAL checkpoints never run inside a commit (see ``_checkpoint_loop``): what a commit waits for is
its own pages and, as ``sync`` says, one fsync of the log.

Payloads routed to many sessions are stored once (``messages``) and referenced (``deliveries``).
Times are stored as wall-clock seconds, so deadlines survive a restart. The schema and its
migrations are in ``schema.py``; the record keeping (compiled with the hot path), a batch and
its transaction in ``batch.py``; reading the file back at start in ``restore.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from time import perf_counter  # the commit timer (``time`` is the wall clock, faked in tests)

import aiosqlite

from ...broker.message import Message
from ...broker.session import Session
from ...broker.store import Restored, Store
from ...protocol.fastpath import encode_properties
from ...protocol.packets import MQTT_5, Will
from .. import StoreError, describe
from .batch import Batch, Recorder, statements, write
from .restore import Reader
from .schema import DAMAGE_CODES, SYNC_LEVELS, Damaged, denied, prepare

log = logging.getLogger("mqttbroker.storage")

_yield_processor = getattr(os, "sched_yield", None)  # (Windows has none)


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


class SQLiteStore(Recorder, Store):
    RETRY_FIRST = 0.25  # seconds before the first retry of a failed commit; doubled each time
    RETRY_MAX = 5.0  # up to this
    # Seconds between two WAL checkpoints while commits go on (see _checkpoint_loop).
    CHECKPOINT_INTERVAL = 0.5
    # At most this many copies of the log per checkpoint; they stop at one that finds at most
    # TAIL_FRAMES new frames (pages) in the log (see _copy_log).
    CHECKPOINT_PASSES = 4
    TAIL_FRAMES = 64
    # The writer's gathering under load (see _write_loop): after a commit of at least
    # GATHER_MIN changes, wait for about as many again, at most GATHER_WAIT seconds; after a
    # wait that fell short, commit as soon as possible for GATHER_PAUSE commits.
    GATHER_MIN = 16
    GATHER_WAIT = 0.002
    GATHER_PAUSE = 4
    # A pass of the event loop shorter than this found nothing to do: the commit waits no more.
    SETTLE_IDLE = 0.00005

    def __init__(
        self,
        path: str | Path,
        sync: str = "full",
        on_corrupt: str = "move",
        commit_interval: float = 0.0,
        defer_wait: float = 0.05,
    ) -> None:
        if sync not in SYNC_LEVELS:
            raise ValueError(f"sync must be one of {', '.join(SYNC_LEVELS)}")
        if on_corrupt not in ("move", "refuse"):
            raise ValueError("on_corrupt must be 'move' or 'refuse'")
        Recorder.__init__(self)
        self.path = Path(os.path.abspath(path))
        self.sync = sync
        self.on_corrupt = on_corrupt
        self.commit_interval = commit_interval
        self.defer_wait = defer_wait
        self.commits = 0
        self.commit_times = CommitTimes()  # seconds per commit, for /metrics
        self._db: aiosqlite.Connection | None = None
        self._committed = asyncio.Event()  # a commit happened since the last checkpoint
        self._checkpointer: asyncio.Task[None] | None = None  # see _checkpoint_loop
        self._tail = False  # the writer checkpoints the log's tail before its next commit
        self._writer: asyncio.Task[None] | None = None
        self._taken = 0  # ``writes`` when the last batch was taken for a commit
        # Gathering (_write_loop) pays where each commit waits for an fsync; without one, the
        # wait for the next messages costs more than the commits it saves.
        self._gathers = sync == "full" and not commit_interval
        self._closing = False
        self._stopped = asyncio.Event()  # set by close(): a retry waits no longer
        self._failing_since: float | None = None  # when commits began to fail (None: they work)
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
        """Open, check and upgrade the database. ``Damaged`` if SQLite finds it corrupt; any
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
            await prepare(db, self.path, self.sync)
        except sqlite3.Error as exc:
            await db.close()
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF in DAMAGE_CODES:
                raise Damaged(describe(exc)) from None
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
        # SQLite deletes the write-ahead log when it closes a connection to a main file it
        # finds damaged: the log (the last commits of a killed broker) is kept under a second
        # name until the file has opened, and put back for the move aside (or the refusal).
        wal = Path(f"{self.path}-wal")
        kept = Path(f"{self.path}-wal.kept")
        try:
            if kept.exists() and not wal.exists():  # a start that stopped in between
                os.replace(kept, wal)
            kept.unlink(missing_ok=True)
            if wal.exists():
                os.link(wal, kept)
        except OSError as exc:
            log.debug("store %s: cannot keep a link to the log: %s", self.path, describe(exc))
        try:
            directory.mkdir(parents=True, exist_ok=True)
            db = await self._connect()
            kept.unlink(missing_ok=True)
            return db
        except Damaged as exc:
            damage = str(exc)
        except (sqlite3.Error, OSError) as exc:
            hint = ""
            if denied(exc):
                hint = "; the broker's user must be able to read and write it and its directory"
            raise StoreError(
                f"{self.path}: cannot open the database: {describe(exc)}{hint}"
            ) from None
        finally:
            if kept.exists():
                if wal.exists():
                    kept.unlink()
                else:
                    os.replace(kept, wal)
        if self.on_corrupt == "refuse":
            raise StoreError(
                f"{self.path}: the database is damaged ({damage}). Move it aside (or restore a "
                f'backup) and start again, or set storage.on_corrupt = "move" to let the '
                f"broker move it aside and start empty."
            )
        try:
            moved = self._move_aside()
            db = await self._connect()
        except (Damaged, sqlite3.Error, OSError) as exc:
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

    async def load(self, clock: Callable[[], float]) -> Restored:
        """Open the database and read back what it kept; StoreError (naming the path and the
        cause) if it cannot. The caller closes the store either way."""
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        log.info("store %s: opening (SQLite, sync %s)", self.path, self.sync)
        db = self._db = await self._open()
        reader = Reader(db, self._local, self.path)
        try:
            restored = await reader.read()
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{self.path}: cannot read the database: {describe(exc)}") from None
        except Exception as exc:  # a row that does not make sense (written by something else?)
            raise StoreError(
                f"{self.path}: cannot restore the stored state ({reader.table}: "
                f"{type(exc).__name__}: {exc}). Move the file aside (or restore a backup) to "
                "start with an empty store."
            ) from None
        self._next_message_id = reader.next_message_id
        self._writer = asyncio.create_task(self._write_loop())
        self._checkpointer = asyncio.create_task(self._checkpoint_loop())
        return restored

    # -- recording changes (called by the broker, synchronously) ----------------------------

    # What every message may change is recorded by the compiled Recorder (batch.py); the rest
    # here. The handles are described there.

    def save_session(self, session: Session, early: bool = False) -> None:
        fresh = not session.stored
        if fresh:
            session.stored = 1
        self._batch.sessions[session.client_id] = (
            session.client_id,
            session.expiry_interval,
            self._wall(session.expires_at),
            session.username,
        )
        if fresh or (session.expires_at is None and not early):
            # A session created, or resumed late in its expiry interval: its CONNACK says it
            # is there, and the deadline on file may pass while the broker is down.
            self._changed()
        else:
            # Its clock, running from when it left (or from a restart): lost, the record it had
            # says "connected", and a restart starts its clock later. Or resumed early: lost,
            # the deadline on file is at least half an interval away (Recorder._defer).
            self._defer()

    def delete_session(self, session: Session) -> None:
        if not session.stored:
            return  # never written: a clean session costs the store nothing
        session.stored = 0
        client_id = session.client_id
        for delivery in list(session.inflight.values()) + list(session.queue):
            if delivery.stored:
                self.delete_delivery(session, delivery)
        batch = self._batch
        batch.wiped.append(client_id)
        batch.first_new[client_id] = 1  # its rows are wiped first: every key is new again
        batch.sessions.pop(client_id, None)
        batch.wills.pop(client_id, None)
        for sub_key in [k for k in batch.subs if k[0] == client_id]:
            del batch.subs[sub_key]
        for release_key in [k for k in batch.releases if k[0] == client_id]:
            del batch.releases[release_key]
        self._changed()

    def save_retained(self, message: Message) -> None:
        self._batch.retained[message.topic] = (
            message.topic,
            message.payload,
            message.qos,
            encode_properties(message.properties),
            self._wall(message.expires_at),
        )
        self._changed()

    def delete_retained(self, topic: str) -> None:
        self._batch.retained[topic] = None
        self._changed()

    def save_will(self, session: Session, will: Will, due: float | None) -> None:
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
        self._batch.wills[session.client_id] = None
        self._changed()

    # -- writing ----------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        """Commit what was recorded, a batch at a time. Under load the writer gathers: after
        a commit of at least GATHER_MIN changes, the next one starts once about as many
        changes again (less an eighth) have been recorded since, as the acknowledgements just
        released bring the publishers' next messages, or after GATHER_WAIT seconds, whichever
        comes first. A wait that fell short with changes pending stops the gathering for
        GATHER_PAUSE commits. After a smaller commit the next one lets the event loop go on
        while it is busy (:meth:`_settle`). Only with ``sync = "full"`` and no ``commit_interval``
        (that fixed wait is used instead)."""
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        paused = 0  # commits left before the writer gathers again
        last = 0  # the changes the last commit took
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._woken = False
            target, self._wake_at = self._wake_at, 0
            if timer is not None:
                timer.cancel()
                timer = None
            short = target != 0 and self.writes < target and not self._batch.empty()
            if self.commit_interval and not self._closing:
                await asyncio.sleep(self.commit_interval)
            elif self._gathers and not self._closing and last < self.GATHER_MIN:
                await self._settle()  # (after a large commit the gathering above has waited)
            # What was recorded while it waited woke the writer again: it goes into this
            # commit, which leaves nothing for that wake-up.
            self._wake.clear()
            self._woken = False
            size = self.writes - self._taken  # the changes this commit takes
            if size:
                last = size
            await self._commit_pending()
            if self._closing:
                return
            if short:  # what waited paid for it
                paused = self.GATHER_PAUSE
            elif paused:
                paused -= 1
            elif size >= self.GATHER_MIN and self._gathers:
                self._wake.clear()
                self._woken = False
                self._wake_at = self.writes + size - size // 8
                timer = loop.call_later(self.GATHER_WAIT, self._wake_writer)

    async def _settle(self) -> None:
        """Let the event loop go on while its passes find work, at most GATHER_WAIT seconds:
        what has arrived and is being handled (a storm of reconnecting clients, TLS handshakes
        between their CONNECTs, each CONNECT a change whose CONNACK waits for the commit) goes
        into this commit and its fsync, rather than each few changes into a commit of their
        own. A pass that finds nothing to do (shorter than SETTLE_IDLE) ends the wait, so a
        client alone, or publishers that all wait for their acknowledgements, wait one pass
        more and no longer."""
        begin = perf_counter()
        while not self._closing:
            started = perf_counter()
            await asyncio.sleep(0)  # one pass of the loop: what is ready is handled
            now = perf_counter()
            if now - started < self.SETTLE_IDLE or now - begin >= self.GATHER_WAIT:
                return

    async def _commit_pending(self) -> None:
        """Commit the current batch, then release what waited for it. While the disk refuses
        (full, read-only, I/O error) the batch is retried with backoff and its waiters (held
        acknowledgements) stay held; one ERROR when that starts, one WARNING when it ends.
        Closing, a batch that still fails is given up, its waiters never called."""
        batch = self._batch
        self._batch = Batch()
        self._taken = self.writes
        if self._defer_timer is not None:  # (the changes it waited for are in this batch)
            self._defer_timer.cancel()
            self._defer_timer = None
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
                self._committed.set()
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

    async def _apply(self, batch: Batch) -> None:
        """Write one batch (the commit the retries above repeat): one call into the database's
        thread, not one per statement."""
        db = self._db
        assert db is not None
        tail, self._tail = self._tail, False
        # aiosqlite runs one function in its thread with _execute (its own methods use it; it
        # has no public form): the whole transaction in one call, not one per statement.
        todo = statements(batch, time.time() - self._clock())
        # Once the transaction is in the database thread's queue, the event loop gives up the
        # processor (after the callbacks already due): on a core the two threads share, the
        # loop would otherwise go on until it has nothing to do, and the commit everything
        # waits for would start only then.
        # The call returns at once when nothing else is runnable on this core.
        if _yield_processor is not None:
            asyncio.get_running_loop().call_soon(_yield_processor)
        await db._execute(write, db._conn, todo, self.path, tail)  # type: ignore[no-untyped-call]

    async def _checkpoint_loop(self) -> None:
        """WAL checkpoints off the commit path. The writer does not checkpoint by itself
        (``wal_autocheckpoint`` 0: the commit that crossed the threshold used to wait for the
        whole copy into the database file and its fsync). A connection of our own copies the
        log into the database while commits go on (again while commits add much to it during
        a copy: _copy_log), at most every CHECKPOINT_INTERVAL; then the writer, before its next
        commit, copies the few pages committed meanwhile, so that this commit starts the log
        over from its beginning and the log's size stays bounded."""
        db: aiosqlite.Connection | None = None
        try:
            db = await aiosqlite.connect(self.path, isolation_level=None)
            await db.execute(f"PRAGMA synchronous={SYNC_LEVELS[self.sync]}")
        except (sqlite3.Error, OSError) as exc:
            log.warning(
                "store %s: no connection for checkpoints (%s); the writer checkpoints between "
                "commits instead",
                self.path,
                describe(exc),
            )
            if db is not None:
                await db.close()
                db = None
        try:
            while not self._closing:
                await self._committed.wait()
                self._committed.clear()
                if self._closing:
                    break
                if db is not None:
                    self._tail = False  # the writer does not copy while we do
                    try:
                        await self._copy_log(db)
                    except sqlite3.Error as exc:
                        log.debug("store %s: checkpoint failed: %s", self.path, describe(exc))
                self._tail = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), self.CHECKPOINT_INTERVAL)
        finally:
            if db is not None:
                await db.close()

    async def _copy_log(self, db: aiosqlite.Connection) -> None:
        """Copy the log into the database, then what commits added to it meanwhile, and again,
        until a copy finds at most TAIL_FRAMES new frames (pages) or after CHECKPOINT_PASSES
        copies: what the writer copies itself before its next commit is then what a short
        copy let through, not what the first, long one did. Under load the first copy is long
        and commits add many frames meanwhile; the writer's own copy holds back the
        acknowledgements of its next commit, so it is kept to the few frames the last short
        copy left."""
        logged = 0  # the log's frames the last copy saw
        for _ in range(self.CHECKPOINT_PASSES):
            async with db.execute("PRAGMA wal_checkpoint(PASSIVE)") as cursor:
                row = await cursor.fetchone()
            # (A log that started over meanwhile shows fewer frames; a busy one, -1.)
            if row is None or row[1] - logged <= self.TAIL_FRAMES or self._closing:
                return
            logged = row[1]

    async def close(self) -> None:
        """Write what is pending (one more attempt if commits are failing) and close. Safe to
        call after a failed ``load``, and more than once."""
        self._closing = True
        self._stopped.set()
        if self._checkpointer is not None:
            self._committed.set()
            await self._checkpointer
            self._checkpointer = None
        if self._writer is not None:
            self._wake.set()
            await self._writer
            self._writer = None
        db = self._db
        if db is not None:
            await self._commit_pending()  # what was recorded while the writer's last commit ran
            self._db = None
            await db.close()

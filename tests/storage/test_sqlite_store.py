"""storage/sqlite/store.py, the SQLite store: opening the file, the writer that commits the
broker's changes in batches, and what an acknowledgement waits for.

Acknowledgements mean "stored": a PUBACK/PUBREC (and a SUBACK of a persistent session) reaches
the link only once the batch holding what it acknowledges has committed.

``AckAudit`` watches a publisher's link: at the moment each acknowledgement is written it reads
the database through a connection of its own, and records any acknowledgement whose message (and,
for QoS 2, the packet id awaiting PUBREL) is not committed yet.

The SQLite store's writer under load (SQLiteStore._write_loop): after a commit of at least
GATHER_MIN changes, the next commit waits until about as many changes again are recorded (the
publishers' next messages, brought by the acknowledgements just released), at most GATHER_WAIT
seconds; a wait that falls short stops the gathering for GATHER_PAUSE commits. After a smaller
commit, the next one lets the loop's passes run while they find work (a storm of
reconnections), at most GATHER_WAIT; a change alone waits one pass. A ``sync`` level that does
not fsync each commit and a configured ``commit_interval`` never gather.

The tests set GATHER_WAIT to an hour where a wait must not happen: only the changes recorded can
then start the commit, and a test whose commit would wait for the timer fails on its guard.

A disk that fills up while the broker runs: SQLite fails the commit (SQLITE_FULL, here real,
from a database limited to its current size with ``PRAGMA max_page_count``) and rolls the
transaction back itself. The acknowledgement waits, the log names the real cause once (not the
ROLLBACK that then fails), the batch is retried with backoff, and once the disk has room again
it is committed, acknowledged and logged once more. A stop while the disk is still full gives
up after one more attempt, without acknowledging.

A damaged database must not brick the broker: it is moved aside to ``<name>.damaged-<stamp>``
(never deleted) with a loud log line naming the file, and the broker starts empty; or, with
``on_corrupt="refuse"``, loading raises StoreError naming the file and what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from support.harness import decode_raw, split_raw
from support.sqlite_harness import (
    TIMEOUT,
    FakeTime,
    Node,
    async_test,
    offline_subscriber,
    pk,
    rows,
    snapshot,
)

from mqttbroker.broker.message import Message
from mqttbroker.protocol.properties import PropertyId as Prop
from mqttbroker.storage import StoreError
from mqttbroker.storage.sqlite import SQLiteStore
from mqttbroker.storage.sqlite import store as sqlite_store
from mqttbroker.storage.sqlite.batch import Batch


class AckAudit:
    def __init__(self, path: Path, publisher_id: str) -> None:
        self.path = path
        self.publisher_id = publisher_id
        self.payloads: dict[int, bytes] = {}  # packet id -> payload, as sent
        self.acked: list[int] = []
        self.violations: list[str] = []

    def __call__(self, data: bytes) -> None:
        for raw in split_raw(data):
            packet = decode_raw(raw, 5)
            if not isinstance(packet, pk.Puback | pk.Pubrec):
                continue
            payload = self.payloads[packet.packet_id]
            stored = rows(self.path, "SELECT count(*) FROM messages WHERE payload = ?", (payload,))
            if stored != [(1,)]:
                self.violations.append(f"{type(packet).__name__} {payload!r} before its commit")
            if isinstance(packet, pk.Pubrec):
                release = rows(
                    self.path,
                    "SELECT count(*) FROM releases WHERE client_id = ? AND packet_id = ?",
                    (self.publisher_id, packet.packet_id),
                )
                if release != [(1,)]:
                    self.violations.append(f"PUBREC {payload!r} before its packet id was stored")
            self.acked.append(packet.packet_id)


@async_test
async def test_puback_is_written_only_after_the_commit(node: Node, db_path: Path):
    await offline_subscriber(node, "sub", "d/#")
    pub = await node.connect("pub")
    before = len(pub.written())
    commits = node.s.commits

    packet_id = pub.publish("d/1", b"durable", 1)
    node.b.scheduler.flush()
    assert pub.written()[before:] == []  # held: nothing is committed yet
    assert node.s.commits == commits
    assert rows(db_path, "SELECT count(*) FROM deliveries") == [(0,)]

    await node.committed()
    assert node.s.commits > commits
    assert rows(db_path, "SELECT count(*) FROM deliveries WHERE client_id = 'sub'") == [(1,)]
    node.b.scheduler.flush()
    after = pub.written()[before:]
    assert [(type(p), p.packet_id) for p in after] == [(pk.Puback, packet_id)]


@async_test
async def test_the_loop_yields_the_processor_once_per_commit_while_it_runs(
    node: Node, monkeypatch: pytest.MonkeyPatch
):
    """Once a commit is queued for the database's thread, the event loop yields the processor
    (on a core the two threads share, the commit starts then, not when the loop runs out of
    work): one yield per commit, made while that commit runs (its PUBACK still held)."""
    await offline_subscriber(node, "sub", "d/#")
    pub = await node.connect("pub")
    before = len(pub.written())
    commits = node.s.commits
    yields: list[tuple[int, int]] = []  # (commits done, packets written to pub) at each yield

    def record() -> None:
        yields.append((node.s.commits, len(pub.written()) - before))

    monkeypatch.setattr(sqlite_store, "_yield_processor", record)
    pub.publish("d/1", b"durable", 1)
    node.b.scheduler.flush()
    await node.committed()
    node.b.scheduler.flush()
    assert yields == [(commits, 0)]
    assert node.s.commits == commits + 1
    assert len(pub.written()) - before == 1  # the PUBACK, after the commit


@async_test
async def test_pubrec_is_written_only_after_the_commit(node: Node, db_path: Path):
    await offline_subscriber(node, "sub", "d/#")
    pub = await node.connect("pub", expiry=300)
    before = len(pub.written())

    pub.publish("d/2", b"durable two", 2, packet_id=9)
    node.b.scheduler.flush()
    assert pub.written()[before:] == []
    assert rows(db_path, "SELECT count(*) FROM releases") == [(0,)]

    await node.committed()
    assert rows(db_path, "SELECT client_id, packet_id FROM releases") == [("pub", 9)]
    node.b.scheduler.flush()
    assert [(type(p), p.packet_id) for p in pub.written()[before:]] == [(pk.Pubrec, 9)]


@async_test
async def test_suback_of_a_persistent_session_is_written_after_the_commit(
    node: Node, db_path: Path
):
    client = await node.connect("s", expiry=300)
    before = len(client.written())
    client.send(pk.Subscribe(1, [pk.SubscriptionRequest("a/#", 1)]))
    node.b.scheduler.flush()
    assert client.written()[before:] == []
    await node.committed()
    assert rows(db_path, "SELECT topic_filter FROM subscriptions") == [("a/#",)]
    node.b.scheduler.flush()
    assert [type(p) for p in client.written()[before:]] == [pk.Suback]


@async_test
async def test_ack_to_a_message_for_an_online_persistent_session_follows_its_commit(
    node: Node, db_path: Path
):
    """The subscriber is connected: the copy in flight to it is stored before the PUBACK."""
    sub = await node.connect("sub", expiry=300)
    await sub.subscribe("on/#", 1)
    audit = AckAudit(db_path, "pub")
    pub = await node.connect("pub", on_write=audit)
    for i in range(5):
        payload = b"online %d" % i
        packet_id = pub.publish("on/x", payload, 1)
        assert packet_id is not None
        audit.payloads[packet_id] = payload
        await pub.receive()
    assert len(audit.acked) == 5
    assert audit.violations == []


@async_test
async def test_acks_never_precede_their_commit_while_publishes_stream_in(
    db_path: Path, fake_time: FakeTime
):
    """A publisher keeps sending while the store is committing earlier batches (as a pipelined
    client does: one PUBLISH per event-loop pass). Every PUBACK/PUBREC it gets must acknowledge a
    committed message: an acknowledgement released by the commit of an earlier batch, for a
    message recorded in the next batch, is one a SIGKILL can lose."""
    node = await Node(db_path, fake_time, auto_flush=True).start()
    await offline_subscriber(node, "sub", "stream/#")
    audit = AckAudit(db_path, "pub")
    pub = await node.connect("pub", expiry=300, on_write=audit)
    count = 60
    for i in range(count):
        qos = 1 + i % 2
        payload = b"stream %03d" % i
        packet_id = pub.publish("stream/x", payload, qos)
        assert packet_id is not None
        audit.payloads[packet_id] = payload
        await asyncio.sleep(0)  # the next PUBLISH arrives in a later loop pass
        if i % 7 == 0:
            await asyncio.sleep(0.002)
    deadline = time.monotonic() + 10
    while len(audit.acked) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert len(audit.acked) == count
    assert audit.violations == []


@async_test
async def test_puback_before_a_disconnect_in_the_same_read_waits_for_the_commit(
    node: Node, db_path: Path
):
    """PUBLISH and DISCONNECT arrive in one read (mosquitto_pub -q 1 may do this with a small
    message; any client may). The PUBACK must still not be written before the message is
    committed; closing the connection must not bypass the hold."""
    await offline_subscriber(node, "sub", "bye/#")
    audit = AckAudit(db_path, "pub")
    audit.payloads[1] = b"last words"
    pub = await node.connect("pub", on_write=audit)
    pub.send(pk.Publish("bye/x", b"last words", 1, False, False, 1), pk.Disconnect(0))
    await node.committed()
    node.b.scheduler.flush()
    assert rows(db_path, "SELECT count(*) FROM deliveries") == [(1,)]
    assert audit.violations == []


@async_test
async def test_acks_out_of_order_delete_exactly_the_acknowledged_rows(
    node: Node, db_path: Path, fake_time: FakeTime
):
    """Acknowledged deliveries are deleted a range of sequence numbers at a time: acks with
    gaps, in any order, delete those rows and messages and no neighbour; a restart resends
    exactly the rest."""
    await offline_subscriber(node, "sub", "gap/#")
    pub = await node.connect("pub")
    for i in range(8):
        await pub.publish_acked("gap/x", b"m%d" % i, 1)
    sub = node.client()
    resent = await sub.connect("sub", clean_start=False, expiry=300)
    assert [p.payload for p in resent] == [b"m%d" % i for i in range(8)]
    kept = {2, 5, 6}
    await sub.ack_all([p for i, p in enumerate(resent) if i not in kept][::-1])
    assert rows(db_path, "SELECT seq FROM deliveries ORDER BY seq") == [(3,), (6,), (7,)]
    assert rows(db_path, "SELECT payload FROM messages ORDER BY id") == [
        (b"m2",),
        (b"m5",),
        (b"m6",),
    ]
    await node.close()

    fake_time.reboot()
    node2 = await Node(db_path, fake_time).start()
    again = await node2.client().connect("sub", clean_start=False, expiry=300)
    assert [p.payload for p in again] == [b"m2", b"m5", b"m6"]


async def stream_through_the_log(node: Node, db_path: Path) -> int:
    """500 messages of 16 KB (8 MB) into an offline session, one commit each; the largest
    the log grew meanwhile."""
    await offline_subscriber(node, "sub", "big/#")
    pub = await node.connect("pub")
    payload = os.urandom(16_000)
    largest = 0
    for _ in range(500):
        await pub.publish_acked("big/x", payload, 1)
        largest = max(largest, Path(f"{db_path}-wal").stat().st_size)
    assert rows(db_path, "SELECT count(*) FROM deliveries") == [(500,)]
    return largest


@async_test
async def test_checkpoints_run_beside_the_commits_and_keep_the_log_bounded(
    db_path: Path, fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch
):
    """The writer's connection never checkpoints inside a commit (that made the commit that
    crossed 1,000 pages wait for the whole copy and an fsync of the database file): the
    store's own connection checkpoints beside the commits, and the log still starts over
    while messages stream in, so its size stays bounded."""
    monkeypatch.setattr(SQLiteStore, "CHECKPOINT_INTERVAL", 0.01)
    node = await Node(db_path, fake_time, store_options={"sync": "off"}).start()
    db = node.s._db
    assert db is not None
    async with db.execute("PRAGMA wal_autocheckpoint") as cursor:
        assert await cursor.fetchone() == (0,)
    assert await stream_through_the_log(node, db_path) < 3_000_000


@async_test
async def test_after_a_commit_the_checkpoint_connection_copies_the_log(
    db_path: Path, fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch
):
    """The copies of _copy_log are what the checkpoint connection runs after commits (on its
    own connection, not the writer's), and the writer's next commit then copies the rest."""
    monkeypatch.setattr(SQLiteStore, "CHECKPOINT_INTERVAL", 60.0)  # one copy in this test
    copied = asyncio.Event()
    connections: list[object] = []
    copy_log = SQLiteStore._copy_log
    apply = SQLiteStore._apply
    tails: list[bool] = []  # the flag as each commit after the copy found it

    async def recording(self: SQLiteStore, db: aiosqlite.Connection) -> None:
        connections.append(db)
        await copy_log(self, db)
        copied.set()

    async def watching(self: SQLiteStore, batch: Batch) -> None:
        if copied.is_set():
            tails.append(self._tail)
        await apply(self, batch)

    monkeypatch.setattr(SQLiteStore, "_copy_log", recording)
    monkeypatch.setattr(SQLiteStore, "_apply", watching)
    node = await Node(db_path, fake_time).start()
    await offline_subscriber(node, "sub", "d/#")
    await asyncio.wait_for(copied.wait(), TIMEOUT)
    assert connections and all(db is not node.s._db for db in connections)
    # the writer's next commit copies what came meanwhile (it may have come already)
    assert (tails[0] if tails else node.s._tail) is True


@async_test
async def test_the_checkpoint_copies_again_what_commits_added_while_it_copied(
    db_path: Path, fake_time: FakeTime
):
    """A background checkpoint copies the log, then again as long as the last copy found more
    than TAIL_FRAMES new frames: the writer's own copy before its next commit (which the
    acknowledgements of that commit wait for) is then a few pages. Frames are added here by
    another connection just before the second copy, as commits add them during a long one; a
    reader's open snapshot keeps the log from starting over meanwhile, as those commits do."""
    node = await Node(db_path, fake_time, store_options={"sync": "normal"}).start()
    store = node.s
    other = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    reader = sqlite3.connect(db_path, isolation_level=None)
    checkpointer = await aiosqlite.connect(db_path, isolation_level=None)
    frames = store.TAIL_FRAMES * 4  # one 4 KiB payload: at least one frame each

    def add_frames(first: int) -> None:
        rows = [(f"t/{i}", os.urandom(4096), 0, b"", None) for i in range(first, first + frames)]
        other.executemany("INSERT INTO retained VALUES (?, ?, ?, ?, ?)", rows)

    copies: list[str] = []

    def traced(sql: str) -> None:
        if "wal_checkpoint" in sql:
            copies.append(sql)
            if len(copies) == 2:
                add_frames(frames)  # the commits made while the first copy ran

    try:
        add_frames(0)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM retained").fetchone()
        await checkpointer.set_trace_callback(traced)
        await store._copy_log(checkpointer)
        # the first copy, the second (it finds the new frames), the third (it finds none)
        assert len(copies) == 3
        reader.execute("COMMIT")
        async with checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)") as cursor:
            busy, logged, copied = await cursor.fetchone()
        assert (busy, logged - copied) == (0, 0)  # the log is all in the database
    finally:
        await checkpointer.close()
        other.close()
        reader.close()


@async_test
async def test_without_a_checkpoint_connection_the_writer_checkpoints(
    db_path: Path, fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch, caplog
):
    """The second connection cannot be opened: one WARNING, and the writer checkpoints between
    its commits itself, so the log is still bounded."""
    monkeypatch.setattr(SQLiteStore, "CHECKPOINT_INTERVAL", 0.01)
    connect = aiosqlite.connect
    opened: list[str] = []

    def only_once(*args: Any, **kwargs: Any) -> Any:
        opened.append("connect")
        if len(opened) > 1:
            raise sqlite3.OperationalError("unable to open database file")
        return connect(*args, **kwargs)

    monkeypatch.setattr(aiosqlite, "connect", only_once)
    with caplog.at_level(logging.WARNING, logger="mqttbroker.storage"):
        node = await Node(db_path, fake_time, store_options={"sync": "off"}).start()
        assert await stream_through_the_log(node, db_path) < 3_000_000
    assert len(opened) == 2
    assert "no connection for checkpoints (unable to open database file)" in caplog.text


HOUR = 3600.0


@contextlib.asynccontextmanager
async def _opened(path: Path, **options: Any) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(path, **options)
    await store.load(time.monotonic)
    try:
        yield store
    finally:
        await store.close()


def _record(store: SQLiteStore, count: int) -> None:
    """``count`` changes: retained messages on new topics."""
    start = store.writes
    for n in range(count):
        store.save_retained(Message(f"r/{start + n}", b"x", 1, True))


async def _committed(store: SQLiteStore) -> None:
    """Wait until what is recorded so far is committed (failing after TIMEOUT seconds)."""
    done = asyncio.get_running_loop().create_future()
    store.after_commit(lambda: done.done() or done.set_result(None))
    await asyncio.wait_for(done, TIMEOUT)


async def _assert_held(store: SQLiteStore, count: int) -> None:
    """The last ``count`` changes are still in the batch being recorded: no commit took them,
    though the loop ran (a writer woken takes the batch within a pass or two: _settle)."""
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(store._batch.retained) == count


def _retained(path: Path) -> int:
    return int(rows(path, "SELECT count(*) FROM retained")[0][0])


@async_test
async def test_after_a_large_commit_the_next_waits_for_as_many_changes(db_path: Path) -> None:
    async with _opened(db_path) as store:
        store.GATHER_WAIT = HOUR
        _record(store, 32)
        await _committed(store)
        commits = store.commits

        _record(store, 1)
        waiting = asyncio.get_running_loop().create_future()
        store.after_commit(lambda: waiting.set_result(None))
        await _assert_held(store, 1)  # gathering: 1 of 28

        _record(store, 27)  # 32 less an eighth
        await asyncio.wait_for(waiting, TIMEOUT)
        assert store.commits == commits + 1  # the 28 changes in one commit
        assert _retained(db_path) == 60


@async_test
async def test_a_wait_that_falls_short_commits_and_pauses_the_gathering(db_path: Path) -> None:
    async with _opened(db_path) as store:
        store.GATHER_WAIT = 0.001
        _record(store, 32)
        await _committed(store)
        _record(store, 1)  # no more come: the wait ends on its timer
        await _committed(store)
        assert _retained(db_path) == 33

        store.GATHER_WAIT = HOUR
        assert store.GATHER_PAUSE % 2 == 0
        for _ in range(store.GATHER_PAUSE // 2):  # paused: the commit after 32 does not wait
            _record(store, 32)
            await _committed(store)
            _record(store, 1)
            await _committed(store)
        assert _retained(db_path) == 33 + 33 * store.GATHER_PAUSE // 2

        _record(store, 32)  # then it gathers again
        await _committed(store)
        _record(store, 1)
        await _assert_held(store, 1)


@async_test
async def test_changes_recorded_while_the_loop_is_busy_go_into_one_commit(db_path: Path) -> None:
    """A storm of reconnections: each pass of the loop does a TLS handshake's work and reads a
    CONNECT, a change. The commit waits while the passes find work (at most GATHER_WAIT, here
    long enough never to end it), then takes them all; a pass with nothing to do ends the
    wait (test_small_commits_never_wait: one change alone is committed at once)."""
    async with _opened(db_path) as store:
        store.GATHER_WAIT = 10.0
        loop = asyncio.get_running_loop()

        def one_per_pass(left: int) -> None:
            time.sleep(2 * store.SETTLE_IDLE)  # the pass's work (a handshake: hundreds of µs)
            _record(store, 1)
            if left > 1:
                loop.call_soon(one_per_pass, left - 1)

        commits = store.commits
        one_per_pass(6)
        await _committed(store)
        assert store.commits == commits + 1  # the 6 changes in one commit
        assert _retained(db_path) == 6


@async_test
async def test_small_commits_never_wait(db_path: Path) -> None:
    async with _opened(db_path) as store:
        store.GATHER_WAIT = HOUR
        for count in (1, 1, store.GATHER_MIN - 1, 1):
            commits = store.commits
            _record(store, count)
            await _committed(store)
            assert store.commits == commits + 1
        assert _retained(db_path) == store.GATHER_MIN + 2


async def _resume(
    node: Node, client_id: str, properties: dict[int, Any] | None = None
) -> tuple[Any, list[Any]]:
    """A persistent client comes back (Clean Start 0, ``properties`` in its CONNECT): what
    reached its link at once (the loop has not run: no commit can have happened)."""
    client = node.client()
    client.send(
        pk.Connect(
            client_id=client_id,
            protocol_level=5,
            clean_start=False,
            keep_alive=0,
            will=None,
            properties={Prop.SESSION_EXPIRY_INTERVAL: 300, **(properties or {})},
        )
    )
    node.b.scheduler.flush()
    return client, client.unread()


async def _after_commit(node: Node, client: Any) -> list[Any]:
    """What reached ``client``'s link once the store committed what is recorded."""
    await node.committed()
    node.b.scheduler.flush()
    return client.unread()


async def _queued(
    db_path: Path, fake_time: FakeTime, defer_wait: float, qos: int, *sent: int, **options: Any
) -> tuple[Node, Any]:
    """A node whose store defers for ``defer_wait`` seconds, with a message of each QoS in
    ``sent`` queued for the offline persistent session "sub" (on d/# at ``qos``; payloads m0,
    m1, ...); the node and the publisher."""
    node = await Node(
        db_path, fake_time, store_options={"defer_wait": defer_wait}, **options
    ).start()
    await offline_subscriber(node, "sub", "d/#", qos=qos)
    pub = await node.connect("pub")
    for i, message_qos in enumerate(sent):
        await pub.publish_acked("d/x", b"m%d" % i, message_qos)
    return node, pub


async def _resume_held(node: Node) -> tuple[Any, list[Any]]:
    """The client of "sub" comes back and nothing reaches it before a commit (its CONNECT's
    change is counted: the output waits for it); then what reached it once committed."""
    writes = node.s.writes
    sub, got = await _resume(node, "sub")
    assert got == [] and node.s.writes > writes  # held for the session's commit
    return sub, await _after_commit(node, sub)


def _deliveries(path: Path) -> list[tuple[Any, ...]]:
    return rows(path, "SELECT client_id, seq, packet_id FROM deliveries ORDER BY seq")


@async_test
async def test_what_no_acknowledgement_waits_for_starts_no_commit(
    db_path: Path, fake_time: FakeTime
) -> None:
    """A session resumed early in its expiry interval, a QoS 1 message's packet id and a
    delivered message's removal (``defer_wait``, here an hour): the client gets its CONNACK
    and queued messages without a commit, its PUBACKs start none, and the next commit an
    acknowledgement waits for takes them all."""
    node, pub = await _queued(db_path, fake_time, HOUR, 1, 1, 1)
    store = node.s
    commits, writes = store.commits, store.writes
    assert _deliveries(db_path) == [("sub", 1, None), ("sub", 2, None)]

    fake_time.advance(149)  # of its 300 s
    sub, got = await _resume(node, "sub")
    assert [type(p) for p in got] == [pk.Connack, pk.Publish, pk.Publish]
    assert [p.payload for p in got[1:]] == [b"m0", b"m1"]
    sub.send(*[pk.Puback(p.packet_id) for p in got[1:]])
    for _ in range(20):
        await asyncio.sleep(0)
    assert (store.commits, store.writes) == (commits, writes)
    assert _deliveries(db_path) == [("sub", 1, None), ("sub", 2, None)]  # as they were
    assert len(store._batch.deliveries) == 2 and store._batch.sessions

    await pub.publish_acked("d/x", b"m2", 1)  # in flight at once to the client, now online
    assert store.commits == commits + 1
    assert _deliveries(db_path) == [("sub", 3, got[-1].packet_id + 1)]
    assert rows(db_path, "SELECT payload FROM messages") == [(b"m2",)]
    assert rows(db_path, "SELECT expires_at FROM sessions WHERE client_id = 'sub'") == [(None,)]
    assert store._defer_timer is None  # (its changes went with that commit)
    await node.close()


@async_test
async def test_a_crash_before_the_deferred_commit_delivers_the_messages_again(
    db_path: Path, fake_time: FakeTime
) -> None:
    """At least once: a QoS 1 message acknowledged by the client just before a crash that
    came before the next commit is delivered again after the restart; the session is there."""
    node, _ = await _queued(db_path, fake_time, HOUR, 1, 1, 1)
    commits = node.s.commits
    sub, got = await _resume(node, "sub")
    sub.send(*[pk.Puback(p.packet_id) for p in got[1:]])
    for _ in range(50):  # (time enough for a commit the PUBACKs would have started)
        await asyncio.sleep(0.005)
    assert node.s.commits == commits  # the removals wait for the next commit
    crashed = snapshot(db_path)  # killed before it

    fake_time.reboot(downtime=10)
    again = await Node(crashed, fake_time).start()
    client = again.client()
    resent = await client.connect("sub", clean_start=False, expiry=300)
    assert client.session_present
    assert [p.payload for p in resent] == [b"m0", b"m1"]


@async_test
async def test_a_session_resumed_late_in_its_interval_waits_for_its_commit(
    db_path: Path, fake_time: FakeTime
) -> None:
    """Past half its expiry interval, the deadline on file could pass while the broker is
    down: the CONNACK (and what follows it) waits until the session's new record is stored."""
    node, _ = await _queued(db_path, fake_time, HOUR, 1, 1)
    fake_time.advance(151)
    _, got = await _resume_held(node)
    assert [type(p) for p in got] == [pk.Connack, pk.Publish]
    assert rows(db_path, "SELECT expires_at FROM sessions WHERE client_id = 'sub'") == [(None,)]
    await node.close()


@async_test
async def test_what_no_acknowledgement_waits_for_is_committed_after_defer_wait(
    db_path: Path, fake_time: FakeTime
) -> None:
    node, _ = await _queued(db_path, fake_time, 0.01, 1, 1)
    store = node.s
    commits = store.commits
    sub, got = await _resume(node, "sub")
    assert [type(p) for p in got] == [pk.Connack, pk.Publish]

    sub.send(pk.Puback(got[1].packet_id))
    while store.commits == commits:  # (guarded by the test's timeout)
        await asyncio.sleep(0.005)
    assert store.commits == commits + 1
    assert _deliveries(db_path) == []
    assert rows(db_path, "SELECT count(*) FROM messages") == [(0,)]
    await node.close()


@async_test
async def test_with_defer_wait_0_every_change_waits_for_its_commit(
    db_path: Path, fake_time: FakeTime
) -> None:
    node, _ = await _queued(db_path, fake_time, 0, 1, 1)
    sub, got = await _resume_held(node)
    assert [type(p) for p in got] == [pk.Connack, pk.Publish]
    writes = node.s.writes

    sub.send(pk.Puback(got[1].packet_id))
    assert node.s.writes > writes  # counted: the delete is committed at once
    await node.committed()
    assert _deliveries(db_path) == []
    await node.close()


@async_test
async def test_a_queued_qos_2_message_goes_out_once_its_packet_id_is_stored(
    db_path: Path, fake_time: FakeTime
) -> None:
    """The packet id a queued QoS 2 message goes out under is committed first: after a crash
    it is sent again under that id, which the client knows, not under a new one (a copy)."""
    node, _ = await _queued(db_path, fake_time, HOUR, 2, 2, 2)
    sub, got = await _resume(node, "sub", {Prop.RECEIVE_MAXIMUM: 1})
    assert got == []  # held for m0's packet id
    got = await _after_commit(node, sub)
    assert [(type(p), p.payload) for p in got[1:]] == [(pk.Publish, b"m0")]
    sub.send(pk.Pubrec(got[1].packet_id))
    assert [type(p) for p in await _after_commit(node, sub)] == [pk.Pubrel]
    writes = node.s.writes

    sub.send(pk.Pubcomp(got[1].packet_id))  # room for m1
    node.b.scheduler.flush()
    assert sub.unread() == [] and node.s.writes > writes  # held for m1's packet id
    got = await _after_commit(node, sub)
    assert [(type(p), p.payload) for p in got] == [(pk.Publish, b"m1")]
    assert _deliveries(db_path)[-1] == ("sub", 2, got[0].packet_id)
    await node.close()


@async_test
async def test_a_queued_qos_0_message_goes_out_once_its_removal_is_stored(
    db_path: Path, fake_time: FakeTime
) -> None:
    """A QoS 0 message sent from a session's queue (``queue_qos0``) leaves the store first: at
    most once, also after a crash."""
    node, _ = await _queued(db_path, fake_time, HOUR, 1, 1, 1, 0, queue_qos0=True)
    sub, got = await _resume(node, "sub", {Prop.RECEIVE_MAXIMUM: 1})
    got += await _after_commit(node, sub)
    assert [(type(p), p.payload) for p in got[1:]] == [(pk.Publish, b"m0")]
    writes = node.s.writes

    sub.send(pk.Puback(got[1].packet_id))  # room for m1, then m2 (QoS 0) behind it
    node.b.scheduler.flush()
    assert sub.unread() == [] and node.s.writes > writes  # held for m2's removal
    got = await _after_commit(node, sub)
    assert [(p.qos, p.payload) for p in got] == [(1, b"m1"), (0, b"m2")]
    assert _deliveries(db_path) == [("sub", 2, got[0].packet_id)]
    await node.close()


@pytest.mark.parametrize(
    "options", [{"commit_interval": 0.001}, {"sync": "normal"}, {"sync": "off"}], ids=str
)
def test_without_an_fsync_per_commit_or_with_a_commit_interval_none_waits(
    db_path: Path, options: dict[str, Any]
) -> None:
    @async_test
    async def run() -> None:
        async with _opened(db_path, **options) as store:
            store.GATHER_WAIT = HOUR
            _record(store, 32)
            await _committed(store)
            _record(store, 1)
            await _committed(store)
            assert _retained(db_path) == 33

    run()


FULL = "database or disk is full (SQLITE_FULL)"


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fast retries, and a record of every commit attempt."""
    monkeypatch.setattr(SQLiteStore, "RETRY_FIRST", 0.01, raising=False)
    monkeypatch.setattr(SQLiteStore, "RETRY_MAX", 0.02, raising=False)
    made: list[int] = []
    apply = SQLiteStore._apply

    async def counted(self: SQLiteStore, batch: Any) -> None:
        made.append(1)
        await apply(self, batch)

    monkeypatch.setattr(SQLiteStore, "_apply", counted)
    return made


async def until(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(int(TIMEOUT / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def disk_full(node: Node, full: bool) -> None:
    db = node.s._db
    assert db is not None
    await db.execute(f"PRAGMA max_page_count = {1 if full else 2**31 - 2}")


async def publisher_facing_a_full_disk(node: Node, attempts: list[int]) -> tuple[Any, int, int]:
    """An offline persistent subscriber, a publisher, the disk full, and a QoS 1 PUBLISH whose
    commit has failed three times: (publisher, its output before, the packet id)."""
    sub = await node.connect("sub", expiry=300)
    await sub.subscribe("full/#", 1)
    await sub.disconnect()
    pub = await node.connect("pub")
    before = len(pub.written())
    await disk_full(node, True)
    start = len(attempts)
    packet_id = pub.publish("full/x", os.urandom(100_000), 1)
    assert packet_id is not None
    await until(lambda: len(attempts) >= start + 3, "three failed commits")
    node.b.scheduler.flush()
    assert pub.written()[before:] == [], "acknowledged although not stored"
    return pub, before, packet_id


@async_test
async def test_full_disk_holds_the_ack_logs_the_cause_once_and_recovers(
    node: Node, db_path: Path, attempts: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="mqttbroker.storage"):
        pub, before, packet_id = await publisher_facing_a_full_disk(node, attempts)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, errors
        assert str(db_path) in errors[0] and FULL in errors[0], errors
        assert "rollback" not in errors[0], errors
        assert rows(db_path, "SELECT count(*) FROM messages") == [(0,)]

        await disk_full(node, False)
        received = await pub.receive()
    assert [(type(p), p.packet_id) for p in received] == [(pk.Puback, packet_id)]
    assert rows(db_path, "SELECT count(*) FROM deliveries WHERE client_id = 'sub'") == [(1,)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "commits succeed again" in warnings[0], warnings
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
    await node.close()


@async_test
async def test_stop_while_the_disk_is_full_gives_up_without_acknowledging(
    node: Node, db_path: Path, attempts: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    pub, before, _ = await publisher_facing_a_full_disk(node, attempts)
    with caplog.at_level(logging.ERROR, logger="mqttbroker.storage"):
        await asyncio.wait_for(node.close(), TIMEOUT)
    node.b.scheduler.flush()
    assert pub.written()[before:] == []
    assert "stopping with changes that could not be written" in caplog.text
    assert FULL in caplog.text
    assert rows(db_path, "SELECT count(*) FROM messages") == [(0,)]


GARBAGE = bytes(range(256)) * 64  # 16 KiB that is not an SQLite database


async def filled(db_path: Path, fake_time: FakeTime) -> None:
    """A database with a session and enough retained messages to span many pages."""
    node = await Node(db_path, fake_time).start()
    client = await node.connect("keep", expiry=300)
    await client.subscribe("k/#", 1)
    for i in range(200):
        await client.publish_acked(f"r/{i}", os.urandom(900), 0, retain=True)
    await node.close()


def damaged_files(db_path: Path) -> list[Path]:
    return sorted(db_path.parent.glob(f"{db_path.name}.damaged-*"))


@async_test
async def test_garbage_file_is_moved_aside_and_the_broker_starts_empty(
    db_path: Path, fake_time: FakeTime, caplog
):
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(GARBAGE)
    with caplog.at_level(logging.ERROR, logger="mqttbroker.storage"):
        node = await Node(db_path, fake_time).start()
    moved = damaged_files(db_path)
    assert len(moved) == 1
    assert moved[0].read_bytes() == GARBAGE  # moved, never deleted or changed
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert str(db_path) in errors[0] and str(moved[0]) in errors[0]
    assert "EMPTY" in errors[0] and "on_corrupt" in errors[0]

    # empty, and usable
    assert node.b.sessions == {}
    client = await node.connect("new", expiry=300)
    await client.subscribe("n/#", 1)
    await node.close()
    assert rows(db_path, "SELECT client_id FROM sessions") == [("new",)]


@async_test
async def test_database_with_damaged_pages_is_moved_aside(
    db_path: Path, fake_time: FakeTime, caplog
):
    await filled(db_path, fake_time)
    size = db_path.stat().st_size
    assert size > 8 * 4096
    with open(db_path, "r+b") as fh:  # keep the header page, overwrite the b-tree pages
        fh.seek(2 * 4096)
        fh.write(b"\xa5" * (size - 3 * 4096))
    with caplog.at_level(logging.ERROR, logger="mqttbroker.storage"):
        node = await Node(db_path, fake_time).start()
    assert len(damaged_files(db_path)) == 1
    assert "STORE DAMAGED" in caplog.text and str(db_path) in caplog.text
    assert node.b.sessions == {}
    assert node.b.router.retained.count == 0


@async_test
async def test_damaged_main_file_with_a_write_ahead_log_loses_nothing_silently(
    node: Node, db_path: Path, fake_time: FakeTime
):
    """The broker was killed with its last commits in the -wal file, and the main file is then
    damaged. Either SQLite recovers the state from the WAL, or the WAL is moved aside with the
    main file: the acknowledged message is never silently gone."""
    client = await node.connect("keep", expiry=300)
    await client.subscribe("k/#", 1)
    await client.disconnect()
    publisher = await node.connect("pub")
    await publisher.publish_acked("k/last", b"acknowledged", 1)
    crashed = snapshot(db_path)  # the main file and its -wal, as a SIGKILL leaves them
    wal = Path(f"{crashed}-wal")
    assert wal.stat().st_size > 0
    wal_bytes = wal.read_bytes()
    crashed.write_bytes(GARBAGE)

    node2 = await Node(crashed, fake_time).start()
    session = node2.b.sessions.get("keep")
    if session is not None:  # recovered from the WAL
        assert [d.message.payload for d in session.queue] == [b"acknowledged"]
    else:
        moved = [p for p in damaged_files(crashed) if p.name.endswith("-wal")]
        assert [p.read_bytes() for p in moved] == [wal_bytes]


@async_test
async def test_damaged_main_file_keeps_a_log_without_its_first_page(
    node: Node, db_path: Path, fake_time: FakeTime
):
    """The last commits are only in the -wal (everything before was checkpointed into the main
    file, page 1 too), and the main file is then damaged: SQLite deletes such a log when the
    connection that found the damage closes. The broker keeps it and moves it aside with the
    main file, byte for byte."""
    client = await node.connect("keep", expiry=300)
    await client.subscribe("k/#", 1)
    await client.disconnect()
    # All of it in the main file, log empty: retried while the store's own checkpoint
    # connection holds the checkpoint lock (SQLite then answers busy and leaves the log).
    for _ in range(100):
        if rows(db_path, "PRAGMA wal_checkpoint(TRUNCATE)") == [(0, 0, 0)]:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the log could not be checkpointed")
    publisher = await node.connect("pub")
    await publisher.publish_acked("k/last", b"acknowledged", 1)
    crashed = snapshot(db_path)
    wal_bytes = Path(f"{crashed}-wal").read_bytes()
    assert wal_bytes
    crashed.write_bytes(GARBAGE)

    node2 = await Node(crashed, fake_time).start()
    assert node2.b.sessions == {}
    moved = [p for p in damaged_files(crashed) if p.name.endswith("-wal")]
    assert [p.read_bytes() for p in moved] == [wal_bytes]
    assert not Path(f"{crashed}-wal.kept").exists()


@async_test
async def test_refuse_keeps_the_log_beside_the_damaged_file(db_path: Path, fake_time: FakeTime):
    """``on_corrupt = "refuse"``: the file and its log stay where they are, for the operator."""
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(GARBAGE)
    log_bytes = b"\x37\x7f\x06\x82" + bytes(28)  # a log header (no valid frame)
    Path(f"{db_path}-wal").write_bytes(log_bytes)
    with pytest.raises(StoreError):
        await Node(db_path, fake_time, store_options={"on_corrupt": "refuse"}).start()
    assert Path(f"{db_path}-wal").read_bytes() == log_bytes
    assert not Path(f"{db_path}-wal.kept").exists()


@async_test
async def test_refuse_raises_store_error_naming_the_file_and_what_to_do(
    db_path: Path, fake_time: FakeTime
):
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(GARBAGE)
    with pytest.raises(StoreError) as info:
        await Node(db_path, fake_time, store_options={"on_corrupt": "refuse"}).start()
    message = str(info.value)
    assert str(db_path) in message
    assert "damaged" in message
    assert "Move it aside" in message and 'on_corrupt = "move"' in message
    assert db_path.read_bytes() == GARBAGE  # untouched
    assert damaged_files(db_path) == []


@async_test
async def test_two_damaged_files_moved_in_the_same_second_are_both_kept(
    db_path: Path, fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch
):
    """The issue: the damaged file is moved aside, never deleted. A broker restarted by its
    supervisor can meet a damaged file twice within one second (the stamp has one-second
    resolution); the second move must not overwrite the first moved file."""
    monkeypatch.setattr(sqlite_store.time, "strftime", lambda fmt, *a: "20240101-000000")
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(GARBAGE)
    node = await Node(db_path, fake_time).start()
    await node.close()
    db_path.write_bytes(GARBAGE[::-1])
    Path(f"{db_path}-wal").unlink(missing_ok=True)
    Path(f"{db_path}-shm").unlink(missing_ok=True)
    await Node(db_path, fake_time).start()
    contents = {
        p.read_bytes() for p in damaged_files(db_path) if not p.name.endswith(("-wal", "-shm"))
    }
    assert GARBAGE in contents and GARBAGE[::-1] in contents

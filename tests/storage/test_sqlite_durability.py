"""Acknowledgements mean "stored": a PUBACK/PUBREC (and a SUBACK of a persistent session) reaches
the link only once the batch holding what it acknowledges has committed.

``AckAudit`` watches a publisher's link: at the moment each acknowledgement is written it reads
the database through a connection of its own, and records any acknowledgement whose message (and,
for QoS 2, the packet id awaiting PUBREL) is not committed yet.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from support.harness import decode_raw, split_raw
from support.sqlite_harness import TIMEOUT, FakeTime, Node, async_test, pk, rows

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


async def offline_subscriber(node: Node, client_id: str, topic_filter: str) -> None:
    client = await node.connect(client_id, expiry=300)
    await client.subscribe(topic_filter, 2)
    await client.disconnect()


@async_test
async def test_puback_is_written_only_after_the_commit(db_path: Path, fake_time: FakeTime):
    node = await Node(db_path, fake_time).start()
    await offline_subscriber(node, "sub", "d/#")
    pub = await node.connect("pub")
    before = len(pub.written())
    commits = node.s.commits

    packet_id = pub.publish("d/1", b"durable", 1)
    node.b.flush()
    assert pub.written()[before:] == []  # held: nothing is committed yet
    assert node.s.commits == commits
    assert rows(db_path, "SELECT count(*) FROM deliveries") == [(0,)]

    await node.committed()
    assert node.s.commits > commits
    assert rows(db_path, "SELECT count(*) FROM deliveries WHERE client_id = 'sub'") == [(1,)]
    node.b.flush()
    after = pub.written()[before:]
    assert [(type(p), p.packet_id) for p in after] == [(pk.Puback, packet_id)]


@async_test
async def test_the_loop_yields_the_processor_once_per_commit_while_it_runs(
    db_path: Path, fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch
):
    """Once a commit is queued for the database's thread, the event loop yields the processor
    (on a core the two threads share, the commit starts then, not when the loop runs out of
    work): one yield per commit, made while that commit runs (its PUBACK still held)."""
    node = await Node(db_path, fake_time).start()
    await offline_subscriber(node, "sub", "d/#")
    pub = await node.connect("pub")
    before = len(pub.written())
    commits = node.s.commits
    yields: list[tuple[int, int]] = []  # (commits done, packets written to pub) at each yield

    def record() -> None:
        yields.append((node.s.commits, len(pub.written()) - before))

    monkeypatch.setattr(sqlite_store, "_yield_processor", record)
    pub.publish("d/1", b"durable", 1)
    node.b.flush()
    await node.committed()
    node.b.flush()
    assert yields == [(commits, 0)]
    assert node.s.commits == commits + 1
    assert len(pub.written()) - before == 1  # the PUBACK, after the commit


@async_test
async def test_pubrec_is_written_only_after_the_commit(db_path: Path, fake_time: FakeTime):
    node = await Node(db_path, fake_time).start()
    await offline_subscriber(node, "sub", "d/#")
    pub = await node.connect("pub", expiry=300)
    before = len(pub.written())

    pub.publish("d/2", b"durable two", 2, packet_id=9)
    node.b.flush()
    assert pub.written()[before:] == []
    assert rows(db_path, "SELECT count(*) FROM releases") == [(0,)]

    await node.committed()
    assert rows(db_path, "SELECT client_id, packet_id FROM releases") == [("pub", 9)]
    node.b.flush()
    assert [(type(p), p.packet_id) for p in pub.written()[before:]] == [(pk.Pubrec, 9)]


@async_test
async def test_suback_of_a_persistent_session_is_written_after_the_commit(
    db_path: Path, fake_time: FakeTime
):
    node = await Node(db_path, fake_time).start()
    client = await node.connect("s", expiry=300)
    before = len(client.written())
    client.send(pk.Subscribe(1, [pk.SubscriptionRequest("a/#", 1)]))
    node.b.flush()
    assert client.written()[before:] == []
    await node.committed()
    assert rows(db_path, "SELECT topic_filter FROM subscriptions") == [("a/#",)]
    node.b.flush()
    assert [type(p) for p in client.written()[before:]] == [pk.Suback]


@async_test
async def test_ack_to_a_message_for_an_online_persistent_session_follows_its_commit(
    db_path: Path, fake_time: FakeTime
):
    """The subscriber is connected: the copy in flight to it is stored before the PUBACK."""
    node = await Node(db_path, fake_time).start()
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
    db_path: Path, fake_time: FakeTime
):
    """PUBLISH and DISCONNECT arrive in one read (mosquitto_pub -q 1 may do this with a small
    message; any client may). The PUBACK must still not be written before the message is
    committed; closing the connection must not bypass the hold."""
    node = await Node(db_path, fake_time).start()
    await offline_subscriber(node, "sub", "bye/#")
    audit = AckAudit(db_path, "pub")
    audit.payloads[1] = b"last words"
    pub = await node.connect("pub", on_write=audit)
    pub.send(pk.Publish("bye/x", b"last words", 1, False, False, 1), pk.Disconnect(0))
    await node.committed()
    node.b.flush()
    assert rows(db_path, "SELECT count(*) FROM deliveries") == [(1,)]
    assert audit.violations == []


@async_test
async def test_acks_out_of_order_delete_exactly_the_acknowledged_rows(
    db_path: Path, fake_time: FakeTime
):
    """Acknowledged deliveries are deleted a range of sequence numbers at a time: acks with
    gaps, in any order, delete those rows and messages and no neighbour; a restart resends
    exactly the rest."""
    node = await Node(db_path, fake_time).start()
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

"""The SQLite store's record keeping (storage/sqlite/batch.py): what one commit writes.

A delivery saved and deleted before its batch is committed (a QoS 1 message queued for a
persistent session and acknowledged at once) must cost the disk nothing; one that reached the
disk in an earlier batch must be deleted from it.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from pathlib import Path

from mqttbroker.broker.message import Message
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.broker.session import Delivery, Session
from mqttbroker.broker.topics import Subscription
from mqttbroker.protocol.fastpath import encode_properties
from mqttbroker.storage.sqlite import SQLiteStore
from mqttbroker.storage.sqlite.batch import Batch, statements, write
from mqttbroker.storage.sqlite.schema import MIGRATIONS


def _delivery(payload: bytes) -> Delivery:
    return Delivery(Message("t", payload, 1), 1, False, ())


def _committed(store: SQLiteStore) -> Batch:
    """The batch as the writer takes it for a commit; the next one starts empty."""
    batch = store._batch
    store._batch = Batch()
    return batch


def _open(path: Path) -> tuple[sqlite3.Connection, SQLiteStore, Session]:
    """A database with the current schema, a store recording for it and a saved session "c"."""
    db = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS:
        db.executescript(f"BEGIN; {migration} COMMIT;")
    store = SQLiteStore(path)
    session = Session("c", BrokerOptions(), store)
    store.save_session(session)
    return db, store, session


def _sql(batch: Batch) -> list[str]:
    return [sql.split(" VALUES")[0] for sql, _ in statements(batch, 0.0)]


def test_a_delivery_deleted_before_its_commit_never_reaches_the_disk(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "x.db")
    session = Session("c", BrokerOptions(), store)
    store.save_session(session)
    old = _delivery(b"old")
    store.save_delivery(session, old)
    old_key = old.stored
    assert "INSERT OR REPLACE INTO deliveries" in _sql(_committed(store))

    new = _delivery(b"new")
    store.save_delivery(session, new)
    store.delete_delivery(session, new)
    batch = store._batch
    assert batch.deliveries == {} and batch.messages == {} and not batch.dead_messages
    assert _sql(batch) == []

    store.delete_delivery(session, old)
    assert batch.deliveries == {("c", old_key): None}
    assert batch.dead_messages == {1}
    assert _sql(batch) == [
        "DELETE FROM deliveries WHERE client_id = ? AND seq BETWEEN ? AND ?",
        "DELETE FROM messages WHERE id BETWEEN ? AND ?",
    ]


def test_after_a_session_is_deleted_its_new_deliveries_are_new(tmp_path: Path) -> None:
    """Deleting a session wipes its rows first and starts its keys over: a delivery of the next
    session with that client id, deleted in the same batch, is not written either."""
    store = SQLiteStore(tmp_path / "x.db")
    session = Session("c", BrokerOptions(), store)
    store.save_session(session)
    session.queue = deque()
    for payload in (b"kept", b"later"):  # the second's key is given out in the next batch
        delivery = _delivery(payload)
        session.queue.append(delivery)
        store.save_delivery(session, delivery)
        if payload == b"kept":
            _committed(store)
    store.delete_session(session)

    again = Session("c", BrokerOptions(), store)
    store.save_session(again)
    fresh = _delivery(b"fresh")
    store.save_delivery(again, fresh)
    assert fresh.stored == 1
    store.delete_delivery(again, fresh)
    batch = store._batch
    assert ("c", 1) not in batch.deliveries
    assert "INSERT OR REPLACE INTO deliveries" not in _sql(batch)


def test_rows_are_written_with_their_nulls_and_blobs(tmp_path: Path) -> None:
    """Columns bound as 0 or "" (to spare the sqlite3 module its adapter lookup) are stored as
    NULL; payloads and properties as BLOBs; the values that are there, as they are."""
    path = tmp_path / "x.db"
    db, store, session = _open(path)
    plain = Delivery(Message("t/plain", b"", 1), 1, False, ())
    store.save_delivery(session, plain)
    rich = Delivery(
        Message("t/rich", b"\x00\xff", 2, True, {0x03: "text/plain"}, 90.0),
        2,
        True,
        (7, 9),
        "$share/g/t/#",
    )
    rich.packet_id = 5
    rich.released = True
    store.save_delivery(session, rich)
    store.save_subscription(session, Subscription(session, "t/#", 1))
    store.save_subscription(session, Subscription(session, "u/#", 2, identifier=7))
    write(db, statements(_committed(store), 10.0), path, False)

    deliveries = db.execute(
        "SELECT seq, qos, retain, sub_ids, packet_id, released, share FROM deliveries ORDER BY seq"
    ).fetchall()
    assert deliveries == [(1, 1, 0, "", None, 0, None), (2, 2, 1, "7,9", 5, 1, "$share/g/t/#")]
    messages = db.execute(
        "SELECT topic, typeof(payload), payload, qos, retain, typeof(properties), expires_at "
        "FROM messages ORDER BY id"
    ).fetchall()
    assert messages[0] == ("t/plain", "blob", b"", 1, 0, "blob", None)
    assert messages[1][:5] == ("t/rich", "blob", b"\x00\xff", 2, 1)
    assert messages[1][5:] == ("blob", 100.0)
    subscriptions = db.execute(
        "SELECT topic_filter, identifier FROM subscriptions ORDER BY topic_filter"
    ).fetchall()
    assert subscriptions == [("t/#", None), ("u/#", 7)]


def test_common_rows_bind_only_what_varies(tmp_path: Path) -> None:
    """A queued delivery and a message without properties, retain flag or expiry (most rows)
    bind only their varying columns; the constants are in the SQL. Mixed with rows that need
    every column, in more rows than one statement takes, each row reads back as written: a
    delivery queued and then put in flight within the batch, deliveries in flight, one with only
    a share, a message with only an expiry."""
    path = tmp_path / "x.db"
    db, store, session = _open(path)
    for n in range(70):
        store.save_delivery(session, Delivery(Message("t/plain", b"%d" % n, 1), 1, False, ()))
    for n in range(3):
        rich = Delivery(Message("t/rich", b"r%d" % n, 1, True, {0x03: "a/b"}), 1, True, (4,))
        rich.packet_id = n + 1
        store.save_delivery(session, rich)
    sent = Delivery(Message("t/sent", b"s", 1), 1, False, ())
    store.save_delivery(session, sent)
    sent.packet_id = 9
    store.save_delivery(session, sent)
    store.save_delivery(session, Delivery(Message("t/shared", b"g", 1), 1, False, (), "$share/g/t"))
    for n in range(65):
        flying = Delivery(Message("t/flying", b"f%d" % n, 2), 2, False, ())
        flying.packet_id = 100 + n
        store.save_delivery(session, flying)
    store.save_delivery(
        session, Delivery(Message("t/expiring", b"e", 1, False, None, 50.0), 1, False, ())
    )
    todo = statements(_committed(store), 0.0)

    bound = {"messages": 0, "deliveries": 0}
    for sql, rows in todo:
        table = sql.split()[4]
        if table in bound:
            bound[table] += sum(len(row) for row in rows)
    # plain messages: 70 + sent + shared + 65 flying; deliveries queued: 70 + expiring, in
    # flight: sent + 65 flying, full: 3 rich + shared
    assert bound == {"messages": 137 * 4 + 4 * 7, "deliveries": 71 * 5 + 66 * 6 + 4 * 9}

    write(db, todo, path, False)
    rows = db.execute(
        "SELECT d.seq, d.qos, d.retain, d.sub_ids, d.packet_id, d.released, d.share, m.topic, "
        "m.payload, m.qos, m.retain, m.properties, m.expires_at "
        "FROM deliveries d JOIN messages m ON m.id = d.message_id ORDER BY d.seq"
    ).fetchall()
    empty = encode_properties({})
    rich_properties = encode_properties({0x03: "a/b"})
    assert rows == [
        *[
            (n + 1, 1, 0, "", None, 0, None, "t/plain", b"%d" % n, 1, 0, empty, None)
            for n in range(70)
        ],
        *[
            (71 + n, 1, 1, "4", n + 1, 0, None, "t/rich", b"r%d" % n, 1, 1, rich_properties, None)
            for n in range(3)
        ],
        (74, 1, 0, "", 9, 0, None, "t/sent", b"s", 1, 0, empty, None),
        (75, 1, 0, "", None, 0, "$share/g/t", "t/shared", b"g", 1, 0, empty, None),
        *[
            (76 + n, 2, 0, "", 100 + n, 0, None, "t/flying", b"f%d" % n, 2, 0, empty, None)
            for n in range(65)
        ],
        (141, 1, 0, "", None, 0, None, "t/expiring", b"e", 1, 0, empty, 50.0),
    ]

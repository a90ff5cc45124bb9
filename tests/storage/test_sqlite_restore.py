"""storage/sqlite/restore.py: what one broker wrote, the next one on the same file reads back.

SQLiteStore against a real file: what one broker wrote, a new Broker + SQLiteStore on the same
file restores. Sessions with their expiry, subscriptions with options and identifiers, queued and
in-flight messages, inbound QoS 2 ids, retained messages, message expiry, shared payloads, queue
limits, and the schema version.

"Restart" is a clean stop (``Node.close``) unless the test says "crash": then the next node opens
``snapshot()``, a copy of the file and its WAL taken while the first store is still open, which is
what a SIGKILL leaves on the disk.

Pending wills across a restart: a will waiting out its Will Delay Interval is published after
the delay (by ``broker.tick()`` with the fake clock), at once if the delay ran out while the broker
was down, or when the session ends first; a reconnect in time cancels it. A will of a client that
was connected when the broker died is armed again on restart.
"""

from __future__ import annotations

import gc
import logging
import sqlite3
from pathlib import Path

import pytest
from support.sqlite_harness import (
    MQTT_5,
    Client,
    FakeTime,
    Node,
    Prop,
    async_test,
    offline_subscriber,
    pk,
    rows,
    snapshot,
)

from mqttbroker.broker.session import NEVER
from mqttbroker.broker.store import Restored, SessionRecord
from mqttbroker.storage import StoreError
from mqttbroker.storage.sqlite import MIGRATIONS, SQLiteStore

MQTT_311 = 4


def payloads(packets: list[object]) -> list[bytes]:
    return [p.payload for p in packets if isinstance(p, pk.Publish)]


# -- schema ---------------------------------------------------------------------------------


@async_test
async def test_new_file_gets_current_schema_version_and_wal(node: Node, db_path: Path):
    await node.close()
    assert rows(db_path, "PRAGMA user_version") == [(len(MIGRATIONS),)]
    assert rows(db_path, "PRAGMA journal_mode") == [("wal",)]
    tables = {
        name for (name,) in rows(db_path, "SELECT name FROM sqlite_master WHERE type='table'")
    }
    assert {
        "sessions",
        "subscriptions",
        "messages",
        "deliveries",
        "releases",
        "retained",
        "wills",
    } <= tables


@async_test
async def test_version_0_file_is_migrated(db_path: Path, fake_time: FakeTime, caplog):
    db_path.parent.mkdir(parents=True)
    sqlite3.connect(db_path).close()  # an empty database: user_version 0
    with caplog.at_level(logging.INFO, logger="mqttbroker.storage"):
        node = await Node(db_path, fake_time).start()
        client = await node.connect("m", expiry=60)
        await client.subscribe("t", 1)
        await node.close()
    assert rows(db_path, "PRAGMA user_version") == [(len(MIGRATIONS),)]
    assert rows(db_path, "SELECT client_id, topic_filter FROM subscriptions") == [("m", "t")]
    assert f"schema upgraded to version {len(MIGRATIONS)}" in caplog.text


@async_test
async def test_version_1_file_keeps_its_queued_messages_when_migrated(
    db_path: Path, fake_time: FakeTime
):
    """Version 2 added deliveries.share; a version 1 file's queue survives the upgrade."""
    db_path.parent.mkdir(parents=True)
    db = sqlite3.connect(db_path)
    db.executescript(MIGRATIONS[0])
    db.execute("INSERT INTO sessions VALUES ('old', 600, ?, NULL)", (fake_time.time() + 600,))
    db.execute("INSERT INTO subscriptions VALUES ('old', 'q', 1, 0, 0, 0, NULL)")
    db.execute("INSERT INTO messages VALUES (1, 'q', x'6869', 1, 0, x'00', NULL)")
    db.execute("INSERT INTO deliveries VALUES ('old', 1, 1, 1, 0, '', NULL, 0)")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    node = await Node(db_path, fake_time).start()
    assert [(d.message.payload, d.share) for d in node.session("old").queue] == [(b"hi", None)]
    await node.close()
    assert rows(db_path, "PRAGMA user_version") == [(len(MIGRATIONS),)]
    assert rows(db_path, "SELECT share FROM deliveries") == [(None,)]


@async_test
async def test_file_from_a_newer_broker_is_refused_and_left_alone(
    db_path: Path, fake_time: FakeTime
):
    db_path.parent.mkdir(parents=True)
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE future (x)")
    db.execute("INSERT INTO future VALUES (1)")
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    with pytest.raises(StoreError) as info:
        await Node(db_path, fake_time).start()
    message = str(info.value)
    assert str(db_path) in message
    assert "newer" in message and "99" in message
    assert rows(db_path, "PRAGMA user_version") == [(99,)]
    assert rows(db_path, "SELECT x FROM future") == [(1,)]
    assert not list(db_path.parent.glob("*.damaged-*"))


# -- sessions -------------------------------------------------------------------------------


@async_test
async def test_sessions_restored_with_their_expiry(node: Node, fake_time: FakeTime):
    a = await node.connect("a", expiry=600)
    await a.disconnect()
    forever = await node.connect("forever", expiry=NEVER)
    await forever.disconnect()
    legacy = await node.connect("legacy", version=MQTT_311, clean_start=False)
    await legacy.disconnect()
    clean = await node.connect("clean", expiry=0)
    await clean.subscribe("x", 1)
    await clean.disconnect()
    fake_time.advance(100)
    node = await node.restart(downtime=50)
    node.tick()
    assert set(node.b.sessions) == {"a", "forever", "legacy"}
    a_session = node.session("a")
    assert a_session.expiry_interval == 600
    # 600 s from the disconnect, of which 100 s passed before the stop and 50 s while down
    assert a_session.expires_at == pytest.approx(fake_time.mono + 450)
    assert node.session("forever").expires_at is None
    assert node.session("legacy").expiry_interval == NEVER
    assert node.session("legacy").expires_at is None

    resumed = await node.connect("a", clean_start=False, expiry=600)
    assert resumed.session_present
    again = await node.connect("legacy", version=MQTT_311, clean_start=False)
    assert again.session_present
    fresh = await node.connect("clean", clean_start=False, expiry=60)
    assert not fresh.session_present


@async_test
async def test_session_that_expired_while_down_is_gone(node: Node, db_path: Path):
    await offline_subscriber(node, "short", "s/#", expiry=60)
    await offline_subscriber(node, "long", "l/#", expiry=3600)
    pub = await node.connect("pub")
    await pub.publish_acked("s/1", b"queued", 1)
    node = await node.restart(downtime=61)
    node.tick()  # what the server does right after load: expire what expired while down
    assert set(node.b.sessions) == {"long"}
    await node.committed()
    assert rows(db_path, "SELECT client_id FROM sessions") == [("long",)]
    assert rows(db_path, "SELECT count(*) FROM subscriptions WHERE client_id = 'short'") == [(0,)]
    assert rows(db_path, "SELECT count(*) FROM deliveries") == [(0,)]
    assert rows(db_path, "SELECT count(*) FROM messages") == [(0,)]
    client = await node.connect("short", clean_start=False, expiry=60)
    assert not client.session_present


@async_test
async def test_session_expiry_boundary_across_restart(node: Node):
    await offline_subscriber(node, "edge", "e/#", expiry=60)
    node = await node.restart(downtime=59)
    node.tick()
    assert "edge" in node.b.sessions
    node.tick(advance=0.5)
    assert "edge" in node.b.sessions
    node.tick(advance=0.5)  # exactly 60 s after the disconnect
    assert "edge" not in node.b.sessions


@async_test
async def test_session_connected_at_a_crash_starts_its_expiry_on_restart(
    node: Node, db_path: Path, fake_time: FakeTime
):
    client = await node.connect("online", expiry=120)
    await client.subscribe("o/#", 1)
    crashed = snapshot(db_path)  # killed while the client is connected

    fake_time.reboot(downtime=1000)
    node2 = await Node(crashed, fake_time).start()
    node2.tick()
    session = node2.session("online")
    assert session.connection is None
    assert session.expires_at == pytest.approx(fake_time.mono + 120)
    assert list(session.subscriptions) == ["o/#"]


@async_test
async def test_expiry_changed_on_disconnect_is_stored(node: Node):
    client = await node.connect("c", expiry=10)
    await client.disconnect(properties={Prop.SESSION_EXPIRY_INTERVAL: 3600})
    other = await node.connect("gone", expiry=10)
    await other.subscribe("g", 1)
    await other.disconnect(properties={Prop.SESSION_EXPIRY_INTERVAL: 0})
    node = await node.restart(downtime=100)
    node.tick()
    assert set(node.b.sessions) == {"c"}
    assert node.session("c").expiry_interval == 3600


@async_test
async def test_clean_start_discards_the_stored_session(node: Node, db_path: Path):
    await offline_subscriber(node, "c", "old/#")
    pub = await node.connect("pub")
    await pub.publish_acked("old/1", b"m", 1)
    client = await node.connect("c", clean_start=True, expiry=300)
    await client.subscribe("new/#", 1)
    await client.disconnect()
    node = await node.restart()
    session = node.session("c")
    assert list(session.subscriptions) == ["new/#"]
    assert not session.queue and not session.inflight
    assert rows(db_path, "SELECT count(*) FROM messages") == [(0,)]


@async_test
async def test_session_resumed_with_expiry_0_is_not_restored_after_a_crash(
    node: Node, db_path: Path, fake_time: FakeTime
):
    """A client resumes its session with Session Expiry Interval 0: the session now ends when this
    network connection closes (MQTT-3.1.2-23). A crash closes it, so the restarted broker must not
    bring back the session from before."""
    await offline_subscriber(node, "c", "t/#", expiry=300)
    client = await node.connect("c", clean_start=False, expiry=0)
    assert client.session_present
    crashed = snapshot(db_path)

    node2 = await Node(crashed, fake_time).start()
    node2.tick()
    assert "c" not in node2.b.sessions
    again = await node2.connect("c", clean_start=False, expiry=300)
    assert not again.session_present


# -- subscriptions --------------------------------------------------------------------------


@async_test
async def test_subscriptions_restored_with_options_and_identifiers(node: Node):
    client = await node.connect("s", expiry=300)
    await client.subscribe(
        "a/+/c", 2, no_local=True, retain_as_published=True, retain_handling=2, sub_id=42
    )
    await client.subscribe("b/#", 1, retain_handling=1, sub_id=7)
    await client.subscribe("plain", 0)
    await client.subscribe("dropped/#", 1)
    client.send(pk.Unsubscribe(client.next_id(), ["dropped/#"]))
    assert isinstance((await client.receive())[0], pk.Unsuback)
    await client.disconnect()
    node = await node.restart()
    subs = node.session("s").subscriptions
    assert sorted(subs) == ["a/+/c", "b/#", "plain"]
    a = subs["a/+/c"]
    assert (a.qos, a.no_local, a.retain_as_published, a.retain_handling, a.identifier) == (
        2,
        True,
        True,
        2,
        42,
    )
    b = subs["b/#"]
    assert (b.qos, b.no_local, b.retain_as_published, b.retain_handling, b.identifier) == (
        1,
        False,
        False,
        1,
        7,
    )
    plain = subs["plain"]
    assert (plain.qos, plain.identifier) == (0, None)

    # the router knows them too: a publish after the restart is routed with its identifier
    client = await node.connect("s", clean_start=False, expiry=300)
    pub = await node.connect("pub")
    await pub.publish_acked("a/b/c", b"one", 2, retain=True)
    await pub.publish_acked("dropped/x", b"nobody", 1)
    got = [p for p in await client.receive() if isinstance(p, pk.Publish)]
    assert [(p.topic, p.payload, p.qos, p.retain) for p in got] == [("a/b/c", b"one", 2, True)]
    assert got[0].properties[Prop.SUBSCRIPTION_IDENTIFIER] == [42]


# -- queued and in-flight messages ----------------------------------------------------------


@async_test
async def test_queued_messages_restored_in_order_after_a_crash(
    node: Node, db_path: Path, fake_time: FakeTime
):
    await offline_subscriber(node, "sub", "q/#", qos=2)
    pub = await node.connect("pub")
    sent = []
    for i in range(20):
        qos = 1 + i % 2
        payload = f"m{i:02d}".encode()
        await pub.publish_acked(f"q/{qos}", payload, qos)
        sent.append((payload, qos))
    crashed = snapshot(db_path)

    node2 = await Node(crashed, fake_time).start()
    session = node2.session("sub")
    assert [(d.message.payload, d.qos) for d in session.queue] == sent
    client = node2.client()
    resent = await client.connect("sub", clean_start=False, expiry=300)
    assert client.session_present
    assert [(p.payload, p.qos, p.dup) for p in resent] == [(p, q, False) for p, q in sent]
    assert len({p.packet_id for p in resent}) == len(sent)
    await client.ack_all(resent)
    assert rows(crashed, "SELECT count(*) FROM deliveries") == [(0,)]
    assert rows(crashed, "SELECT count(*) FROM messages") == [(0,)]


@async_test
async def test_shared_messages_still_handed_over_after_a_crash(
    node: Node, db_path: Path, fake_time: FakeTime
):
    """A persistent member of a shared subscription holds its share queued across a crash; when
    its session then expires, its messages go to the other member (section 4.8.2), as they would
    have without the restart."""
    await offline_subscriber(node, "brief", "$share/g/job/+", qos=1, expiry=60)
    await offline_subscriber(node, "lasting", "$share/g/job/+", qos=1, expiry=3600)
    pub = await node.connect("pub")
    for i in range(6):  # round robin: three each
        await pub.publish_acked(f"job/{i}", f"m{i}".encode(), 1)
    crashed = snapshot(db_path)

    node2 = await Node(crashed, fake_time).start()
    brief = node2.session("brief")
    assert [d.share for d in brief.queue] == ["$share/g/job/+"] * 3
    node2.tick(advance=61)  # "brief" expires
    assert "brief" not in node2.b.sessions
    lasting = node2.session("lasting")
    assert sorted(d.message.payload for d in lasting.queue) == [f"m{i}".encode() for i in range(6)]
    await node2.committed()
    assert rows(crashed, "SELECT count(*) FROM deliveries WHERE client_id = 'lasting'") == [(6,)]


@async_test
async def test_inflight_messages_restored_with_packet_ids_and_pubrel_state(
    node: Node, db_path: Path, fake_time: FakeTime
):
    sub = await node.connect("sub", expiry=300, properties={Prop.RECEIVE_MAXIMUM: 2})
    await sub.subscribe("f/#", 2)
    pub = await node.connect("pub")
    await pub.publish_acked("f/a", b"two", 2)
    await pub.publish_acked("f/b", b"one", 1)
    await pub.publish_acked("f/c", b"queued", 1)
    got = await sub.receive()
    assert [(p.payload, p.qos) for p in got] == [(b"two", 2), (b"one", 1)]
    two_id, one_id = got[0].packet_id, got[1].packet_id
    sub.send(pk.Pubrec(two_id))  # the broker answers PUBREL and records it
    assert [type(p) for p in await sub.receive()] == [pk.Pubrel]
    crashed = snapshot(db_path)  # killed: PUBCOMP for "two" and PUBACK for "one" never come

    node2 = await Node(crashed, fake_time).start()
    session = node2.session("sub")
    assert list(session.inflight) == [two_id, one_id]
    assert session.inflight[two_id].released and session.inflight[two_id].qos == 2
    assert not session.inflight[one_id].released and session.inflight[one_id].qos == 1
    assert [d.message.payload for d in session.queue] == [b"queued"]

    client = node2.client()
    resent = await client.connect(
        "sub", clean_start=False, expiry=300, properties={Prop.RECEIVE_MAXIMUM: 2}
    )
    assert client.session_present
    assert isinstance(resent[0], pk.Pubrel) and resent[0].packet_id == two_id
    assert isinstance(resent[1], pk.Publish)
    assert (resent[1].packet_id, resent[1].payload, resent[1].dup) == (one_id, b"one", True)
    assert len(resent) == 2  # the receive window is full: "queued" waits
    client.send(pk.Pubcomp(two_id))
    more = await client.receive()
    assert [(p.payload, p.dup) for p in more] == [(b"queued", False)]
    assert more[0].packet_id not in (one_id,)
    await client.ack_all([resent[1], *more])
    assert rows(crashed, "SELECT count(*) FROM deliveries") == [(0,)]


@async_test
async def test_inbound_qos2_resent_after_restart_is_not_delivered_twice(
    node: Node, db_path: Path, fake_time: FakeTime
):
    await offline_subscriber(node, "sub", "x/#", qos=2)
    pub = await node.connect("pub", expiry=300)
    pub.publish("x/1", b"exactly once", 2, packet_id=7)
    assert [(type(p), p.packet_id) for p in await pub.receive()] == [(pk.Pubrec, 7)]
    crashed = snapshot(db_path)  # killed before the publisher's PUBREL
    assert rows(crashed, "SELECT client_id, packet_id FROM releases") == [("pub", 7)]

    node2 = await Node(crashed, fake_time).start()
    assert node2.session("pub").awaiting_release == {7}
    pub2 = node2.client()
    await pub2.connect("pub", clean_start=False, expiry=300)
    assert pub2.session_present
    pub2.publish("x/1", b"exactly once", 2, packet_id=7, dup=True)  # it never saw the PUBREC
    assert [(type(p), p.packet_id) for p in await pub2.receive()] == [(pk.Pubrec, 7)]
    pub2.send(pk.Pubrel(7))
    answer = await pub2.receive()
    assert [(type(p), p.packet_id, p.reason_code) for p in answer] == [(pk.Pubcomp, 7, 0)]
    assert rows(crashed, "SELECT count(*) FROM releases") == [(0,)]

    sub = node2.client()
    got = await sub.connect("sub", clean_start=False, expiry=300)
    assert payloads(got) == [b"exactly once"]


@async_test
async def test_packet_ids_after_restart_do_not_collide_with_inflight(node: Node):
    sub = await node.connect("sub", expiry=300)
    await sub.subscribe("p/#", 1)
    pub = await node.connect("pub")
    for i in range(3):
        await pub.publish_acked("p/x", b"%d" % i, 1)
    first = await sub.receive()
    assert len(first) == 3
    node = await node.restart()  # clean stop with three messages unacknowledged
    sub = node.client()
    resent = await sub.connect("sub", clean_start=False, expiry=300)
    assert [p.packet_id for p in resent] == [p.packet_id for p in first]
    assert all(p.dup for p in resent)
    pub = await node.connect("pub")
    await pub.publish_acked("p/x", b"new", 1)
    new = await sub.receive()
    assert len(new) == 1 and new[0].packet_id not in {p.packet_id for p in first}


# -- retained messages ----------------------------------------------------------------------


@async_test
async def test_retained_messages_restored_and_removal_kept(
    node: Node, db_path: Path, fake_time: FakeTime
):
    pub = await node.connect("pub")
    props = {Prop.CONTENT_TYPE: "text/plain", Prop.USER_PROPERTY: [("k", "v")]}
    await pub.publish_acked("r/kept", b"kept", 1, retain=True, properties=props)
    await pub.publish_acked("r/removed", b"soon gone", 2, retain=True)
    await pub.publish_acked("r/replaced", b"old", 1, retain=True)
    await pub.publish_acked("r/replaced", b"new", 0, retain=True)
    await pub.publish_acked("r/removed", b"", 1, retain=True)
    crashed = snapshot(db_path)

    node2 = await Node(crashed, fake_time).start()
    retained = node2.b.router.retained
    assert retained.get("r/removed") is None
    kept = retained.get("r/kept")
    assert kept is not None and kept.payload == b"kept" and kept.qos == 1
    assert kept.properties[Prop.CONTENT_TYPE] == "text/plain"
    replaced = retained.get("r/replaced")
    assert replaced is not None and (replaced.payload, replaced.qos) == (b"new", 0)

    observer = await node2.connect("obs")
    got = [p for p in await observer.subscribe("r/#", 2) if isinstance(p, pk.Publish)]
    assert sorted((p.topic, p.payload, p.retain) for p in got) == [
        ("r/kept", b"kept", True),
        ("r/replaced", b"new", True),
    ]
    kept_packet = next(p for p in got if p.topic == "r/kept")
    assert kept_packet.properties[Prop.USER_PROPERTY] == [("k", "v")]


# -- message expiry -------------------------------------------------------------------------


@async_test
async def test_message_expiry_honoured_across_restart(
    node: Node, db_path: Path, fake_time: FakeTime
):
    await offline_subscriber(node, "sub", "e/#", qos=1)
    pub = await node.connect("pub")
    short = {Prop.MESSAGE_EXPIRY_INTERVAL: 30}
    long = {Prop.MESSAGE_EXPIRY_INTERVAL: 300}
    await pub.publish_acked("e/short", b"short", 1, properties=short)
    await pub.publish_acked("e/long", b"long", 1, properties=long)
    await pub.publish_acked("e/none", b"none", 1)
    await pub.publish_acked("e/r-short", b"rs", 1, retain=True, properties=short)
    await pub.publish_acked("e/r-long", b"rl", 1, retain=True, properties=long)
    fake_time.advance(20)
    node = await node.restart(downtime=80)  # 100 s after publishing
    node.tick()
    client = node.client()
    got = await client.connect("sub", clean_start=False, expiry=300)
    # the queue: "short" expired while the broker was down; "long" carries what is left of it
    # (the two retained publishes were queued for it too, as ordinary messages)
    assert [p.payload for p in got] == [b"long", b"none", b"rl"]
    assert [p.properties.get(Prop.MESSAGE_EXPIRY_INTERVAL) for p in got] == [200, None, 200]
    await client.ack_all(got)
    assert rows(db_path, "SELECT count(*) FROM deliveries") == [(0,)]

    # retained: the expired one is not sent, the other with its remaining time
    observer = await node.connect("obs")
    retained = [p for p in await observer.subscribe("e/#", 1) if isinstance(p, pk.Publish)]
    assert [(p.payload, p.properties.get(Prop.MESSAGE_EXPIRY_INTERVAL)) for p in retained] == [
        (b"rl", 200)
    ]
    await node.committed()
    assert rows(db_path, "SELECT topic FROM retained") == [("e/r-long",)]


# -- payloads stored once -------------------------------------------------------------------


@async_test
async def test_payload_for_many_offline_sessions_is_stored_once(
    node: Node, db_path: Path, fake_time: FakeTime
):
    for name in ("s1", "s2", "s3"):
        await offline_subscriber(node, name, "fan/#", qos=1)
    pub = await node.connect("pub")
    big = b"P" * 10_000
    await pub.publish_acked("fan/out", big, 1)
    assert rows(db_path, "SELECT count(*), sum(length(payload)) FROM messages") == [(1, 10_000)]
    assert rows(db_path, "SELECT client_id FROM deliveries ORDER BY client_id") == [
        ("s1",),
        ("s2",),
        ("s3",),
    ]
    crashed = snapshot(db_path)

    node2 = await Node(crashed, fake_time).start()
    messages = {id(node2.session(n).queue[0].message) for n in ("s1", "s2", "s3")}
    assert len(messages) == 1  # one Message object shared, as before the restart
    for index, name in enumerate(("s1", "s2", "s3")):
        client = node2.client()
        got = await client.connect(name, clean_start=False, expiry=300)
        assert payloads(got) == [big]
        await client.ack_all(got)
        left = 2 - index
        assert rows(crashed, "SELECT count(*) FROM deliveries") == [(left,)]
        assert rows(crashed, "SELECT count(*) FROM messages") == [(1 if left else 0,)]


@async_test
async def test_the_store_keeps_no_table_that_grows_with_the_queued_messages(node: Node):
    """What the store counts per stored message (the deliveries that refer to it) lives on the
    message: a table of its own, one entry per queued message, made the broker stop for a
    copy of the whole table each time it doubled (24 ms at 700,000 queued messages)."""
    await offline_subscriber(node, "sub", "q/#", qos=1)
    for name in ("f1", "f2"):
        await offline_subscriber(node, name, "fan/#", qos=1)
    pub = await node.connect("pub")
    queued = 300
    for i in range(queued):
        await pub.publish_acked("q/x", b"%03d" % i, 1)
    await pub.publish_acked("fan/out", b"shared", 1)
    await node.committed()

    # Everything the store refers to, and one level further (its batch's tables): nothing
    # holds an entry per queued message.
    seen = gc.get_referents(node.s)
    seen += [inner for outer in seen for inner in gc.get_referents(outer)]
    sizes = [len(o) for o in seen if isinstance(o, dict | list | set)]
    assert sizes and max(sizes) < queued, sizes

    assert [d.message.store_refs for d in list(node.session("sub").queue)[:2]] == [1, 1]
    shared = node.session("f1").queue[0].message
    assert shared is node.session("f2").queue[0].message and shared.store_refs == 2
    await node.close()


# -- queue limits ---------------------------------------------------------------------------


@async_test
async def test_queue_limit_counts_overflow_and_bounds_memory_and_disk(
    db_path: Path, fake_time: FakeTime
):
    node = await Node(db_path, fake_time, max_queued_messages=5).start()
    await offline_subscriber(node, "sub", "lim/#", qos=1)
    pub = await node.connect("pub")
    for i in range(12):
        await pub.publish_acked("lim/x", b"%02d" % i, 1)
    session = node.session("sub")
    assert session.dropped == 7
    assert len(session.queue) == 5
    assert rows(db_path, "SELECT count(*) FROM deliveries") == [(5,)]
    assert rows(db_path, "SELECT count(*) FROM messages") == [(5,)]
    await node.close()

    node = await Node(db_path, fake_time, max_queued_messages=5).start()
    assert [d.message.payload for d in node.session("sub").queue] == [b"%02d" % i for i in range(5)]
    pub = await node.connect("pub")
    await pub.publish_acked("lim/x", b"over", 1)  # the restored queue is still full
    assert node.session("sub").dropped == 1
    assert len(node.session("sub").queue) == 5
    client = node.client()
    got = await client.connect("sub", clean_start=False, expiry=300)
    assert payloads(got) == [b"%02d" % i for i in range(5)]


@async_test
async def test_queue_byte_limit_bounds_what_is_stored(db_path: Path, fake_time: FakeTime, caplog):
    node = await Node(db_path, fake_time, max_queued_bytes=10_000).start()
    await offline_subscriber(node, "sub", "b/#", qos=1)
    pub = await node.connect("pub")
    with caplog.at_level(logging.WARNING, logger="mqttbroker.session"):
        for _ in range(10):
            await pub.publish_acked("b/x", b"z" * 3000, 1)
    session = node.session("sub")
    assert len(session.queue) == 3 and session.queued_bytes <= 10_000
    assert session.dropped == 7
    assert "session sub: 1 messages dropped (queue full)" in caplog.text
    assert rows(db_path, "SELECT count(*) FROM deliveries") == [(3,)]
    await node.close()

    node = await Node(db_path, fake_time, max_queued_bytes=10_000).start()
    restored = node.session("sub")
    assert len(restored.queue) == 3 and restored.queued_bytes == session.queued_bytes


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311])
@async_test
async def test_queue_restores_for_both_protocol_versions(
    node: Node, db_path: Path, fake_time: FakeTime, version: int
):
    if version == MQTT_5:
        sub = await node.connect("sub", expiry=300)
    else:
        sub = await node.connect("sub", version=version, clean_start=False)
    await sub.subscribe("v/#", 2)
    await sub.disconnect()
    pub = await node.connect("pub", version=version)
    await pub.publish_acked("v/1", b"one", 1)
    await pub.publish_acked("v/2", b"two", 2)
    crashed = snapshot(db_path)

    node2 = await Node(crashed, fake_time).start()
    client = node2.client(version)
    if version == MQTT_5:
        got = await client.connect("sub", clean_start=False, expiry=300)
    else:
        got = await client.connect("sub", clean_start=False)
    assert client.session_present
    assert [(p.payload, p.qos) for p in got] == [(b"one", 1), (b"two", 2)]


# -- the restore API ------------------------------------------------------------------------


@async_test
async def test_the_store_hands_back_records_without_a_broker(
    node: Node, db_path: Path, fake_time: FakeTime
):
    """``load`` reads the file into plain records (broker/store.py) on the clock it is given;
    it builds no session: the broker does, from the records."""
    await offline_subscriber(node, "sub", "t/#", qos=1, expiry=600)
    publisher = await node.connect("pub")
    await publisher.publish_acked("t/a", b"one", 1)
    await publisher.publish_acked("t/b", b"kept", 1, retain=True)
    await node.close()
    fake_time.reboot()

    store = SQLiteStore(db_path)
    try:
        restored = await store.load(fake_time.clock)
    finally:
        await store.close()
    assert isinstance(restored, Restored)
    assert [m.topic for m in restored.retained] == ["t/b"]
    [record] = restored.sessions
    assert isinstance(record, SessionRecord)
    assert (record.client_id, record.expiry_interval, record.will) == ("sub", 600, None)
    assert [(s.topic_filter, s.qos) for s in record.subscriptions] == [("t/#", 1)]
    assert [(d.message.payload, d.packet_id) for d in record.deliveries] == [
        (b"one", None),
        (b"kept", None),
    ]
    assert record.expires_at is not None and record.expires_at > fake_time.clock()


def will(delay: int | None, *, qos: int = 1, retain: bool = False) -> pk.Will:
    props: dict[int, object] = {
        Prop.CONTENT_TYPE: "text/plain",
        Prop.USER_PROPERTY: [("why", "gone")],
    }
    if delay is not None:
        props[Prop.WILL_DELAY_INTERVAL] = delay
    return pk.Will("will/w", b"w is gone", qos, retain, props)


async def watch(node: Node, name: str = "observer") -> Client:
    observer = await node.connect(name)
    await observer.subscribe("will/#", 1)
    return observer


async def published(observer: Client) -> list[pk.Publish]:
    got = await observer.receive()
    return [p for p in got if isinstance(p, pk.Publish)]


async def restarted_with_a_pending_will(
    node: Node, *, expiry: int, delay: int, downtime: float
) -> tuple[Node, Client]:
    """``node``, once its client ``w`` dropped (no DISCONNECT) with a will delayed by ``delay``,
    stopped and started again ``downtime`` later; and an observer of the wills on the new node."""
    w = await node.connect("w", expiry=expiry, will=will(delay))
    await w.lose()
    node = await node.restart(downtime)
    return node, await watch(node)


async def assert_no_will_after_a_restart(
    db_path: Path, fake_time: FakeTime, observer_name: str = "observer"
) -> None:
    """A node started on ``db_path`` publishes no will, even a minute later."""
    node = await Node(db_path, fake_time).start()
    observer = await watch(node, observer_name)
    node.tick(advance=60)
    assert await published(observer) == []


@async_test
async def test_delayed_will_published_after_the_delay_across_a_crash(
    node: Node, db_path: Path, fake_time: FakeTime
):
    w = await node.connect("w", expiry=300, will=will(30, retain=True))
    await w.lose()  # no DISCONNECT: the will waits 30 s
    assert rows(db_path, "SELECT client_id FROM wills WHERE due_at IS NOT NULL") == [("w",)]
    fake_time.advance(5)
    crashed = snapshot(db_path)

    fake_time.reboot(downtime=10)  # 15 s of the 30 s have passed
    node2 = await Node(crashed, fake_time).start()
    observer = await watch(node2)
    node2.tick()
    assert await published(observer) == []
    node2.tick(advance=14.5)
    assert await published(observer) == []
    node2.tick(advance=0.5)
    got = await published(observer)
    assert [(p.topic, p.payload, p.qos) for p in got] == [("will/w", b"w is gone", 1)]
    assert got[0].properties[Prop.CONTENT_TYPE] == "text/plain"
    assert got[0].properties[Prop.USER_PROPERTY] == [("why", "gone")]
    assert Prop.WILL_DELAY_INTERVAL not in got[0].properties
    await node2.committed()
    assert rows(crashed, "SELECT count(*) FROM wills") == [(0,)]
    assert rows(crashed, "SELECT topic, payload FROM retained") == [("will/w", b"w is gone")]
    assert "w" in node2.b.sessions  # the session outlives its will


@async_test
async def test_will_whose_delay_ran_out_while_down_is_published_on_the_first_tick(node: Node):
    node, observer = await restarted_with_a_pending_will(node, expiry=300, delay=30, downtime=60)
    node.tick()
    assert [p.payload for p in await published(observer)] == [b"w is gone"]


@async_test
async def test_pending_will_cancelled_by_a_reconnect_after_restart(
    node: Node, db_path: Path, fake_time: FakeTime
):
    node, observer = await restarted_with_a_pending_will(node, expiry=300, delay=30, downtime=5)
    back = await node.connect("w", clean_start=False, expiry=300)
    assert back.session_present
    node.tick(advance=60)
    assert await published(observer) == []
    await node.committed()
    assert rows(db_path, "SELECT count(*) FROM wills") == [(0,)]
    await back.disconnect()
    await node.close()
    await assert_no_will_after_a_restart(db_path, fake_time)


@async_test
async def test_pending_will_published_when_the_session_ends_first(node: Node, db_path: Path):
    node, observer = await restarted_with_a_pending_will(node, expiry=10, delay=60, downtime=4)
    node.tick()
    assert await published(observer) == []
    node.tick(advance=6)  # the session expires 10 s after the drop, before the will's 60 s
    assert [p.payload for p in await published(observer)] == [b"w is gone"]
    assert "w" not in node.b.sessions
    await node.committed()
    assert rows(db_path, "SELECT count(*) FROM wills") == [(0,)]
    assert rows(db_path, "SELECT count(*) FROM sessions") == [(0,)]


@async_test
async def test_will_of_a_client_connected_at_the_crash_is_published_after_its_delay(
    node: Node, db_path: Path, fake_time: FakeTime
):
    await node.connect("w", expiry=300, will=will(20))
    assert rows(db_path, "SELECT client_id, due_at FROM wills") == [("w", None)]
    crashed = snapshot(db_path)  # killed with the client connected

    node2 = await Node(crashed, fake_time).start()
    observer = await watch(node2)
    node2.tick(advance=19)
    assert await published(observer) == []
    node2.tick(advance=1)
    assert [p.payload for p in await published(observer)] == [b"w is gone"]


@async_test
async def test_will_of_a_311_client_connected_at_the_crash_is_published_at_once(
    node: Node, db_path: Path, fake_time: FakeTime
):
    await node.connect("w", version=MQTT_311, clean_start=False, will=will(None))
    crashed = snapshot(db_path)

    node2 = await Node(crashed, fake_time).start()
    observer = await watch(node2)
    node2.tick()
    assert [p.payload for p in await published(observer)] == [b"w is gone"]


@async_test
async def test_normal_disconnect_removes_the_stored_will(
    node: Node, db_path: Path, fake_time: FakeTime
):
    w = await node.connect("w", expiry=300, will=will(5))
    await w.disconnect()
    assert rows(db_path, "SELECT count(*) FROM wills") == [(0,)]
    await node.close()
    await assert_no_will_after_a_restart(db_path, fake_time)


@async_test
async def test_will_delay_0_is_published_at_once_and_not_stored(
    node: Node, db_path: Path, fake_time: FakeTime
):
    observer = await watch(node)
    w = await node.connect("w", expiry=300, will=will(0))
    await w.lose()
    assert [p.payload for p in await published(observer)] == [b"w is gone"]
    assert rows(db_path, "SELECT count(*) FROM wills") == [(0,)]
    await node.close()
    await assert_no_will_after_a_restart(db_path, fake_time, "observer2")

"""Pending wills across a restart: a will waiting out its Will Delay Interval is published after
the delay (by ``broker.tick()`` with the fake clock), at once if the delay ran out while the broker
was down, or when the session ends first; a reconnect in time cancels it. A will of a client that
was connected when the broker died is armed again on restart."""

from __future__ import annotations

from pathlib import Path

from support.sqlite_harness import Client, FakeTime, Node, Prop, async_test, pk, rows, snapshot

MQTT_311 = 4


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


@async_test
async def test_delayed_will_published_after_the_delay_across_a_crash(
    db_path: Path, fake_time: FakeTime
):
    node = await Node(db_path, fake_time).start()
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
async def test_will_whose_delay_ran_out_while_down_is_published_on_the_first_tick(
    db_path: Path, fake_time: FakeTime
):
    node = await Node(db_path, fake_time).start()
    w = await node.connect("w", expiry=300, will=will(30))
    await w.lose()
    await node.close()

    fake_time.reboot(downtime=60)
    node = await Node(db_path, fake_time).start()
    observer = await watch(node)
    node.tick()
    assert [p.payload for p in await published(observer)] == [b"w is gone"]


@async_test
async def test_pending_will_cancelled_by_a_reconnect_after_restart(
    db_path: Path, fake_time: FakeTime
):
    node = await Node(db_path, fake_time).start()
    w = await node.connect("w", expiry=300, will=will(30))
    await w.lose()
    await node.close()

    fake_time.reboot(downtime=5)
    node = await Node(db_path, fake_time).start()
    observer = await watch(node)
    back = await node.connect("w", clean_start=False, expiry=300)
    assert back.connack is not None and back.connack.session_present
    node.tick(advance=60)
    assert await published(observer) == []
    await node.committed()
    assert rows(db_path, "SELECT count(*) FROM wills") == [(0,)]
    await back.disconnect()
    await node.close()

    node = await Node(db_path, fake_time).start()
    observer = await watch(node)
    node.tick(advance=60)
    assert await published(observer) == []


@async_test
async def test_pending_will_published_when_the_session_ends_first(
    db_path: Path, fake_time: FakeTime
):
    node = await Node(db_path, fake_time).start()
    w = await node.connect("w", expiry=10, will=will(60))
    await w.lose()
    await node.close()

    fake_time.reboot(downtime=4)
    node = await Node(db_path, fake_time).start()
    observer = await watch(node)
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
    db_path: Path, fake_time: FakeTime
):
    node = await Node(db_path, fake_time).start()
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
    db_path: Path, fake_time: FakeTime
):
    node = await Node(db_path, fake_time).start()
    await node.connect("w", version=MQTT_311, clean_start=False, will=will(None))
    crashed = snapshot(db_path)

    node2 = await Node(crashed, fake_time).start()
    observer = await watch(node2)
    node2.tick()
    assert [p.payload for p in await published(observer)] == [b"w is gone"]


@async_test
async def test_normal_disconnect_removes_the_stored_will(db_path: Path, fake_time: FakeTime):
    node = await Node(db_path, fake_time).start()
    w = await node.connect("w", expiry=300, will=will(5))
    await w.disconnect()
    assert rows(db_path, "SELECT count(*) FROM wills") == [(0,)]
    await node.close()

    node = await Node(db_path, fake_time).start()
    observer = await watch(node)
    node.tick(advance=60)
    assert await published(observer) == []


@async_test
async def test_will_delay_0_is_published_at_once_and_not_stored(db_path: Path, fake_time: FakeTime):
    node = await Node(db_path, fake_time).start()
    observer = await watch(node)
    w = await node.connect("w", expiry=300, will=will(0))
    await w.lose()
    assert [p.payload for p in await published(observer)] == [b"w is gone"]
    assert rows(db_path, "SELECT count(*) FROM wills") == [(0,)]
    await node.close()

    node = await Node(db_path, fake_time).start()
    observer = await watch(node, "observer2")
    node.tick(advance=60)
    assert await published(observer) == []

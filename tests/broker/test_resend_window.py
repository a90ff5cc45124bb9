"""Resending on a resumed session: original order, each packet once, never past the client's
Receive Maximum, even when some messages no longer fit its Maximum Packet Size; and
acknowledgements held for the store even when the same read closes the connection."""

from __future__ import annotations

from typing import Any

from support.harness import Client, GatedStore, Harness, Prop, pk, split_packets


def resume(h: Harness, props: dict[int, int] | None = None) -> Client:
    client = h.client(peer="s")
    properties: dict[int, Any] = {Prop.SESSION_EXPIRY_INTERVAL: 100, **(props or {})}
    client.send(pk.Connect(client_id="s", clean_start=False, properties=properties))
    return client


def three_in_flight(h: Harness, first: bytes = b"m1") -> Client:
    sub = resume(h)
    sub.receive()
    sub.subscribe("t", 1)
    pub = h.connect("p")
    for payload in (first, b"m2", b"m3"):
        pub.publish("t", payload, 1)
    sub.receive()
    sub.lose()
    return pub


def summary(packets: list[Any]) -> list[tuple[str, Any, Any]]:
    return [
        (type(p).__name__, getattr(p, "packet_id", None), getattr(p, "dup", None)) for p in packets
    ]


def test_a_message_too_large_now_does_not_let_the_queue_jump_ahead(h: Harness) -> None:
    """[MQTT-4.4.0-1] In-flight messages are resent in their order before queued ones, also
    when one of them is dropped for the client's new Maximum Packet Size."""
    sub = resume(h, {Prop.RECEIVE_MAXIMUM: 2})
    sub.receive()
    sub.subscribe("t", 1)
    pub = h.connect("p")
    for payload in (b"A" * 500, b"m2", b"m3"):
        pub.publish("t", payload, 1)
    sub.receive()  # 1 and 2 in flight, m3 queued
    sub.lose()
    again = resume(h, {Prop.MAXIMUM_PACKET_SIZE: 200})
    got = again.receive()
    assert [getattr(p, "payload", None) for p in got[1:]] == [b"m2", b"m3"]
    assert got[1].dup and got[1].packet_id == 2


def test_each_held_message_is_resent_once(h: Harness) -> None:
    three_in_flight(h, b"A" * 500)
    narrow = resume(h, {Prop.RECEIVE_MAXIMUM: 1})
    assert summary(narrow.receive()) == [("Connack", None, None), ("Publish", 1, True)]
    narrow.lose()
    small = resume(h, {Prop.MAXIMUM_PACKET_SIZE: 200})
    assert summary(small.receive()) == [
        ("Connack", None, None),
        ("Publish", 2, True),
        ("Publish", 3, True),
    ]


def test_acknowledging_a_held_message_does_not_open_the_window(h: Harness) -> None:
    """[MQTT-3.3.4-9] A PUBACK for a message whose resend was still held frees no slot of the
    new connection's window: nothing more is sent while message 1 is unacknowledged."""
    three_in_flight(h)
    narrow = resume(h, {Prop.RECEIVE_MAXIMUM: 1})
    assert summary(narrow.receive()) == [("Connack", None, None), ("Publish", 1, True)]
    narrow.puback(2)  # the client had it from the old connection
    assert narrow.receive() == []
    narrow.puback(1)
    assert summary(narrow.receive()) == [("Publish", 3, True)]


def test_ack_waits_for_the_commit_when_the_same_read_disconnects() -> None:
    """A PUBLISH that changed the store, then DISCONNECT (or an error) in the same read: the
    PUBACK still waits for the commit; then it goes out and the connection closes."""
    for tail in (pk.Disconnect(0), pk.Connect(client_id="again")):
        h = Harness()
        store = GatedStore()
        h.broker.store = store
        h.broker.router.store = store
        h.broker.router.retained._store = store
        client = h.connect("p")
        client.send(pk.Publish("r", b"x", 1, True, False, 1, {}), tail)
        h.broker.flush()
        assert split_packets(client.link.data[client._read :], 5) == []
        store.commit()
        h.broker.flush()
        got = split_packets(client.link.data[client._read :], 5)
        assert isinstance(got[0], pk.Puback) and got[0].packet_id == 1
        assert client.link.closed

"""broker/connection.py: one connection's input loop (framing across reads, the input budget per
pass, reading paused and resumed), packet and CONNECT size limits, keep alive, the output buffer
(coalesced writes, its bound), acknowledgements held until the store commits, and the answer to
malformed packets, protocol errors and internal errors."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import pytest
from support.codec import encoded_connect
from support.harness import (
    MQTT_5,
    AllowAll,
    FakeClock,
    FakeLink,
    GatedStore,
    Harness,
    Offload,
    Prop,
    ToyAuthenticator,
    pair,
    pk,
    split_packets,
    split_raw,
)
from support.traced import bytes_per

from mqttbroker import compiled
from mqttbroker.broker.core import Broker
from mqttbroker.broker.framing import Framing
from mqttbroker.broker.message import Message
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.broker.output import Output
from mqttbroker.broker.session import Delivery
from mqttbroker.protocol import fastpath, grammar
from mqttbroker.server.tcp import peer_name

MQTT_3_1_1 = 4


def disconnected_with(client, code: int) -> None:  # type: ignore[no-untyped-def]
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, code)], received
    assert client.closed


PINGREQ = b"\xc0\x00"


# What one idle connection (clean session, no subscription) may keep in the sans-I/O broker:
# its Connection (with its Framing and Output) and Session with what they hold, its entries in
# the broker's tables. An empty deque alone takes 760 bytes, a set 216, a dict 64, a list 56:
# what most connections and sessions never use is created on first use (about 750 bytes in all
# compiled, 790 pure, where every field is a full pointer; 800 and 845 while the broker kept its
# connections in a set and each connection four fields of what its CONNECT asked, 880 and 920
# while each connection kept its peer's name as a string of its own, and its session its drop
# log's fields).
IDLE_CONNECTION_BYTES = 765 if compiled.mode == "compiled" else 810


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Any:
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    return lambda: [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\x36\x05\x00\x01t\x00\x01", id="PUBLISH-QoS3"),  # MQTT-3.3.1-4
        pytest.param(b"\x60\x02\x00\x01", id="PUBREL-flags-0000"),  # MQTT-3.6.1-1
        pytest.param(b"\x42\x02\x00\x01", id="PUBACK-flags-0010"),  # MQTT-2.1.3-1
        pytest.param(b"\x71\x02\x00\x01", id="PUBCOMP-flags-0001"),  # MQTT-2.1.3-1
        pytest.param(b"\x52\x02\x00\x01", id="PUBREC-flags-0010"),  # MQTT-2.1.3-1
        pytest.param(b"\x80\x06\x00\x01\x00\x00\x01t", id="SUBSCRIBE-flags-0000"),  # MQTT-3.8.1-1
        pytest.param(b"\xa0\x05\x00\x01\x00\x00\x01", id="UNSUBSCRIBE-flags-0000"),  # 3.10.1-1
        pytest.param(b"\xe1\x00", id="DISCONNECT-flags"),  # MQTT-3.14.1-1
        pytest.param(b"\xc1\x00", id="PINGREQ-flags"),  # MQTT-2.1.3-1
        pytest.param(b"\x30\x80\x80\x80\x80\x01", id="remaining-length-5-bytes"),
        pytest.param(b"\x30\x80\x00", id="remaining-length-not-minimal"),  # MQTT-1.5.5-1
        pytest.param(b"\x30\x04\x00\x05ab", id="topic-runs-past-end"),
        pytest.param(b"\x30\x05\x00\x02\xc3\x28\x00", id="topic-invalid-utf8"),  # 1.5.4-1
        pytest.param(b"\x30\x07\x00\x01t\x03\x63\x00\x01", id="unknown-property"),
    ],
)
def test_malformed_packet_disconnect(h: Harness, raw: bytes) -> None:
    """[MQTT-4.13.1-1] [MQTT-3.3.1-4] [MQTT-3.6.1-1] [MQTT-3.8.1-1] [MQTT-3.10.1-1]
    [MQTT-3.14.1-1] [MQTT-2.1.3-1] [MQTT-1.5.5-1] [MQTT-1.5.4-1] A Malformed Packet gets
    DISCONNECT 0x81 and the connection is closed."""
    client = h.connect("c1")
    client.send_raw(raw)
    disconnected_with(client, 0x81)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\x82\x03\x00\x01\x00", id="SUBSCRIBE-no-filter"),  # MQTT-3.8.3-2
        pytest.param(b"\xa2\x03\x00\x01\x00", id="UNSUBSCRIBE-no-filter"),  # MQTT-3.10.3-2
        pytest.param(b"\x32\x06\x00\x01t\x00\x00\x00", id="PUBLISH-packet-id-0"),
        pytest.param(b"\x20\x03\x00\x00\x00", id="CONNACK-from-client"),
        pytest.param(b"\xf0\x00", id="AUTH-without-method"),  # MQTT-4.12.0-7
    ],
)
def test_protocol_error_disconnect(h: Harness, raw: bytes) -> None:
    """[MQTT-3.8.3-2] [MQTT-3.10.3-2] [MQTT-2.2.1-3] [MQTT-4.12.0-7] [MQTT-4.13.1-1] A Protocol Error gets
    DISCONNECT 0x82 and the connection is closed."""
    client = h.connect("c1")
    client.send_raw(raw)
    disconnected_with(client, 0x82)


def test_malformed_packet_v311_closes_silently(h: Harness) -> None:
    """[MQTT-4.13.1-1] A 3.1.1 client is closed without a DISCONNECT (3.1.1 has none)."""
    client = h.connect("c1", version=MQTT_3_1_1)
    client.send_raw(b"\x36\x05\x00\x01t\x00\x01")
    assert client.receive() == []
    assert client.closed


def test_malformed_packet_does_not_affect_others(h: Harness) -> None:
    """A malformed packet closes only its own connection; the others go on publishing and
    receiving, including in the same flush."""
    subscriber = h.connect("sub")
    subscriber.subscribe("t", 1)
    bad = h.connect("bad")
    bad.subscribe("t", 1)
    good = h.connect("good")
    good.publish("t", b"before", 1)
    assert [p.payload for p in bad.publishes()] == [b"before"]
    bad.send_raw(b"\x36\x05\x00\x01t\x00\x01" + grammar.encode(pk.Publish("t", b"after bad"), 5))
    good.publish("t", b"after", 1)
    disconnected_with(bad, 0x81)
    assert [type(p) for p in good.receive()] == [pk.Puback, pk.Puback]
    received = subscriber.publishes()
    assert [p.payload for p in received] == [b"before", b"after"]
    for p in received:
        subscriber.puback(p.packet_id)
    assert not subscriber.closed and not good.closed
    assert "bad" not in h.broker.sessions
    good.publish("t", b"later", 0)
    assert [p.payload for p in subscriber.publishes()] == [b"later"]


def test_packet_too_large_rejected_from_header(h: Harness) -> None:
    """[MQTT-3.2.2-15] A fixed header announcing 256 MB is refused with DISCONNECT 0x95 at once,
    before any of the body arrives."""
    client = h.connect("c1")
    client.send_raw(b"\x30" + fastpath.encode_vbi(268_435_455))
    disconnected_with(client, 0x95)


def test_connect_too_large_rejected_from_header(h: Harness) -> None:
    """[MQTT-3.2.2-15] The same for a CONNECT: CONNACK 0x95 (v5 form) and close."""
    client = h.client()
    client.send_raw(b"\x10" + fastpath.encode_vbi(268_435_455))
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Connack, 0x95)]
    assert client.closed


def test_packet_size_limit_boundary(make_harness: Callable[..., Harness]) -> None:
    """[MQTT-3.2.2-15] Maximum Packet Size counts the whole packet: exactly the limit is
    accepted, one byte more is refused with 0x95."""
    h = make_harness(max_packet_size=100)
    subscriber = h.connect("sub")
    subscriber.subscribe("t")
    client = h.connect("c1")
    overhead = len(grammar.encode(pk.Publish("t", b""), 5))
    exact = grammar.encode(pk.Publish("t", b"x" * (100 - overhead)), 5)
    assert len(exact) == 100
    client.send_raw(exact)
    assert [len(p.payload) for p in subscriber.publishes()] == [100 - overhead]
    client.send_raw(grammar.encode(pk.Publish("t", b"x" * (101 - overhead)), 5))
    disconnected_with(client, 0x95)
    assert subscriber.receive() == []


def test_server_disconnect_respects_client_maximum_packet_size(h: Harness) -> None:
    """[MQTT-3.14.2-3] [MQTT-3.1.2-24] The server leaves the Reason String out of its DISCONNECT
    when it would exceed the client's Maximum Packet Size."""
    client = h.connect("c1", properties={Prop.MAXIMUM_PACKET_SIZE: 20})
    client.publish("a/#", b"x")
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x90)]
    assert Prop.REASON_STRING not in received[0].properties
    assert all(len(w) <= 20 for w in client.link.writes)
    # Without the limit the same DISCONNECT carries a Reason String (so the test means something).
    roomy = h.connect("c2")
    roomy.publish("a/#", b"x")
    (disconnect,) = roomy.receive()
    assert Prop.REASON_STRING in disconnect.properties


def test_connect_split_across_reads(h: Harness) -> None:
    """A CONNECT arriving one byte at a time is assembled and answered once complete."""
    client = h.client()
    data = encoded_connect("c1")
    for index in range(len(data) - 1):
        client.send_raw(data[index : index + 1])
        assert client.receive() == []
    client.send_raw(data[-1:])
    received = client.receive()
    assert len(received) == 1 and received[0].reason_code == 0


def test_every_pingreq_gets_a_pingresp(h: Harness) -> None:
    """[MQTT-3.12.4-1] Every PINGREQ gets a PINGRESP."""
    client = h.connect("c1")
    client.pingreq()
    client.pingreq()
    assert [type(p) for p in client.receive()] == [pk.Pingresp, pk.Pingresp]


def test_keep_alive_timeout(h: Harness) -> None:
    """[MQTT-3.1.2-22] [MQTT-3.2.2-22] No packet for more than 1.5 x Keep Alive: DISCONNECT 0x8D
    and the connection is closed (on the next tick)."""
    client = h.connect("c1", keep_alive=10)
    h.tick(15.0)
    assert not client.closed
    assert client.receive() == []
    h.clock.advance(0.5)
    assert not client.closed  # nothing happens between ticks
    h.tick()
    received = client.receive()
    assert len(received) == 1 and isinstance(received[0], pk.Disconnect), received
    assert received[0].reason_code == 0x8D
    assert client.closed


def test_keep_alive_reset_by_any_packet(h: Harness) -> None:
    """[MQTT-3.1.2-22] The 1.5 x Keep Alive period counts from the last packet received."""
    client = h.connect("c1", keep_alive=10)
    h.tick(14.0)
    client.pingreq()
    assert [type(p) for p in client.receive()] == [pk.Pingresp]
    h.tick(14.0)
    client.publish("x", b"1")
    h.tick(15.0)
    assert not client.closed
    h.tick(0.5)
    assert client.closed


def test_keep_alive_zero_never_times_out(h: Harness) -> None:
    """Keep Alive 0 switches the mechanism off."""
    client = h.connect("c1", keep_alive=0)
    h.tick(1e7)
    assert not client.closed


def test_keep_alive_timeout_v311(h: Harness) -> None:
    """[MQTT-3.1.2-22] A 3.1.1 client is closed too, without DISCONNECT."""
    client = h.connect("c1", version=MQTT_3_1_1, keep_alive=4)
    h.tick(6.5)
    assert client.closed
    assert client.receive() == []


def test_keep_alive_not_reset_by_partial_packet(h: Harness) -> None:
    """[MQTT-3.1.2-22] Keep alive counts Control Packets: bytes that never complete a packet do
    not keep the connection alive (else a client trickling one byte at a time is never closed)."""
    client = h.connect("c1", keep_alive=10)
    data = grammar.encode(pk.Publish("t", b"x" * 50), MQTT_5)
    h.tick(5)
    client.send_raw(data[:3])
    h.tick(5)
    client.send_raw(data[3:4])
    h.tick(4)
    client.send_raw(data[4:5])
    h.tick(1.5)  # 15.5 s since the CONNECT, the last complete packet
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, 0x8D)]
    assert client.closed


def test_input_past_the_budget_is_parsed_on_later_passes(make_harness: Any) -> None:
    h: Harness = make_harness(input_budget=3)
    client = h.connect("c")
    client.send_raw(PINGREQ * 7)
    answers: list[Any] = []
    for _ in range(5):  # one flush per receive(): three packets per pass
        answers += client.receive()
    assert [type(p) for p in answers] == [pk.Pingresp] * 7
    assert not client.closed and not client.link.reading_paused
    client.send_raw(PINGREQ)  # nothing was left behind to spoil what comes next
    assert client.one(pk.Pingresp)


def test_a_packet_split_at_the_budget_is_joined(make_harness: Any) -> None:
    h: Harness = make_harness(input_budget=2)
    sub = h.connect("sub")
    sub.subscribe("t")
    pub = h.connect("pub")
    raw = PINGREQ * 2 + b"\x30\x07\x00\x01t\x00abc"  # the PUBLISH waits for the next pass
    pub.send_raw(raw[:-2])
    pub.send_raw(raw[-2:])
    for _ in range(3):
        pub.receive()
    assert [p.payload for p in sub.publishes()] == [b"abc"]
    assert not pub.closed


def test_deferred_input_wakes_the_loop_without_output(make_harness: Any) -> None:
    """Input left over when nothing is to be written: the broker asks the edge for another
    pass (``wake``), or the rest would wait for some unrelated event."""
    h: Harness = make_harness(input_budget=2)
    client = h.connect("c")
    h.broker.scheduler.flush()
    wakes: list[int] = []
    h.broker.scheduler.wake = lambda: wakes.append(1)
    raw = b"\x30\x04\x00\x01t\x00" * 5  # QoS 0, nobody subscribed
    client.send_raw(raw)
    assert wakes == [1]
    assert client.link.reading_paused and not client.closed


def test_reading_resumes_after_an_off_loop_password_check(make_harness: Any) -> None:
    """While the check runs, reading pauses; once the CONNECT is accepted it resumes, also
    when nothing else was sent meanwhile."""
    h: Harness = make_harness()
    h.broker.authenticator = ToyAuthenticator()
    offload = h.broker.offload = Offload()
    client = h.client()
    client.send(pk.Connect(client_id="c", username="alice", password=b"secret"))
    assert client.link.reading_paused
    offload.run_all()
    assert client.one(pk.Connack).reason_code == 0
    assert not client.link.reading_paused
    client.send_raw(PINGREQ)
    assert client.one(pk.Pingresp)


def test_deliveries_coalesced_into_one_write(h: Harness) -> None:
    """Several deliveries before flush() reach the link in a single write call."""
    subscriber, publisher = pair(h, sub_qos=1)
    other = h.connect("pub2")
    writes_before = len(subscriber.link.writes)
    publisher.send(
        *(pk.Publish("t", b"%d" % i, i % 2, packet_id=i + 1 if i % 2 else None) for i in range(5))
    )
    other.publish("t", b"other", 0)
    assert len(subscriber.link.writes) == writes_before  # nothing written before the flush
    h.broker.scheduler.flush()
    assert len(subscriber.link.writes) == writes_before + 1
    assert len(split_raw(subscriber.link.writes[-1])) == 6
    assert [p.payload for p in subscriber.publishes()] == [b"0", b"1", b"2", b"3", b"4", b"other"]


def test_acks_coalesced_into_one_write(h: Harness) -> None:
    """All the PUBACKs for one chunk of PUBLISHes go out in one write."""
    publisher = h.connect("pub")
    before = len(publisher.link.writes)
    publisher.send(*(pk.Publish("t", b"m", 1, packet_id=i) for i in range(1, 8)))
    h.broker.scheduler.flush()
    assert len(publisher.link.writes) == before + 1
    assert [p.packet_id for p in publisher.receive()] == list(range(1, 8))


def test_partial_packets_across_reads(h: Harness) -> None:
    """Packets split anywhere across data_received calls are reassembled."""
    subscriber, publisher = pair(h, sub_qos=1)
    from mqttbroker.protocol import grammar

    stream = b"".join(
        grammar.encode(pk.Publish("t", b"p%d" % i * 20, 1, packet_id=i + 1), 5) for i in range(5)
    )
    for start in range(0, len(stream), 7):
        publisher.send_raw(stream[start : start + 7])
    assert [p.packet_id for p in publisher.receive()] == [1, 2, 3, 4, 5]
    assert [p.payload for p in subscriber.publishes()] == [b"p%d" % i * 20 for i in range(5)]


def test_paused_transport_queues_then_drains(h: Harness) -> None:
    """Backpressure: while the transport is paused QoS 1/2 messages wait in the queue (QoS 0 is
    dropped), and flow in order when it resumes."""
    subscriber, publisher = pair(h, sub_qos=1)
    subscriber.conn.pause_writing()
    publisher.publish("t", b"a", 1)
    publisher.publish("t", b"dropped", 0)
    publisher.publish("t", b"b", 1)
    assert subscriber.receive() == []
    subscriber.conn.resume_writing()
    assert [p.payload for p in subscriber.publishes()] == [b"a", b"b"]


def test_user_property_limit_comes_from_the_options(make_harness: Any) -> None:
    h: Harness = make_harness(max_user_properties=2)
    client = h.connect("c")
    props = {Prop.USER_PROPERTY: [("a", "1"), ("b", "2"), ("c", "3")]}
    client.publish("t", b"x", 1, properties=props)
    disconnect = client.one(pk.Disconnect)
    assert disconnect.reason_code == 0x83
    assert disconnect.properties[Prop.REASON_STRING] == "more than 2 User Properties"


def test_internal_error_is_contained(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    """A bug of ours while handling one client's packet: that client gets DISCONNECT 0x83 and
    the traceback is logged; the others go on."""
    caplog.set_level(logging.ERROR, logger="mqttbroker.connection")

    class Broken(AllowAll):
        def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
            if topic == "boom":
                raise RuntimeError("a bug")
            return True

    h.broker.authorizer = Broken()
    other = h.connect("other")
    other.subscribe("t")
    client = h.connect("c")
    client.publish("boom", b"x", 1)
    disconnect = client.one(pk.Disconnect)
    assert (disconnect.reason_code, disconnect.properties[Prop.REASON_STRING]) == (
        0x83,
        "internal error",
    )
    assert [r.getMessage() for r in caplog.records] == [
        "client c: internal error while handling its packet"
    ]
    h.connect("pub").publish("t", b"fine")
    assert [p.payload for p in other.publishes()] == [b"fine"]


def test_acks_released_one_commit_at_a_time(make_harness: Any) -> None:
    """Two stored PUBLISHes read apart wait for two commits: the first commit releases the
    first PUBACK and keeps the second, which the next commit releases."""
    h: Harness = make_harness()
    store = GatedStore()
    h.broker = Broker(h.options, clock=h.clock, store=store)
    client = h.connect("c")
    client.publish("r/1", b"x", 1, retain=True)
    client.publish("r/2", b"x", 1, retain=True)
    h.broker.scheduler.flush()
    assert split_packets(client.link.data[client._read :], 5) == []
    store.commit_one()
    h.broker.scheduler.flush()
    assert [p.packet_id for p in split_packets(client.link.data[client._read :], 5)] == [1]
    store.commit_one()
    h.broker.scheduler.flush()
    assert [p.packet_id for p in split_packets(client.link.data[client._read :], 5)] == [1, 2]


def test_packet_over_the_maximum_says_its_size(make_harness: Any) -> None:
    h: Harness = make_harness(max_packet_size=64)
    client = h.connect("c")
    client.publish("t", b"x" * 100)
    disconnect = client.one(pk.Disconnect)
    assert disconnect.reason_code == 0x95
    assert disconnect.properties[Prop.REASON_STRING] == (
        "packet of 106 bytes exceeds the maximum of 64"
    )


def test_keep_alive_timeout_is_logged(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.broker")
    client = h.connect("c", keep_alive=10)
    h.tick(15.1)
    assert client.one(pk.Disconnect).reason_code == 0x8D
    assert "client c: keep alive of 10s ran out; closing" in [
        r.getMessage() for r in caplog.records
    ]


def test_deferral_with_output_pending_wakes_once(make_harness: Any) -> None:
    h: Harness = make_harness(input_budget=2)
    client = h.connect("c")
    h.broker.scheduler.flush()
    wakes: list[int] = []
    h.broker.scheduler.wake = lambda: wakes.append(1)
    client.send_raw(b"\xc0\x00" * 5)  # PINGRESPs to write, and input left for later
    assert wakes == [1]


def test_output_past_max_output_buffer_closes_with_0x97(make_harness: Any, caplog: Any) -> None:
    """A client whose unread output passes max_output_buffer is told 0x97 and dropped, logged
    once; before that, while the transport is over its high-water mark, it is not read."""
    h: Harness = make_harness(max_output_buffer=1000)
    client = h.connect("slow")
    client.conn.pause_writing()  # the transport is over its high-water mark
    assert client.link.reading_paused
    client.link.unread = 999
    client.pingreq()
    assert not client.closed and client.receive() == [pk.Pingresp()]
    client.link.unread = 1001
    client.pingreq()
    received = client.receive()
    assert received[-1] == pk.Disconnect(0x97, received[-1].properties)
    assert client.link.aborted  # what it did not take is dropped
    assert caplog.text.count("max_output_buffer") == 1
    h.connect("other").subscribe("t")  # nobody else harmed


def test_reading_resumes_when_the_output_drains(make_harness: Any) -> None:
    h: Harness = make_harness()
    client = h.connect("c")
    client.conn.pause_writing()
    assert client.link.reading_paused
    client.conn.resume_writing()
    assert not client.link.reading_paused
    client.pingreq()
    assert client.receive() == [pk.Pingresp()]
    # Also with part of a packet waiting for the rest.
    client.send_raw(b"\x30\x05\x00\x01")  # a QoS 0 PUBLISH to "t", cut short
    client.conn.pause_writing()
    client.conn.resume_writing()
    assert not client.link.reading_paused
    client.send_raw(b"t\x00x\xc0\x00")  # its rest, then a PINGREQ
    assert client.receive() == [pk.Pingresp()]


def test_an_idle_connection_keeps_little_memory() -> None:
    broker = Broker(BrokerOptions(max_connections_per_address=0), clock=FakeClock())
    count = 500
    link = FakeLink(keep=False)
    connects = [
        grammar.encode(pk.Connect(client_id=f"idle-{i:04d}", protocol_level=MQTT_5), MQTT_5)
        for i in range(count)
    ]
    for data in connects[:20]:  # the broker's own tables get going first
        broker.connect(link, "127.0.0.1:1").data_received(data)
    # Each peer's name made as the transport makes it (tcp.peer_name), counted with its
    # connection: a connection that kept it would keep its own string.
    per_connection = bytes_per(
        list(enumerate(connects[20:], 40000)),
        lambda port_data: broker.connect(
            link, peer_name(("127.0.0.1", port_data[0]))
        ).data_received(port_data[1]),
        broker.scheduler.flush,
    )
    assert len(broker.connections) == count
    assert per_connection < IDLE_CONNECTION_BYTES, per_connection


def test_what_a_connection_holds_that_holds_no_cycle_is_outside_the_collector() -> None:
    """Framing and Output (one each per connection), a Delivery and a Message refer to nothing
    that could refer back to them: compiled, the cycle collector does not track them (16 bytes
    each, and nothing for it to walk). Pure Python tracks every instance; there they have slots,
    not a dict each."""
    message = Message("t", b"x")
    objects = [Framing(), Output(), message, Delivery(message, 1, False, ())]
    if compiled.mode == "compiled":
        assert [gc.is_tracked(o) for o in objects] == [False] * len(objects)
    else:
        assert not any(hasattr(o, "__dict__") for o in objects)


def test_an_idle_connection_keeps_no_output_list(make_harness: Callable[..., Harness]) -> None:
    """The list of packets waiting to be written exists while some do: once its CONNACK is
    written, an idle connection has none; the next packet starts one, and its write ends it."""
    h = make_harness()
    client = h.connect("idle")
    assert client.conn.output.chunks is None
    client.send(pk.Pingreq())
    assert client.conn.output.chunks is not None  # waits for the flush at the end of the pass
    h.broker.scheduler.flush()
    assert client.conn.output.chunks is None
    assert isinstance(client.receive()[-1], pk.Pingresp)


def test_server_keep_alive_enforced(make_harness: Any) -> None:
    """With max_keepalive 10 a client asking for 0 (or 60) is told Server Keep Alive 10 and is
    held to it (MQTT-3.1.2-22 at the server's value): still connected a little before 1.5 x 10
    s of silence, gone after."""
    h: Harness = make_harness(max_keepalive=10)
    for asked in (0, 60):
        c = h.connect(f"c{asked}", keep_alive=asked)
        assert c.connack is not None
        assert c.connack.properties[Prop.SERVER_KEEP_ALIVE] == 10
        start = h.clock.now
        h.tick(14.5)
        assert not c.link.closed
        h.tick(1.0)
        assert c.link.closed
        packets = c.receive()
        assert isinstance(packets[-1], pk.Disconnect) and packets[-1].reason_code == 0x8D
        h.clock.now = start


def test_violation_after_connack_is_logged(h: Harness, lines: Any) -> None:
    client = h.connect("c")
    client.send_raw(b"\x32\x04\x00\x01t\x00")  # QoS 1 PUBLISH without a packet identifier
    assert client.one(pk.Disconnect).reason_code >= 0x80
    assert "client c: truncated PUBLISH; closing (reason 0x81)" in lines()


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
        h.broker.scheduler.flush()
        assert split_packets(client.link.data[client._read :], 5) == []
        store.commit()
        h.broker.scheduler.flush()
        got = split_packets(client.link.data[client._read :], 5)
        assert isinstance(got[0], pk.Puback) and got[0].packet_id == 1
        assert client.link.closed


def test_packet_size_measured_from_its_own_start(make_harness: Any) -> None:
    """A packet just within max_packet_size that follows another one in the same read is
    accepted: its size is its own, wherever it starts."""
    h: Harness = make_harness(max_packet_size=64, max_connect_size=32)  # checked past 32
    sub = h.connect("sub")
    sub.subscribe("t")
    pub = h.connect("pub")
    publish = b"\x30\x3e\x00\x01t\x00" + b"x" * 58  # 64 bytes in all
    pub.send_raw(b"\xc0\x00" * 20 + publish)
    assert not pub.closed
    assert [len(p.payload) for p in sub.publishes()] == [58]


def test_input_budget_is_per_pass_not_per_read(make_harness: Any) -> None:
    h: Harness = make_harness(input_budget=2)
    client = h.connect("c")
    h.broker.scheduler.flush()
    client.send_raw(b"\xc0\x00" * 2)
    assert not client.link.reading_paused
    client.send_raw(b"\xc0\x00")  # a second read in the same pass: over the budget
    assert client.link.reading_paused
    answers: list[Any] = []
    for _ in range(3):
        answers += client.receive()
    assert [type(p) for p in answers] == [pk.Pingresp] * 3


@pytest.mark.parametrize(
    "peer",
    ["127.0.0.1:40001", "::1:40001", "/run/mqtt.sock", "/run/a:b.sock", "?", "host:"],
)
def test_a_connection_names_its_peer_as_it_was_given(peer: str) -> None:
    """A connection keeps its peer as an address shared with the others from it and a port,
    and names it as the transport did: an IPv6 address, a Unix socket's path (with or
    without a colon in it), a peer without a port."""
    broker = Broker(BrokerOptions(max_connections_per_address=0), clock=FakeClock())
    conn = broker.connect(FakeLink(keep=False), peer)
    assert conn.peer == peer
    if peer.rpartition(":")[2].isdigit():
        again = broker.connect(FakeLink(keep=False), peer.rpartition(":")[0] + ":1")
        assert again.host is conn.host  # (one string for both)

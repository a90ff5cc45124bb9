"""Violations and limits: topic aliases, wildcards in a Topic Name, malformed packets, the
server's Maximum Packet Size, DISCONNECT rules, and the isolation of one bad connection."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.harness import Harness, Prop, pk

from mqttbroker.protocol import fastpath, grammar

MQTT_3_1_1 = 4


def disconnected_with(client, code: int) -> None:  # type: ignore[no-untyped-def]
    received = client.receive()
    assert [(type(p), p.reason_code) for p in received] == [(pk.Disconnect, code)], received
    assert client.closed


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


def test_disconnect_closes(h: Harness) -> None:
    """[MQTT-3.14.4-2] A DISCONNECT from the client closes the connection, with no answer."""
    client = h.connect("c1")
    client.disconnect()
    assert client.receive() == []
    assert client.closed
    assert "c1" not in h.broker.sessions


def test_disconnect_session_expiry_after_zero_is_protocol_error(h: Harness) -> None:
    """A DISCONNECT setting a non-zero Session Expiry Interval when CONNECT had 0 is a Protocol
    Error (3.14.2.2.2): DISCONNECT 0x82, and the session does not survive."""
    client = h.connect("c1")
    client.disconnect(0, {Prop.SESSION_EXPIRY_INTERVAL: 60})
    disconnected_with(client, 0x82)
    assert "c1" not in h.broker.sessions


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

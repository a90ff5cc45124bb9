"""Bad input over raw sockets: exact bytes in, exact bytes (or a closed connection) back.

Every test then checks that the broker still serves other clients normally and has logged no
traceback (``assert_broker_healthy``).
"""

from __future__ import annotations

import pytest
from support.clients import (
    MQTT_5,
    MQTT_311,
    PINGREQ,
    PahoClient,
    RawClient,
    assert_broker_healthy,
    connect_packet,
    packet,
    parse_connack,
    parse_disconnect_v5,
    publish_packet,
    subscribe_packet,
    unique,
    utf8,
)

# A guard, not a speed requirement: every case below is answered as soon as its bytes are read.
CLOSE_TIMEOUT = 5.0


@pytest.fixture(autouse=True)
def healthy_afterwards(broker):
    mark = broker.log_mark()
    yield
    assert_broker_healthy(broker, MQTT_5, since=mark)
    assert_broker_healthy(broker, MQTT_311, since=mark)


def exchange(broker, data: bytes, connect_version: int | None = None) -> bytes:
    """Open a connection (CONNECT first if ``connect_version``), send ``data``, and return all
    the broker sends until it closes the connection (failing if it stays open)."""
    with RawClient(broker.host, broker.port) as raw:
        if connect_version is not None:
            raw.connect(unique("raw"), connect_version)
        raw.send(data)
        return raw.read_until_closed(CLOSE_TIMEOUT)


def assert_disconnect(data: bytes, code: int) -> None:
    """``data`` is exactly one MQTT 5 DISCONNECT with reason ``code`` (then the close)."""
    assert data, f"expected DISCONNECT 0x{code:02X} before the close, got nothing"
    got, props = parse_disconnect_v5(data)
    assert got == code, f"expected DISCONNECT 0x{code:02X}, got {data.hex(' ')}"


def assert_refused_connack(data: bytes, code: int) -> None:
    """``data`` is exactly one MQTT 5 CONNACK refusing with ``code`` (then the close)."""
    assert data, f"expected CONNACK 0x{code:02X} before the close, got nothing"
    present, got, props = parse_connack(data, MQTT_5)
    assert got == code, f"expected CONNACK 0x{code:02X}, got {data.hex(' ')}"
    assert present is False, "[MQTT-3.2.2-6] a refusing CONNACK has Session Present 0"
    assert {name for name, _ in props} <= {"ReasonString", "UserProperty", "ServerReference"}


# ---------------------------------------------------------------------------------------------
# CONNECT


@pytest.mark.parametrize("shape", [MQTT_5, MQTT_311], ids=["v5-shaped", "v311-shaped"])
def test_unsupported_protocol_level_gets_connack_0x84(broker, shape):
    """[MQTT-3.1.2-2] A CONNECT with protocol level 6 is answered with CONNACK 0x84 (Unsupported
    Protocol Version), then the connection is closed."""
    data = exchange(broker, connect_packet("level6", shape, level=6))
    assert_refused_connack(data, 0x84)


@pytest.mark.parametrize("level", [2, 3])
def test_old_protocol_level_gets_311_connack_0x01(broker, level):
    """[MQTT-3.1.2-2] CONNECT "MQTT" at a level older than 3.1.1 is refused with the 3.1.1 answer
    (CONNACK return code 0x01, unacceptable protocol version: exactly 20 02 00 01), then closed."""
    data = exchange(broker, connect_packet("old", MQTT_311, level=level))
    assert data == b"\x20\x02\x00\x01", data.hex(" ")


def test_unknown_protocol_name_is_refused(broker):
    """[MQTT-3.1.2-1] A protocol name other than "MQTT" is refused (CONNACK 0x84), then closed."""
    data = exchange(broker, connect_packet("name", MQTT_5, name="MQTX"))
    assert_refused_connack(data, 0x84)


def test_311_connect_with_reserved_flag_is_closed_without_connack(broker):
    """[MQTT-3.1.2-3] A 3.1.1 CONNECT whose reserved Connect Flags bit is 1 is malformed: the
    connection is closed and no CONNACK is sent."""
    data = exchange(broker, connect_packet("reserved", MQTT_311, flags=0x03))
    assert data == b"", f"expected the close alone, got {data.hex(' ')}"


def test_v5_connect_with_reserved_flag_is_refused(broker):
    """[MQTT-3.1.2-3] [MQTT-3.2.2-7] An MQTT 5 CONNECT whose reserved flag is 1 is malformed: at
    most a CONNACK 0x81 (Malformed Packet), then the connection is closed."""
    data = exchange(broker, connect_packet("reserved", MQTT_5, flags=0x03))
    if data:
        assert_refused_connack(data, 0x81)


def test_nothing_after_a_refused_connect_is_processed(broker):
    """[MQTT-3.1.4-6] A PUBLISH sent right behind a refused CONNECT (in the same segment) is
    ignored: the subscriber never gets it."""
    topic = f"e2e/refused/{unique()}"
    sub = PahoClient(broker.host, broker.port, MQTT_5)
    try:
        sub.connect()
        assert sub.subscribe(topic, 1) == [1]
        data = exchange(
            broker,
            connect_packet("refused", MQTT_5, level=6) + publish_packet(topic, b"smuggled"),
        )
        assert_refused_connack(data, 0x84)
        pub = PahoClient(broker.host, broker.port, MQTT_5)
        try:
            pub.connect()
            pub.publish(topic, b"end", 1)
        finally:
            pub.close()
        got = sub.wait_payload(b"end")
        assert [m.payload for m in got] == [b"end"]
    finally:
        sub.close()


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(PINGREQ, id="PINGREQ"),
        pytest.param(publish_packet("a/b", b"x", version=MQTT_311), id="PUBLISH-v311"),
        pytest.param(subscribe_packet(1, [("a/b", 0)], MQTT_5), id="SUBSCRIBE-v5"),
        pytest.param(b"\x00\x00", id="reserved-type-0"),
        pytest.param(b"\xf0\xff\xff\xff\xff\x01", id="AUTH-byte-then-bad-length"),
        pytest.param(b"\x30\x80\x00", id="PUBLISH-byte-then-non-minimal-length"),
    ],
)
def test_first_packet_not_connect_is_closed(broker, first):
    """[MQTT-3.1.0-1] [MQTT-4.13.1-1] [MQTT-3.14.0-1] A connection whose first packet is not
    CONNECT is closed, without an answer: there was no CONNECT to acknowledge (a CONNACK only
    answers an error in a CONNECT packet, 4.13.1) and no DISCONNECT may precede a CONNACK."""
    data = exchange(broker, first)
    assert data == b"", f"expected the close alone, got {data.hex(' ')}"


def test_second_connect_gets_disconnect_0x82(broker):
    """[MQTT-3.1.0-2] A second CONNECT on a connection is a Protocol Error: DISCONNECT 0x82, then
    the close."""
    data = exchange(broker, connect_packet("again", MQTT_5), connect_version=MQTT_5)
    assert_disconnect(data, 0x82)


def test_311_second_connect_is_closed(broker):
    """[MQTT-3.1.0-2] In 3.1.1 a second CONNECT closes the connection (3.1.1 has no DISCONNECT
    from the server)."""
    data = exchange(broker, connect_packet("again", MQTT_311), connect_version=MQTT_311)
    assert data == b"", data.hex(" ")


# ---------------------------------------------------------------------------------------------
# Malformed packets after CONNECT


MALFORMED_V5 = [
    pytest.param(b"\x36\x05\x00\x01a\x00\x00", id="PUBLISH-QoS-3"),  # [MQTT-3.3.1-4]
    pytest.param(packet(0x80, b"\x00\x01\x00\x00\x01a\x00"), id="SUBSCRIBE-flags-0000"),  # 3.8.1-1
    pytest.param(packet(0x30, b"\x00\x02a\xff\x00x"), id="PUBLISH-topic-not-UTF-8"),  # 1.5.4-1
    pytest.param(packet(0x30, b"\x00\x03a\x00b\x00x"), id="PUBLISH-topic-with-U+0000"),  # 1.5.4-2
    pytest.param(packet(0x30, b"\x00\x09a\x00"), id="PUBLISH-topic-past-the-end"),
    pytest.param(b"\x30\x80\x00", id="Remaining-Length-not-minimal"),  # [MQTT-1.5.5-1]
    pytest.param(b"\x30\xff\xff\xff\xff\x01", id="Remaining-Length-5-bytes"),
    pytest.param(
        packet(0x30, b"\x00\x01a\x05\x01\x02\x02\x00x"), id="PUBLISH-property-past-length"
    ),
    pytest.param(packet(0x30, b"\x00\x01a\x02\x7f\x00"), id="PUBLISH-unknown-property"),
    pytest.param(b"\xc0\x01\x00", id="PINGREQ-with-body"),
]


@pytest.mark.parametrize("data", MALFORMED_V5)
def test_malformed_packet_after_connect_gets_disconnect_0x81(broker, data):
    """[MQTT-4.13.1-1] [MQTT-2.1.3-1] [MQTT-3.3.1-4] [MQTT-3.8.1-1] [MQTT-1.5.4-1] [MQTT-1.5.4-2]
    [MQTT-1.5.5-1] A Malformed Packet from a connected MQTT 5 client is answered with DISCONNECT
    0x81 (Malformed Packet), then the connection is closed."""
    assert_disconnect(exchange(broker, data, connect_version=MQTT_5), 0x81)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x00\x00", id="reserved-packet-type-0"),
        pytest.param(packet(0x30, b"\x00\x01a\x02\x01\x02"), id="Payload-Format-Indicator-2"),
        pytest.param(b"\x20\x03\x00\x00\x00", id="CONNACK-from-client"),
        pytest.param(b"\x90\x04\x00\x01\x00\x00", id="SUBACK-from-client"),
    ],
)
def test_invalid_packet_after_connect_gets_disconnect_0x81_or_0x82(broker, data):
    """[MQTT-4.13.1-1] [MQTT-3.14.2-1] A packet a client may not send, or a property value the
    spec does not define, is answered with DISCONNECT 0x81 (Malformed Packet) or 0x82 (Protocol
    Error), then the connection is closed."""
    data = exchange(broker, data, connect_version=MQTT_5)
    assert data, "expected a DISCONNECT before the close"
    code, _ = parse_disconnect_v5(data)
    assert code in (0x81, 0x82), data.hex(" ")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x36\x05\x00\x01a\x00\x00", id="PUBLISH-QoS-3"),
        pytest.param(packet(0x80, b"\x00\x01\x00\x01a\x00"), id="SUBSCRIBE-flags-0000"),
        pytest.param(b"\x30\xff\xff\xff\xff\x01", id="Remaining-Length-5-bytes"),
    ],
)
def test_311_malformed_packet_closes_the_connection(broker, data):
    """[MQTT-4.13.1-1] A malformed packet from a 3.1.1 client closes the connection, no answer."""
    data = exchange(broker, data, connect_version=MQTT_311)
    assert data == b"", data.hex(" ")


# ---------------------------------------------------------------------------------------------
# Topic names


@pytest.mark.parametrize("topic", ["a/#", "#", "a/+/b", "+"])
def test_publish_to_wildcard_topic_gets_disconnect_0x90(broker, topic):
    """[MQTT-3.3.2-2] [MQTT-4.7.0-1] A PUBLISH whose Topic Name contains a wildcard gets
    DISCONNECT 0x90 (Topic Name invalid), then the close."""
    data = exchange(broker, publish_packet(topic, b"x", qos=1), connect_version=MQTT_5)
    assert_disconnect(data, 0x90)


def test_311_publish_to_wildcard_topic_is_closed(broker):
    """[MQTT-3.3.2-2] In 3.1.1, a PUBLISH to a wildcard topic closes the connection."""
    data = exchange(broker, publish_packet("a/#", b"x", version=MQTT_311), MQTT_311)
    assert data == b"", data.hex(" ")


def test_publish_with_empty_topic_and_no_alias_gets_disconnect_0x82(broker):
    """[MQTT-4.7.3-1] A zero-length Topic Name without a Topic Alias is a Protocol Error (0x82)."""
    data = exchange(broker, publish_packet("", b"x"), connect_version=MQTT_5)
    assert_disconnect(data, 0x82)


# ---------------------------------------------------------------------------------------------
# Size


def test_announced_256mb_packet_is_refused_without_waiting_for_it(broker):
    """[MQTT-3.2.2-15] A fixed header announcing a 256 MB PUBLISH (beyond the
    Maximum Packet Size the broker announced in CONNACK) gets DISCONNECT 0x95 (Packet too large)
    at once: only the 5 header bytes are sent, the body never is."""
    with RawClient(broker.host, broker.port) as raw:
        _, _, props = raw.connect(unique("huge"), MQTT_5)
        maximum = dict(props).get("MaximumPacketSize")
        assert maximum is not None and maximum < 268_435_460, props
        raw.send(b"\x30\xff\xff\xff\x7f")  # PUBLISH, Remaining Length 268,435,455
        data = raw.read_until_closed(CLOSE_TIMEOUT)
    assert_disconnect(data, 0x95)


def test_311_announced_256mb_packet_is_closed_at_once(broker):
    """[MQTT-4.13.1-1] The same 256 MB announcement from a 3.1.1 client closes the connection
    without the broker waiting for the body."""
    data = exchange(broker, b"\x30\xff\xff\xff\x7f", connect_version=MQTT_311)
    assert data == b"", data.hex(" ")


def test_announced_256mb_connect_is_closed_at_once(broker):
    """[MQTT-3.1.4-1] A CONNECT announcing 256 MB is refused at once (at most CONNACK 0x95)."""
    data = exchange(broker, b"\x10\xff\xff\xff\x7f")
    if data:
        assert_refused_connack(data, 0x95)


# ---------------------------------------------------------------------------------------------
# Garbage


HTTP_REQUEST = (
    b"GET /mqtt HTTP/1.1\r\nHost: localhost:1883\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64)"
    b"\r\nAccept: text/html,application/xhtml+xml\r\nConnection: keep-alive\r\n\r\n"
)
TLS_CLIENT_HELLO = bytes.fromhex(
    "16030100c4010000c00303" + "ab" * 32 + "00" + "0004c02fc030" + "0100" + "0093" + "00" * 147
)


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(HTTP_REQUEST, id="HTTP-request"),
        pytest.param(TLS_CLIENT_HELLO, id="TLS-ClientHello"),
        pytest.param(b"\xff" * 64, id="ff-bytes"),
        pytest.param(bytes(range(256)), id="0-to-255"),
        pytest.param(b"\x10\x02\x00\x04MQTT" * 4, id="truncated-CONNECTs"),
    ],
)
def test_garbage_is_closed(broker, garbage):
    """[MQTT-3.1.0-1] [MQTT-4.13.1-1] [MQTT-3.14.0-1] Bytes that are not MQTT get the connection
    closed; nothing but (at most) a refusing CONNACK comes back, never a DISCONNECT."""
    data = exchange(broker, garbage)
    if data:
        present, code, _ = parse_connack(data, MQTT_5)
        assert code >= 0x80 and not present, data.hex(" ")


def test_garbage_after_connect_gets_disconnect(broker):
    """[MQTT-4.13.1-1] Garbage after a good CONNECT: DISCONNECT with a Malformed Packet or
    Protocol Error reason (0x81/0x82), then the close."""
    data = exchange(broker, HTTP_REQUEST, connect_version=MQTT_5)
    assert data, "expected a DISCONNECT"
    code, _ = parse_disconnect_v5(data)
    assert code in (0x81, 0x82), data.hex(" ")


def test_non_utf8_utf8_string_in_connect_is_refused(broker):
    """[MQTT-1.5.4-1] A Client Identifier that is not UTF-8 makes the CONNECT malformed: closed,
    at most after CONNACK 0x81 (or 0x85, Client Identifier not valid)."""
    body = utf8("MQTT") + b"\x05\x02\x00\x3c\x00" + b"\x00\x02\xc3\x28"
    data = exchange(broker, packet(0x10, body))
    if data:
        present, code, _ = parse_connack(data, MQTT_5)
        assert code in (0x81, 0x85), data.hex(" ")

"""The hand-written fast path (fastpath.py) agrees with the construct grammar (grammar.py) on the
hot packets, in both directions:

* for valid PUBLISH, PUBACK/PUBREC/PUBREL/PUBCOMP, DISCONNECT and AUTH at both levels, the two
  encoders give the same bytes (DISCONNECT and AUTH have one encoder, the grammar's), and each
  decoder reads the other's bytes back to the same packet;
* for arbitrary and mutated bytes, the two decoders either both succeed with equal packets or both
  raise an MQTTError. Where they raise different error classes (e.g. MalformedPacket from one,
  ProtocolError from the other, because they check rules in a different order) the test still
  passes, but records a hypothesis event "error class differs: ..." (see
  ``pytest --hypothesis-show-statistics``) so that the disagreement is visible, not hidden.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import event, example, given, note, settings
from hypothesis import strategies as st
from protocol_strategies import ACK_CLASSES, acks, auths, disconnects, hot_packet, publishes
from support.codec import decode_hot, encode_hot

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.errors import MQTTError
from mqttbroker.protocol.packets import MQTT_3_1_1, MQTT_5, PacketType

V4, V5 = MQTT_3_1_1, MQTT_5
versions = st.sampled_from([V4, V5])
HOT_TYPES = [3, 4, 5, 6, 7, 12, 13, 14, 15]


def body_of(data: bytes) -> tuple[int, int, int]:
    """(packet type, flags, body start) of one whole packet."""
    header = fastpath.read_fixed_header(data, 0, len(data))
    assert header is not None
    length, start = header
    assert start + length == len(data)
    return data[0] >> 4, data[0] & 15, start


def as_311(packet: pk.Packet) -> pk.Packet:
    """What a packet becomes through MQTT 3.1.1, which has no properties or ack reason codes."""
    if isinstance(packet, pk.Publish):
        return dataclasses.replace(packet, properties={})
    if isinstance(packet, pk.Ack):
        return type(packet)(packet.packet_id)
    return packet


def check_agree(packet: pk.Packet, version: int) -> None:
    fast = encode_hot(packet, version)
    slow = grammar.encode(packet, version)
    assert fast == slow
    ptype, flags, start = body_of(slow)
    expected = packet if version == V5 else as_311(packet)
    # fast path reads grammar's bytes, grammar reads the fast path's bytes
    assert decode_hot(ptype, flags, slow, start, len(slow), version) == expected
    assert grammar.decode(ptype, flags, fast[start:], version) == expected
    # and the body inside a larger buffer
    padded = b"\x01\x02" + fast + b"\xff\xff"
    assert decode_hot(ptype, flags, padded, start + 2, len(fast) + 2, version) == expected


@settings(max_examples=200, deadline=None)
@given(st.data(), versions)
def test_publish_agrees(data: st.DataObject, version: int) -> None:
    """Valid PUBLISH, QoS 0-2, unicode topics, any payload, any PUBLISH properties (several
    Subscription Identifiers and User Properties included)."""
    check_agree(data.draw(publishes(version)), version)


@settings(max_examples=150, deadline=None)
@given(st.data(), versions, st.sampled_from(ACK_CLASSES))
def test_acks_agree(data: st.DataObject, version: int, cls: type[pk.Ack]) -> None:
    """PUBACK/PUBREC (PUBACK_CODES), PUBREL/PUBCOMP (PUBREL_CODES), with or without a reason
    string and user properties."""
    check_agree(data.draw(acks(version, cls)), version)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_v5_packets_encoded_for_311_agree(data: st.DataObject) -> None:
    """MQTT 5 content encoded at 3.1.1: both encoders drop properties and reason codes alike."""
    check_agree(data.draw(st.one_of(publishes(V5), acks(V5))), V4)


def test_pings_agree() -> None:
    for version in (V4, V5):
        for packet in (pk.Pingreq(), pk.Pingresp()):
            check_agree(packet, version)


@settings(max_examples=100, deadline=None)
@given(st.data(), versions)
def test_disconnect_and_auth_agree(data: st.DataObject, version: int) -> None:
    """DISCONNECT (empty in 3.1.1; in MQTT 5 any reason code, with or without properties) and
    AUTH (MQTT 5 only)."""
    options = [disconnects(version)] + ([auths()] if version == V5 else [])
    check_agree(data.draw(st.one_of(options)), version)


# ---------------------------------------------------------------------------------------------
# Arbitrary bytes: both decoders accept with equal results, or both reject


def run(decode: Any) -> tuple[str, Any]:
    try:
        return "ok", decode()
    except MQTTError as exc:
        return "error", exc


def compare_decoders(ptype: int, flags: int, body: bytes, version: int) -> None:
    note(f"type={ptype} flags={flags:04b} version={version} body={body!r}")
    padded = b"\x00\x80" + body + b"\xff\x7f"
    slow = run(lambda: grammar.decode(ptype, flags, body, version))
    fast = run(lambda: decode_hot(ptype, flags, padded, 2, 2 + len(body), version))
    if slow[0] == "ok" or fast[0] == "ok":
        assert slow == fast, f"grammar {slow!r} vs fastpath {fast!r}"
        event(f"both decode {PacketType(ptype).name}")
        return
    slow_cls, fast_cls = type(slow[1]).__name__, type(fast[1]).__name__
    if slow_cls != fast_cls:
        event(f"error class differs: grammar {slow_cls}, fastpath {fast_cls}")
    else:
        event(f"both raise {slow_cls}")


@st.composite
def random_bodies(draw: st.DrawFn) -> tuple[int, int, bytes, int]:
    """A hot packet type, usually with flags it may carry, and any bytes as its body."""
    ptype = draw(st.sampled_from(HOT_TYPES))
    if ptype == PacketType.PUBLISH:
        flags = draw(st.integers(0, 15))
    elif draw(st.integers(0, 9)):
        flags = 2 if ptype == PacketType.PUBREL else 0
    else:
        flags = draw(st.integers(0, 15))
    return ptype, flags, draw(st.binary(max_size=40)), draw(versions)


@settings(max_examples=400, deadline=None)
@given(random_bodies())
def test_random_bodies(case: tuple[int, int, bytes, int]) -> None:
    compare_decoders(*case)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[int, int, bytes, int]:
    """A valid hot packet's body with a few random edits (and sometimes other flags)."""
    version = draw(versions)
    packet = draw(hot_packet(version))
    data = grammar.encode(packet, version)
    ptype, flags, start = body_of(data)
    body = bytearray(data[start:])
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "insert", "delete", "truncate", "append", "flags"]))
        if kind == "flags":
            flags = draw(st.integers(0, 15))
        elif kind == "append":
            body += draw(st.binary(min_size=1, max_size=4))
        elif kind == "insert":
            body.insert(draw(st.integers(0, len(body))), draw(st.integers(0, 255)))
        elif body and kind == "set":
            body[draw(st.integers(0, len(body) - 1))] = draw(st.integers(0, 255))
        elif body and kind == "delete":
            del body[draw(st.integers(0, len(body) - 1))]
        elif body:
            del body[draw(st.integers(0, len(body) - 1)) :]
    return ptype, flags, bytes(body), version


# Found with a long run (30,000 examples) of the strategy above: a v5 ack whose property block
# holds a property not allowed in it, followed by stray bytes. grammar reports MalformedPacket
# (the trailing bytes, seen while parsing); fastpath reports ProtocolError (decode_ack runs the
# property checks of collect() before its trailing-bytes check). Both are MQTTErrors, so this
# test passes on them; kept as explicit examples so the case is always exercised.
@example((7, 0, b"\x00\x01\x00\x03\x21\x00\x01" + b"\xff", 5))
@example((4, 0, b"\x00\x01\x00\x03\x23\x00\x05" + b"\xff", 5))
@settings(max_examples=300, deadline=None)
@given(mutated())
def test_mutated_bodies(case: tuple[int, int, bytes, int]) -> None:
    compare_decoders(*case)


# ---------------------------------------------------------------------------------------------
# scan_publish: the connection's PUBLISH slicer, against the full decoder


def check_scan(first: int, data: bytes, body: int, stop: int, version: int) -> None:
    """scan_publish slices what decode_publish decodes, or defers to it (properties), or
    raises where it raises; it leaves only the topic's UTF-8 check to the router."""
    note(f"first=0x{first:02X} version={version} body={data[body:stop]!r}")
    full = run(lambda: fastpath.decode_publish(first & 15, data, body, stop, version))
    scan = run(lambda: fastpath.scan_publish(first, data, body, stop, version))
    if scan[0] == "error":
        assert full[0] == "error", f"scan raised {scan[1]!r}, decode gave {full[1]!r}"
        return
    topic_end, start, packet_id = scan[1]
    if full[0] == "error":
        if start == -1:  # deferred to the full decoder (it has properties), which refuses it
            assert version == V5, full
            return
        # else only a topic that is not well-formed gets past the scan
        assert "string" in full[1].message, full
        topic = data[body + 2 : topic_end]
        assert b"\x00" in topic or topic != topic.decode("utf-8", "ignore").encode(), full
        return
    packet = full[1]
    if start == -1:
        assert version == V5 and packet.properties
        return
    assert not packet.properties
    assert data[body + 2 : topic_end].decode() == packet.topic
    assert data[start:stop] == packet.payload
    assert packet_id == (packet.packet_id or 0)


@settings(max_examples=200, deadline=None)
@given(st.data(), versions)
def test_scan_publish_agrees_on_valid_packets(data: st.DataObject, version: int) -> None:
    raw = grammar.encode(data.draw(publishes(version)), version)
    _, _, start = body_of(raw)
    padded = b"\x01" + raw + b"\xff"
    check_scan(raw[0], padded, start + 1, len(raw) + 1, version)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 15), st.binary(max_size=40), versions)
@example(0x30, b"\x00\x01a\x00", V5)
@example(0x32, b"\x00\x01a\x00\x00\x00", V5)
@example(0x3E, b"\x00\x01a\x00\x01", V4)
@example(0x30, b"\x00\x02\xff\xfe", V4)
@example(0x30, b"\x00\x01\x00", V4)
@example(0x30, b"\x00\x00\x01", V5)  # properties that run past the end: deferred, refused
def test_scan_publish_agrees_on_any_bytes(flags: int, body: bytes, version: int) -> None:
    padded = b"\x00" + body + b"\x00"
    check_scan(0x30 | flags, padded, 1, 1 + len(body), version)


def test_connect_version() -> None:
    connect = grammar.encode(pk.Connect(client_id="v", protocol_level=V4), V4)
    _, _, start = body_of(connect)
    assert fastpath.connect_version(connect[start:]) == V4
    assert fastpath.connect_version(b"\x00\x04MQTT\x09rest") == V5
    assert fastpath.connect_version(b"\x00\x06MQIsdp\x03") == pk.MQTT_3_1
    assert fastpath.connect_version(b"\x00\x04MQTT\x00") == 0
    assert fastpath.connect_version(b"\x00\x04MQTT") == -1
    assert fastpath.connect_version(b"GET / HTTP/1.1") == -1

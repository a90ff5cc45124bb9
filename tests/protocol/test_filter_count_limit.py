"""SUBSCRIBE and UNSUBSCRIBE with more topic filters than the broker allows per packet are
refused whole (0x97) from a walk over the filters' lengths, before decoding them; exactly the
limit passes. Filters of 256 bytes and more check that the walk reads both length bytes."""

from __future__ import annotations

import pytest

from mqttbroker.protocol import fastpath
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.errors import LimitExceeded
from mqttbroker.protocol.packets import MQTT_5, PacketType
from mqttbroker.protocol.reasons import ReasonCode

MQTT_3_1_1 = 4
UNSUBSCRIBE = (PacketType.UNSUBSCRIBE << 4) | 2


def field(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def unsubscribe_body(filters: list[str], version: int) -> bytes:
    return b"\x00\x07" + (b"\x00" if version == MQTT_5 else b"") + b"".join(map(field, filters))


def decode(filters: list[str], version: int, limit: int) -> pk.Packet:
    body = b"\xff" + unsubscribe_body(filters, version) + b"\x00"
    return fastpath.decode_packet(UNSUBSCRIBE, body, 1, len(body) - 1, version, limit)


LONG = "long/" + "x" * 295  # 300 bytes: 0x012C


@pytest.mark.parametrize("version", [MQTT_5, MQTT_3_1_1])
@pytest.mark.parametrize(
    "filters",
    [["a", "b", "c"], [LONG, "b", "c"], ["a", LONG, "c"], [LONG, LONG, LONG]],
    ids=["short", "long-first", "long-middle", "all-long"],
)
def test_unsubscribe_filter_limit(version: int, filters: list[str]) -> None:
    packet = decode(filters, version, 3)
    assert isinstance(packet, pk.Unsubscribe) and packet.topic_filters == filters
    with pytest.raises(LimitExceeded) as refused:
        decode(filters, version, 2)
    assert refused.value.reason_code == ReasonCode.QUOTA_EXCEEDED
    assert isinstance(decode(filters, version, 0), pk.Unsubscribe)  # 0: no limit


def test_unsubscribe_properties_are_skipped_before_counting() -> None:
    """MQTT 5: the property block (here a User Property) is not taken for filters."""
    props = b"\x26" + field("k") + field("v")
    body = b"\xff\x00\x07" + bytes([len(props)]) + props + field("a") + b"\x00"
    packet = fastpath.decode_packet(UNSUBSCRIBE, body, 1, len(body) - 1, MQTT_5, 1)
    assert isinstance(packet, pk.Unsubscribe) and packet.topic_filters == ["a"]


def test_unsubscribe_properties_skipped_then_filters_counted() -> None:
    """Past the property block, every filter counts: three with a limit of two is refused."""
    props = b"\x26" + field("k") + field("v")
    body = b"\xff\x00\x07" + bytes([len(props)]) + props
    body += field("a") + field("b") + field("c") + b"\x00"
    with pytest.raises(LimitExceeded):
        fastpath.decode_packet(UNSUBSCRIBE, body, 1, len(body) - 1, MQTT_5, 2)

"""The User Property limit (max_user_properties, 64 by default): more in one packet is refused
(LimitExceeded: 0x83 Implementation specific error), by every decoder, with a message naming the
limit; a repeated property that may not repeat is a Protocol Error however many there are."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.clients import vbi

from mqttbroker.protocol import fastpath, grammar
from mqttbroker.protocol.errors import LimitExceeded, ProtocolError
from mqttbroker.protocol.packets import MQTT_5, PacketType
from mqttbroker.protocol.properties import SPEC, limit_user_properties

PUBLISH_QOS1 = (PacketType.PUBLISH << 4) | 2


@pytest.fixture(autouse=True)
def limit() -> Iterator[None]:
    limit_user_properties(4)
    yield
    limit_user_properties(64)


def field(text: str) -> bytes:
    return len(text).to_bytes(2, "big") + text.encode()


def publish_body(props: bytes) -> bytes:
    return field("t") + b"\x00\x01" + vbi(len(props)) + props + b"payload"


def users(count: int) -> bytes:
    return b"".join(b"\x26" + field("k") + field("v") for _ in range(count))


def decoders(body: bytes) -> list[object]:
    """Decode ``body`` (a QoS 1 PUBLISH) with the fast path and with the grammar."""
    results: list[object] = []
    for decode in (
        lambda: fastpath.decode_packet(PUBLISH_QOS1, body, 0, len(body), MQTT_5),
        lambda: grammar.decode(PacketType.PUBLISH, 2, body, MQTT_5),
    ):
        try:
            results.append(decode())
        except (LimitExceeded, ProtocolError) as exc:
            results.append(exc)
    return results


def test_at_the_limit_decodes() -> None:
    for result in decoders(publish_body(users(4))):
        assert not isinstance(result, Exception), result


@pytest.mark.parametrize("count", [5, 4 + len(SPEC) + 1])  # past the limit; past the cap too
def test_past_the_limit_is_refused(count: int) -> None:
    for result in decoders(publish_body(users(count))):
        assert isinstance(result, LimitExceeded), result
        assert result.message == "more than 4 User Properties"


def test_repeated_property_past_the_cap_is_a_protocol_error() -> None:
    props = b"\x01\x00" * (4 + len(SPEC) + 1)  # Payload Format Indicator, over and over
    for result in decoders(publish_body(props)):
        assert isinstance(result, ProtocolError), result


def test_exactly_the_cap_decodes() -> None:
    """The cap counts every property: as many as it allows (the User Properties of the limit and
    the rest repeated Subscription Identifiers, which may repeat in a PUBLISH) still decode."""
    from mqttbroker.protocol.properties import properties_cap

    props = users(4) + b"\x0b\x01" * (properties_cap() - 4)
    for result in decoders(publish_body(props)):
        assert not isinstance(result, Exception), result


def test_reading_stops_past_the_cap() -> None:
    """Past the cap the decoders stop reading (a flood of properties costs nothing more): what
    follows, here a repeated Payload Format Indicator, is not looked at."""
    from mqttbroker.protocol.properties import properties_cap

    props = users(4) + b"\x0b\x01" * (properties_cap() - 3) + b"\x01\x00\x01\x00"
    for result in decoders(publish_body(props)):
        assert isinstance(result, LimitExceeded), result
        assert result.message == "more than 4 User Properties"


def test_no_limit() -> None:
    """max_user_properties 0: no limit, and no cap on reading."""
    limit_user_properties(0)
    for result in decoders(publish_body(users(200))):
        assert not isinstance(result, Exception), result

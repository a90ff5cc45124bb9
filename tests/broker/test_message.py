"""broker/message.py: a message encoded once per shape: each protocol version and RETAIN flag, a
QoS 0 PUBLISH forwarded as received."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.harness import MQTT_3_1_1, Harness, Prop, pk

from mqttbroker.protocol import grammar


def test_v311_subscriber_gets_v311_publish(h: Harness) -> None:
    """A 3.1.1 subscriber gets PUBLISHes in the 3.1.1 format (no properties) from a v5
    publisher, and a v5 subscriber gets them from a 3.1.1 publisher."""
    old = h.connect("old", version=MQTT_3_1_1)
    old.subscribe("t", 1)
    new = h.connect("new")
    new.subscribe("t", 1)
    new.publish("t", b"from v5", 1, properties={Prop.USER_PROPERTY: [("a", "b")]})
    new.receive()
    (message,) = old.publishes()
    assert (message.payload, message.qos) == (b"from v5", 1)
    old.puback(message.packet_id)
    old.publish("t", b"from 3.1.1", 1)
    assert [p.payload for p in new.publishes()] == [b"from 3.1.1"]


# Remaining Length is the payload plus 6 bytes in MQTT 5 ("t/a", property length), plus 5 in
# 3.1.1: these sizes put it on both sides of 128, 16,384 and 2,097,152 in both versions.
@pytest.mark.parametrize(
    "size", [0, 121, 122, 123, 16_377, 16_378, 16_379, 2_097_145, 2_097_146, 2_097_147]
)
@pytest.mark.parametrize("version", [5, MQTT_3_1_1])
def test_qos0_packet_forwarded_unchanged(
    make_harness: Callable[..., Harness], size: int, version: int
) -> None:
    """A QoS 0 PUBLISH without properties reaches subscribers of the publisher's version as the
    bytes received (the broker forwards them), across the 1-, 2-, 3- and 4-byte Remaining Length
    boundaries; subscribers of the other version get it re-encoded. RETAIN is kept only where
    Retain As Published asks for it [MQTT-3.3.1-12] [MQTT-3.3.1-13]."""
    h = make_harness(max_packet_size=4_194_304)
    same = h.connect("same", version=version)
    same.subscribe("t/#", 0, retain_as_published=version == 5)
    differ = h.connect("differ", version=5 if version == MQTT_3_1_1 else MQTT_3_1_1)
    differ.subscribe("t/#", 0)
    publisher = h.connect("pub", version=version)
    payload = bytes(range(256)) * (size // 256) + b"p" * (size % 256)
    for retain in (False, True):
        publisher.send(pk.Publish("t/a", payload, 0, retain, False, None, {}))
        kept = retain and version == 5
        expected = grammar.encode(pk.Publish("t/a", payload, 0, kept, False, None, {}), version)
        h.broker.scheduler.flush()
        assert same.link.data[same._read :] == expected
        assert same.publishes()[0].retain is kept
        got = differ.publishes()
        assert len(got) == 1 and got[0].payload == payload and got[0].retain is False


def test_one_message_encoded_for_each_version_and_retain_flag(h: Harness) -> None:
    """A QoS 0 message's encodings are cached per shape: the MQTT 5 live copy (retain 0) and
    the MQTT 3.1 retained copy (retain 1) of one message are different bytes, each right for
    its client."""
    live = h.connect("live")
    live.subscribe("t", 0)
    h.connect("pub").publish("t", b"m", 0, retain=True)
    (copy5,) = live.publishes()
    assert (copy5.payload, copy5.retain) == (b"m", False)
    old = h.client(version=3)
    old.send(pk.Connect(client_id="old", protocol_name="MQIsdp", protocol_level=3))
    assert old.one(pk.Connack).reason_code == 0
    received = old.subscribe("t", 0)
    (copy31,) = received[1:]
    assert (copy31.topic, copy31.payload, copy31.retain) == ("t", b"m", True)

"""Payload Format Indicator 1 with a payload that is not UTF-8, answered per QoS and for a
will; acknowledgements for packet ids the broker does not know; the will published after its
delay with its Message Expiry Interval; the QoS state a persistent session keeps."""

from __future__ import annotations

import logging

import pytest
from support.harness import Harness, Prop, pk

NOT_UTF8 = b"\xff\xfe"


PFI = {Prop.PAYLOAD_FORMAT_INDICATOR: 1}


PERSISTENT = {Prop.SESSION_EXPIRY_INTERVAL: 100}


def test_qos0_publish_not_utf8_disconnects(h: Harness) -> None:
    """[MQTT-3.3.2-4] A QoS 0 PUBLISH cannot be answered: DISCONNECT 0x99 saying why."""
    client = h.connect("c")
    client.publish("t", NOT_UTF8, 0, properties=PFI)
    disconnect = client.one(pk.Disconnect)
    assert disconnect.reason_code == 0x99
    assert disconnect.properties[Prop.REASON_STRING] == (
        "payload is not UTF-8 although its Payload Format Indicator says so"
    )


@pytest.mark.parametrize("qos", [1, 2])
def test_qos1_2_publish_not_utf8_refused_in_the_ack(h: Harness, qos: int) -> None:
    """The PUBACK/PUBREC says 0x99 with a Reason String; the connection stays, nothing is
    forwarded."""
    watcher = h.connect("w")
    watcher.subscribe("t", 2)
    client = h.connect("c")
    client.publish("t", NOT_UTF8, qos, properties=PFI)
    ack = client.one(pk.Puback if qos == 1 else pk.Pubrec)
    assert ack.reason_code == 0x99
    assert ack.properties[Prop.REASON_STRING] == (
        "payload is not UTF-8 as its Payload Format Indicator says"
    )
    assert not client.closed and watcher.receive() == []


def test_will_not_utf8_refused_at_connect(h: Harness) -> None:
    client = h.client()
    will = pk.Will("will/t", NOT_UTF8, properties=dict(PFI))
    client.send(pk.Connect(client_id="c", will=will))
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0x99
    assert connack.properties[Prop.REASON_STRING] == (
        "payload is not UTF-8 although its Payload Format Indicator says so"
    )


def test_delayed_will_carries_its_expiry(h: Harness) -> None:
    """[MQTT-3.1.3-9] [MQTT-3.3.2-6] A will published after its delay carries its Message Expiry
    Interval, counted from its publication."""
    watcher = h.connect("w")
    watcher.subscribe("will/#", 1)
    will = pk.Will(
        "will/c",
        b"gone",
        1,
        properties={Prop.WILL_DELAY_INTERVAL: 5, Prop.MESSAGE_EXPIRY_INTERVAL: 60},
    )
    h.connect("c", will=will, properties=PERSISTENT).lose()
    h.tick(5)
    (message,) = watcher.publishes()
    assert message.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 60


def test_session_expiry_is_logged(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.broker")
    h.connect("s", properties={Prop.SESSION_EXPIRY_INTERVAL: 5}).lose()
    h.tick(5)
    assert "session s expired" in [r.getMessage() for r in caplog.records]


def test_persistent_inbound_qos2_is_released_once(h: Harness) -> None:
    """[MQTT-4.3.3-10] A persistent session's unreleased inbound QoS 2 id outlives the
    connection: the PUBLISH resent after a reconnect is not delivered twice."""
    watcher = h.connect("w")
    watcher.subscribe("t", 2)
    client = h.connect("c", properties=PERSISTENT)
    client.publish("t", b"once", 2, packet_id=3)
    assert client.one(pk.Pubrec).reason_code == 0
    assert [p.payload for p in watcher.publishes()] == [b"once"]
    client.lose()
    client = h.connect("c", clean_start=False, properties=PERSISTENT, expect_present=True)
    client.publish("t", b"once", 2, packet_id=3, dup=True)
    assert client.one(pk.Pubrec).reason_code == 0
    assert watcher.receive() == []
    client.pubrel(3)
    assert client.one(pk.Pubcomp).reason_code == 0

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

"""More limits as clients and operators see them: a packet over max_packet_size says its size,
a keep alive running out is logged with its length, an AUTH with an unexpected reason code says
which, and a deferral with output pending does not wake the loop twice."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.harness import METHOD, Harness, Prop, ToyAuthenticator, pk


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


def test_unexpected_auth_reason_code_says_which(h: Harness) -> None:
    h.broker.authenticator = ToyAuthenticator()
    client = h.client()
    client.send(pk.Connect(client_id="toy", properties={Prop.AUTHENTICATION_METHOD: METHOD}))
    client.one(pk.Auth)
    client.send(pk.Auth(0x19, {Prop.AUTHENTICATION_METHOD: METHOD}))  # re-auth before CONNACK
    connack = client.one(pk.Connack)
    assert connack.reason_code == 0x82
    assert connack.properties[Prop.REASON_STRING] == "unexpected AUTH reason code 0x19"


def test_deferral_with_output_pending_wakes_once(make_harness: Any) -> None:
    h: Harness = make_harness(input_budget=2)
    client = h.connect("c")
    h.broker.flush()
    wakes: list[int] = []
    h.broker.wake = lambda: wakes.append(1)
    client.send_raw(b"\xc0\x00" * 5)  # PINGRESPs to write, and input left for later
    assert wakes == [1]

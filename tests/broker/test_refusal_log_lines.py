"""The log lines of refusals and protocol violations: who (client id, address, user), what,
and the reason code, so an operator can tell why a client was turned away."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.harness import METHOD, Harness, Prop, ToyAuthenticator, pk


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Any:
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    return lambda: [r.getMessage() for r in caplog.records]


def test_refused_connect_is_logged(make_harness: Any, lines: Any) -> None:
    h: Harness = make_harness(client_id_pattern="dev-*")
    client = h.client(peer="10.0.0.9:1234")
    client.send(pk.Connect(client_id="bad", username="alice"))
    assert client.one(pk.Connack).reason_code == 0x85
    assert (
        "client bad from 10.0.0.9:1234 (user 'alice'): client id does not match "
        "client_id_pattern for user 'alice'; refused (reason 0x85)"
    ) in lines()


def test_violation_after_connack_is_logged(h: Harness, lines: Any) -> None:
    client = h.connect("c")
    client.send_raw(b"\x32\x04\x00\x01t\x00")  # QoS 1 PUBLISH without a packet identifier
    assert client.one(pk.Disconnect).reason_code >= 0x80
    assert "client c: truncated PUBLISH; closing (reason 0x81)" in lines()


def test_giving_up_authentication_is_logged(h: Harness, lines: Any) -> None:
    h.broker.authenticator = ToyAuthenticator()
    client = h.client(peer="10.0.0.9:1234")
    client.send(pk.Connect(client_id="toy", properties={Prop.AUTHENTICATION_METHOD: METHOD}))
    assert client.one(pk.Auth).reason_code == 0x18
    client.disconnect()
    assert client.closed
    assert "client toy from 10.0.0.9:1234 gave up authenticating" in lines()


def test_refusal_code_logged_in_upper_case_hex(make_harness: Any, lines: Any) -> None:
    h: Harness = make_harness(maximum_qos=1)
    client = h.client(peer="10.0.0.9:1234")
    client.send(pk.Connect(client_id="c", will=pk.Will("w", b"x", qos=2)))
    assert client.one(pk.Connack).reason_code == 0x9B
    assert (
        "client c from 10.0.0.9:1234 (user None): will QoS above the maximum; refused (reason 0x9B)"
    ) in lines()

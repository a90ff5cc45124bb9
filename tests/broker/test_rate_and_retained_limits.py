"""Limits a client meets while publishing: the token bucket of max_publish_rate refills at the
configured rate, and a retained message past max_retained is refused with a log line naming
the client and topic."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.harness import Harness, pk


def test_publish_rate_refills_at_the_rate(make_harness: Any) -> None:
    h: Harness = make_harness(max_publish_rate=10.0, max_publish_burst=2)
    client = h.connect("c")
    client.publish("t")
    client.publish("t")  # the burst is spent
    h.clock.advance(0.1)  # one token back at 10 messages/s
    client.publish("t")
    assert client.receive() == []
    client.publish("t")
    assert client.one(pk.Disconnect).reason_code == 0x96


def test_retained_refusal_is_logged(make_harness: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    h: Harness = make_harness(max_retained=1)
    client = h.connect("c")
    client.publish("r/1", b"x", retain=True)
    denied = h.broker.denied
    client.publish("r/2", b"x", 1, retain=True)
    ack = client.one(pk.Puback)
    assert ack.reason_code == 0x97
    assert h.broker.denied == denied + 1  # counted ($SYS), once per refusal
    client.publish("r/3", b"x", 0, retain=True)  # QoS 0: dropped, counted
    assert h.broker.denied == denied + 2
    assert "client c: retained message on 'r/2' refused: max_retained (1) reached" in [
        r.getMessage() for r in caplog.records
    ]

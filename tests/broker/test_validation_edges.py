"""Edges found by a second mutation sample: No Local for QoS 2, the input budget per pass (not
per read), wills and hand-over on a clean session's end with message expiry, a session that
never expires resumed and left again, an authorizer given to the broker at construction, and
3.1.1 answers to refused subscriptions and empty client ids."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.harness import AllowAll, Harness, Prop, pk

from mqttbroker.broker.core import Broker
from mqttbroker.broker.session import NEVER

MQTT_3_1_1 = 4


class DenyAll(AllowAll):
    """Refuses every subscription."""

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return False


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_no_local_at_every_qos(h: Harness, qos: int) -> None:
    """[MQTT-3.8.3-3] No Local: the client's own messages do not come back, whatever their QoS."""
    client = h.connect("c")
    client.subscribe("t", 2, no_local=True)
    other = h.connect("o")
    other.subscribe("t", 2)
    client.publish("t", b"mine", qos)
    received = client.receive()
    assert all(not isinstance(p, pk.Publish) for p in received), received
    assert [p.payload for p in other.publishes()] == [b"mine"]


def test_input_budget_is_per_pass_not_per_read(make_harness: Any) -> None:
    h: Harness = make_harness(input_budget=2)
    client = h.connect("c")
    h.broker.flush()
    client.send_raw(b"\xc0\x00" * 2)
    assert not client.link.reading_paused
    client.send_raw(b"\xc0\x00")  # a second read in the same pass: over the budget
    assert client.link.reading_paused
    answers: list[Any] = []
    for _ in range(3):
        answers += client.receive()
    assert [type(p) for p in answers] == [pk.Pingresp] * 3


def test_clean_session_end_hands_over_with_expiry(h: Harness) -> None:
    leaving = h.connect("leaving")
    staying = h.connect("staying")
    for client in (leaving, staying):
        client.subscribe("$share/g/job", 1)
    pub = h.connect("pub")
    pub.publish("job", b"m", 1, properties={Prop.MESSAGE_EXPIRY_INTERVAL: 60})
    assert [p.payload for p in leaving.publishes()] == [b"m"]
    h.clock.advance(10)
    leaving.lose()
    (handed,) = staying.publishes()
    assert handed.properties[Prop.MESSAGE_EXPIRY_INTERVAL] == 50


def test_never_expiring_session_resumed_and_left(h: Harness) -> None:
    props = {Prop.SESSION_EXPIRY_INTERVAL: NEVER}
    h.connect("s", properties=props).lose()
    h.connect("s", clean_start=False, properties=props, expect_present=True).lose()
    h.tick(10.0**6)
    assert "s" in h.broker.sessions
    h.connect("s", clean_start=False, properties=props, expect_present=True)


def test_authorizer_given_at_construction(h: Harness) -> None:
    h.broker = Broker(h.options, clock=h.clock, authorizer=DenyAll())
    client = h.connect("c")
    assert client.subscribe("t")[0].reason_codes == [0x87]


def test_v311_refused_subscription_is_0x80(h: Harness) -> None:
    h.broker.authorizer = DenyAll()
    client = h.connect("c", version=MQTT_3_1_1)
    assert client.subscribe("t")[0].reason_codes == [0x80]


def test_v311_empty_client_id_with_persistent_session(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """[MQTT311-3.1.3-8] An empty ClientId with CleanSession 0: return code 2 (identifier
    rejected), logged with the reason."""
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    client = h.client(version=MQTT_3_1_1)
    client.send(pk.Connect(client_id="", protocol_level=MQTT_3_1_1, clean_start=False))
    assert client.one(pk.Connack).reason_code == 2
    assert any(
        "empty client id with a persistent session; refused (reason 0x85)" in r.getMessage()
        for r in caplog.records
    )

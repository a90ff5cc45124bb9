"""Stuck-session alarms ([alerts] oldest_queued_age): a subscriber that stops acknowledging
(MQTT 5, Receive Maximum 1) lets its queue age; past the threshold the session is logged once,
published under $SYS/broker/alerts/stuck/, counted and flagged in the API; once it reads again,
it recovers (logged and published once); deleted while stuck, it is said to have ended, not
recovered. Also the age itself, in the broker harness with its fake clock: queued messages
carry the time they were queued, immediate deliveries do not."""

from __future__ import annotations

import json

import pytest
from support.admin_client import Admin, AdminBroker
from support.clients import (
    TIMEOUT,
    Paho,
    decode_vbi,
    stalled_subscriber,
    unique,
)
from support.harness import Harness

from mqttbroker.ops.alerts import Survey, oldest_queued_age
from mqttbroker.protocol.properties import PropertyId as Prop


def packet_id_of_publish(data: bytes) -> int:
    _, pos = decode_vbi(data, 1)
    topic_length = int.from_bytes(data[pos : pos + 2], "big")
    pos += 2 + topic_length
    return int.from_bytes(data[pos : pos + 2], "big")


@pytest.fixture
def alarmed(admin_broker: AdminBroker) -> Admin:
    """A broker whose sessions are stuck once their oldest queued message is a second old."""
    return admin_broker("[alerts]\noldest_queued_age = 1\n")


def test_a_subscriber_that_stops_reading_raises_and_clears_an_alarm(
    alarmed: Admin, paho: Paho
) -> None:
    admin, server = alarmed, alarmed.broker
    topic = unique("stuck")
    watcher = paho(admin)
    watcher.subscribe("$SYS/broker/alerts/#", qos=0)
    slow_id = unique("slow")
    with stalled_subscriber(server, slow_id, topic) as slow:
        publisher = paho(admin)
        for n in range(3):
            publisher.publish(topic, f"m{n}".encode(), qos=1)
        first = slow.read_packet()  # in flight, never acknowledged: the other two queue
        mark = server.log_mark()
        found = server.wait_for_log(rf"session {slow_id} is stuck", TIMEOUT, since=mark)
        assert found is not None, server.log_text()
        event = watcher.wait_messages(1)[0]
        assert event.topic == f"$SYS/broker/alerts/stuck/{slow_id}"
        body = json.loads(event.payload)
        assert body["state"] == "stuck" and body["oldest_queued_age"] > 1
        flagged = admin.ok("GET", f"/api/v1/sessions/{slow_id}")
        assert flagged["stuck"] is True and flagged["queued"] == 2
        assert slow_id in admin.ok("GET", "/api/v1/overview")["stuck_sessions"]
        # It reads again: acknowledges each message as it comes, and the queue drains.
        packet = first
        for _ in range(3):
            slow.send(b"\x40\x02" + packet_id_of_publish(packet).to_bytes(2, "big"))
            if _ < 2:
                packet = slow.read_packet()
        found = server.wait_for_log(rf"session {slow_id} recovered", TIMEOUT, since=mark)
        assert found is not None, server.log_text()
        recovered = watcher.wait_messages(2)[1]
        assert json.loads(recovered.payload)["state"] == "recovered"
        assert server.log_since(mark).count(f"session {slow_id} is stuck") == 1  # once per episode


def test_a_stuck_session_deleted_is_not_said_to_recover(alarmed: Admin, paho: Paho) -> None:
    admin, server = alarmed, alarmed.broker
    topic = unique("stuck")
    slow_id = unique("slow")
    with stalled_subscriber(server, slow_id, topic):
        publisher = paho(admin)
        for n in range(3):
            publisher.publish(topic, f"m{n}".encode(), qos=1)
        mark = server.log_mark()
        assert server.wait_for_log(rf"session {slow_id} is stuck", TIMEOUT, since=mark)
        admin.ok("DELETE", f"/api/v1/sessions/{slow_id}")
        ended = server.wait_for_log(rf"session {slow_id} is no longer stuck", TIMEOUT, since=mark)
        assert ended is not None, server.log_text()
    log = server.log_since(mark)
    assert f"session {slow_id} is no longer stuck: it ended (deleted or expired)" in log
    assert f"session {slow_id} recovered" not in log


def test_queued_deliveries_record_when_they_were_queued() -> None:

    h = Harness()
    sub = h.connect("sub", properties={Prop.RECEIVE_MAXIMUM: 1})
    sub.subscribe("t", qos=1)
    pub = h.connect("pub")
    pub.publish("t", b"1", qos=1)  # sent at once: in flight, not queued
    session = h.broker.sessions["sub"]
    assert len(session.inflight) == 1 and not session.queue
    assert oldest_queued_age(session, h.clock()) == 0.0
    h.clock.advance(5)
    pub.publish("t", b"2", qos=1)  # the window is full: queued now
    h.clock.advance(3)
    pub.publish("t", b"3", qos=1)
    h.clock.advance(2)
    assert len(session.queue) == 2
    assert oldest_queued_age(session, h.clock()) == 5.0  # the older of the two
    survey = Survey(h.broker, threshold=4.0)
    figures = survey.current()
    assert figures.queued == 2 and figures.oldest_age == 5.0
    assert figures.stuck == {"sub": 5.0} and survey.alerts == 1

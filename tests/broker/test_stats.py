"""The broker's running totals (broker/stats.py) and the snapshot every report reads."""

from __future__ import annotations

from support.harness import DenySecret, Harness, Prop, pk

from mqttbroker.broker.stats import CONNECTION_LIMIT, OTHER, REFUSAL_REASONS, BrokerStats


def _snapshot(h: Harness) -> object:
    broker = h.broker
    return broker.stats.snapshot(
        broker.connections, broker.stats.queue_dropped(broker.sessions.values())
    )


def test_a_fresh_broker_reports_zero_everywhere() -> None:
    snap = BrokerStats().snapshot([], 0)
    assert snap.received_by_qos == (0, 0, 0)
    assert (snap.received, snap.delivered, snap.dropped, snap.connects) == (0, 0, 0, 0)
    assert (snap.bytes_received, snap.bytes_sent) == (0, 0)
    reasons = snap.refusals_by_reason()
    assert set(reasons) == {*REFUSAL_REASONS.values(), CONNECTION_LIMIT, OTHER}
    assert set(reasons.values()) == {0}


def test_received_delivered_and_denied_are_counted_as_the_reports_name_them(h: Harness) -> None:
    h.broker.authorizer = DenySecret()
    subscriber = h.connect("sub")
    subscriber.subscribe("t/#", 2)
    publisher = h.connect("pub")
    publisher.publish("t/0", b"a", 0)
    publisher.publish("t/1", b"b", 1)
    publisher.publish("t/2", b"c", 2)
    publisher.publish("secret/x", b"d", 1)  # refused by the authorizer
    h.broker.scheduler.flush()

    snap = h.broker.stats.snapshot(h.broker.connections, 5)
    assert snap.received_by_qos == (1, 1, 1) and snap.received == 3
    assert snap.delivered == 3
    assert snap.denied == 1
    assert (snap.queue_dropped, snap.dropped) == (5, 6)  # dropped: by the queues, or refused
    assert snap.connects == 2
    assert snap.bytes_received == sum(c.conn.input.received for c in h.clients) > 0
    assert snap.bytes_sent == sum(len(c.link.data) for c in h.clients) > 0

    subscriber.disconnect()  # what a closed connection delivered still counts
    assert h.broker.stats.snapshot(h.broker.connections, 0).delivered == 3


def test_refusals_by_reason_count_connect_refusals_and_connection_limits(
    make_harness: object,
) -> None:
    h: Harness = make_harness(max_connections=2)  # type: ignore[operator]
    h.connect("ok")
    bad = h.client()
    bad.send(pk.Connect(client_id="$bridge/x", protocol_level=5))  # a reserved client id: 0x85
    over = h.client()  # bad is gone: this is the second connection
    third = h.client()  # past max_connections: closed at once
    assert not over.closed and third.closed
    reasons = _snapshot(h).refusals_by_reason()  # type: ignore[attr-defined]
    assert reasons["client_identifier_not_valid"] == 1
    assert reasons[CONNECTION_LIMIT] == 1
    assert sum(reasons.values()) == 2


def test_a_snapshot_does_not_change_with_the_counters(h: Harness) -> None:
    stats = h.broker.stats
    before = stats.snapshot(h.broker.connections, 0)
    stats.refusals[0x87] = 4
    stats.count_received(1)
    assert before.refusals == {} and before.received == 0
    assert stats.snapshot(h.broker.connections, 0).refusals_by_reason()["not_authorized"] == 4


def test_queue_drops_still_count_once_their_session_has_ended(make_harness: object) -> None:
    h: Harness = make_harness(max_queued_messages=1)  # type: ignore[operator]
    away = h.connect("away", properties={Prop.SESSION_EXPIRY_INTERVAL: 60})
    away.subscribe("t", 1)
    away.disconnect()
    publisher = h.connect("pub")
    for payload in (b"1", b"2", b"3"):
        publisher.publish("t", payload, 1)
    stats = h.broker.stats
    assert stats.queue_dropped(h.broker.sessions.values()) == 2
    h.connect("away", clean_start=True)  # the old session ends with its drops
    assert stats.queue_dropped(h.broker.sessions.values()) == 2

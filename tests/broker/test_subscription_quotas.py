"""Per-client subscription quotas as a client sees them (SUBACK codes per protocol version) and
as the log records them; overlapping subscriptions forwarding a message with its expiry; the
reason a topic name with U+0000 is refused."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support.harness import AllowAll, Harness, pk

from mqttbroker.broker.session import filter_size

MQTT_3_1_1 = 4


@pytest.mark.parametrize(("version", "refused"), [(5, 0x97), (MQTT_3_1_1, 0x80)])
def test_subscription_count_quota(
    make_harness: Any, caplog: pytest.LogCaptureFixture, version: int, refused: int
) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    h: Harness = make_harness(max_subscriptions_per_client=2)
    client = h.connect("c", version=version)
    client.subscribe("a")
    client.send(pk.Subscribe(7, [pk.SubscriptionRequest(f) for f in ("a", "b")]))
    assert client.one(pk.Suback).reason_codes == [0, 0]  # "a" replaced, "b" the second
    client.send(pk.Subscribe(8, [pk.SubscriptionRequest(f) for f in ("c", "b")]))
    assert client.one(pk.Suback).reason_codes == [refused, 0]
    assert "client c: max_subscriptions_per_client (2) reached: 1 filter(s) refused" in [
        r.getMessage() for r in caplog.records
    ]


def test_subscription_bytes_quota_counts_every_filter(
    make_harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """max_subscription_bytes bounds the sum over the client's filters, not each one."""
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")
    limit = filter_size("x" * 40) * 2 + filter_size("y") - 1
    h: Harness = make_harness(max_subscription_bytes=limit)
    client = h.connect("c")
    assert client.subscribe("x" * 40)[0].reason_codes == [0]
    assert client.subscribe("z" * 40)[0].reason_codes == [0]
    assert client.subscribe("x" * 40, 1)[0].reason_codes == [1]  # replaced: no growth
    assert client.subscribe("y")[0].reason_codes == [0x97]
    assert f"client c: max_subscription_bytes ({limit}) reached" in [
        r.getMessage() for r in caplog.records
    ]
    client.unsubscribe("z" * 40)
    assert client.subscribe("y")[0].reason_codes == [0]


def test_denied_subscription_logged_once_per_packet(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mqttbroker.connection")

    class Rules(AllowAll):
        def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
            return not topic_filter.startswith("secret")

    h.broker.authorizer = Rules()
    client = h.connect("c")
    client.send(
        pk.Subscribe(3, [pk.SubscriptionRequest(f) for f in ("secret/1", "ok", "secret/2")])
    )
    assert client.one(pk.Suback).reason_codes == [0x87, 0, 0x87]
    lines = [r.getMessage() for r in caplog.records if "not authorized" in r.getMessage()]
    assert lines == [
        "client c from peer-c (user None): not authorized to subscribe to 'secret/1' "
        "(1 refused so far)"
    ]

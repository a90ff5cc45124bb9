"""When the authorization rules change, subscriptions they no longer allow are removed at once."""

from __future__ import annotations

from support.harness import AllowAll, Harness


class Rules(AllowAll):
    def __init__(self) -> None:
        self.generation = 0
        self.readable = {"a/#", "b/#"}

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return topic_filter in self.readable


def test_revoked_subscription_stops_the_flow(h: Harness) -> None:
    rules = Rules()
    h.broker.authorizer = rules
    sub = h.connect("sub")
    assert sub.subscribe("a/#")[0].reason_codes == [0]
    assert sub.subscribe("b/#")[0].reason_codes == [0]
    assert sub.subscribe("c/#")[0].reason_codes == [0x87]
    pub = h.connect("pub")
    pub.publish("a/1")
    pub.publish("b/1")
    assert len(sub.publishes()) == 2
    rules.readable = {"b/#"}
    rules.generation += 1
    assert h.broker.recheck_subscriptions() == 1
    pub.publish("a/2")
    pub.publish("b/2")
    assert [p.topic for p in sub.publishes()] == ["b/2"]
    assert list(sub.session.subscriptions) == ["b/#"]


def test_no_authorizer_removes_nothing(h: Harness) -> None:
    sub = h.connect("sub")
    sub.subscribe("a/#")
    assert h.broker.recheck_subscriptions() == 0
    assert list(sub.session.subscriptions) == ["a/#"]

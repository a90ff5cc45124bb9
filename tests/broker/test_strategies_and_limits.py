"""Details the other tests let slip (found by mutation testing, see conformance/README.md):
packet identifiers at the wrap, the offline queue's byte limit, broker-sent aliases on QoS 1
messages with their properties, and each shared-subscription strategy's own rule."""

from __future__ import annotations

from support.harness import Harness, Prop


def test_retained_messages_carry_the_subscription_identifier(h: Harness) -> None:
    pub = h.connect("pub")
    for name in ("r/1", "r/2"):
        pub.publish(name, b"kept", 1, retain=True)
    sub = h.connect("sub")
    received = sub.subscribe("r/+", 1, sub_id=42)[1:]
    assert sorted(p.topic for p in received) == ["r/1", "r/2"]
    assert all(p.properties[Prop.SUBSCRIPTION_IDENTIFIER] == [42] for p in received)

"""Mosquitto's ACL semantics: a subscription that an ACL deny rule reaches only in part is granted,
and the denied topics are never delivered through it, for plain and shared subscriptions,
retained messages and wills; subscriptions no denial reaches check nothing per message."""

from __future__ import annotations

from support.harness import Harness, pk

from mqttbroker.security import AclAuthorizer, AclRules

# Everyone may read and write everything; the subscribers "sub" and "member" may not read (nor
# write) secret/x.
RULES = "topic readwrite #\nclient sub\ntopic deny secret/x\nclient member\ntopic deny secret/x\n"


def acl(h: Harness, text: str = RULES, mode: str = "filter") -> None:
    h.broker.authorizer = AclAuthorizer(AclRules.parse(text.encode(), "acl.txt"), mode)


def topics(client: object) -> list[str]:
    return [p.topic for p in client.publishes()]  # type: ignore[attr-defined]


def test_broad_subscriptions_granted_and_denied_topic_withheld(h: Harness) -> None:
    acl(h)
    sub = h.connect("sub")
    for topic_filter in ("#", "+/+"):
        assert sub.subscribe(topic_filter, 1)[0].reason_codes == [1]
    pub = h.connect("pub")
    pub.publish("secret/x", b"hidden")
    pub.publish("secret/y", b"seen")
    pub.publish("other/x", b"seen")
    assert topics(sub) == ["secret/y", "other/x"]


def test_a_filter_denied_whole_is_refused(h: Harness) -> None:
    acl(h)
    sub = h.connect("sub")
    assert sub.subscribe("secret/x")[0].reason_codes == [0x87]


def test_only_overlapping_subscriptions_check_each_message(h: Harness) -> None:
    """The per-message check is decided once, at subscribe time."""
    acl(h)
    sub = h.connect("sub")
    sub.subscribe("#")
    sub.subscribe("public/+")
    subs = sub.session.subscriptions
    assert subs["#"].read_check is not None
    assert subs["public/+"].read_check is None


def test_strict_mode_refuses_the_broad_subscription(h: Harness) -> None:
    acl(h, mode="refuse")
    sub = h.connect("sub")
    assert sub.subscribe("#")[0].reason_codes == [0x87]
    assert sub.subscribe("public/+")[0].reason_codes == [0]


def test_shared_subscription_withholds_the_denied_topic(h: Harness) -> None:
    acl(h)
    member = h.connect("member")
    assert member.subscribe("$share/g/#")[0].reason_codes == [0]
    pub = h.connect("pub")
    pub.publish("secret/x")
    pub.publish("open/x")
    assert topics(member) == ["open/x"]


def test_retained_denied_topic_not_sent_on_subscribe(h: Harness) -> None:
    acl(h)
    pub = h.connect("pub")
    pub.publish("secret/x", b"r", retain=True)
    pub.publish("open/x", b"r", retain=True)
    sub = h.connect("sub")
    received = sub.subscribe("#")
    assert [p.topic for p in received if isinstance(p, pk.Publish)] == ["open/x"]


def test_will_on_a_denied_topic_not_delivered_through_a_broad_filter(h: Harness) -> None:
    acl(h)
    watcher = h.connect("sub")
    assert watcher.subscribe("#")[0].reason_codes == [0]
    reader = h.connect("reader")
    reader.subscribe("secret/#")
    dying = h.connect("dying", will=pk.Will("secret/x", b"gone"))
    dying.lose()
    assert topics(watcher) == []
    assert topics(reader) == ["secret/x"]  # others may still read it


def test_rules_reloaded_mark_existing_subscriptions(h: Harness) -> None:
    acl(h, "topic readwrite #\n")
    sub = h.connect("sub")
    sub.subscribe("#")
    assert sub.session.subscriptions["#"].read_check is None
    acl(h)
    h.broker.authorizer.generation += 1  # type: ignore[union-attr]
    assert h.broker.recheck_subscriptions() == 0
    h.connect("pub").publish("secret/x")
    assert topics(sub) == []

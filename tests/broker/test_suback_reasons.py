"""The SUBACK's Reason String names each refused filter and why (ACL, invalid, quota, options
off), unless the client asked for no problem information or it would not fit its Maximum Packet
Size."""

from __future__ import annotations

from typing import Any

from support.harness import Harness, Prop, pk

from mqttbroker.security import AclAuthorizer, AclRules


def _suback(client: Any, *filters: str) -> pk.Suback:
    requests = [pk.SubscriptionRequest(f, 0, False, False, 0) for f in filters]
    client.send(pk.Subscribe(client.next_id(), requests, {}))
    received = client.receive()
    assert isinstance(received[0], pk.Suback), received
    return received[0]


def test_refused_filters_named_in_the_reason_string(make_harness: Any) -> None:
    # A SUBSCRIBE with more filters than a client may hold is refused whole: the quota is
    # reached here through four earlier subscriptions.
    h = make_harness(wildcard_subscriptions=False, max_subscriptions_per_client=6)
    rules = "topic readwrite #\ntopic deny secret/x\n"
    h.broker.authorizer = AclAuthorizer(AclRules.parse(rules.encode(), "acl.txt"))
    sub = h.connect("sub")
    assert _suback(sub, "p1", "p2", "p3", "p4").reason_codes == [0, 0, 0, 0]
    suback = _suback(sub, "ok", "secret/x", "a/#/b", "w/+", "ok2", "ok3")
    assert suback.reason_codes == [0, 0x87, 0x8F, 0xA2, 0, 0x97]
    reason = suback.properties[Prop.REASON_STRING]
    for expected in (
        "'secret/x': not authorized",
        "'a/#/b': invalid",
        "'w/+': wildcard",
        "'ok3': subscription quota",
    ):
        assert expected in reason, reason
    assert "'ok'" not in reason and "'ok2'" not in reason


def test_no_reason_string_without_a_refusal(h: Harness) -> None:
    sub = h.connect("sub")
    assert not _suback(sub, "ok").properties


def test_no_reason_string_when_problem_information_is_not_requested(h: Harness) -> None:
    """[MQTT-3.1.2-29]"""
    sub = h.connect("sub", properties={Prop.REQUEST_PROBLEM_INFORMATION: 0})
    suback = _suback(sub, "a/#/b")
    assert suback.reason_codes == [0x8F] and not suback.properties


def test_reason_string_left_out_beyond_the_maximum_packet_size(h: Harness) -> None:
    """[MQTT-3.9.2-1]"""
    sub = h.connect("sub", properties={Prop.MAXIMUM_PACKET_SIZE: 40})
    suback = _suback(sub, "a/#/b")
    assert suback.reason_codes == [0x8F] and not suback.properties
    roomy = h.connect("roomy", properties={Prop.MAXIMUM_PACKET_SIZE: 400})
    assert _suback(roomy, "a/#/b").properties


def test_unsuback_names_the_filters_without_a_subscription(h: Harness) -> None:
    """[MQTT-3.11.2-1]"""
    sub = h.connect("sub")
    sub.subscribe("a")
    (unsuback,) = sub.unsubscribe("a", "b")
    assert unsuback.reason_codes == [0, 0x11]
    assert unsuback.properties[Prop.REASON_STRING] == "'b': no such subscription"
    quiet = h.connect("quiet", properties={Prop.REQUEST_PROBLEM_INFORMATION: 0})
    (unsuback,) = quiet.unsubscribe("b")
    assert unsuback.reason_codes == [0x11] and not unsuback.properties

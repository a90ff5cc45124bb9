"""The chaos run's checker (benchmarks/chaos_check.py) on hand-made histories: each kind of
failure it exists to find is reported, and what is allowed (an unacknowledged message missing,
a QoS 1 duplicate, a QoS 2 resend with the same packet identifier) is not."""

from __future__ import annotations

from typing import Any

from benchmarks.chaos import NEMESIS_KINDS, verdict
from benchmarks.chaos_check import check, table

A, B = "chaos/a/q1", "chaos/a/q2"  # device a's topics; b subscribes to both


def base() -> list[tuple[Any, ...]]:
    """a and b connect (Clean Start: Session Present 0 expected), b subscribes to a's topics."""
    return [
        (1.0, "connack", "a", 1, False, False, 1001),
        (1.0, "connack", "b", 1, False, False, 1002),
        (1.1, "subscribed", "b", (A, B)),
    ]


def publish(t: float, topic: str, seq: int, qos: int, acked: bool = True, code: int = 0) -> list:
    events: list[tuple[Any, ...]] = [(t, "send", "a", topic, seq, qos, False, seq)]
    if acked:
        events.append((t + 0.01, "ack", "a", topic, seq, qos, code))
    return events


def deliver(t: float, topic: str, seq: int, qos: int, conn: int = 1, kind: str = "deliver"):
    return (t, kind, "b", topic, "a", seq, qos, False, conn)


def test_a_clean_history_reports_nothing() -> None:
    history = base()
    for seq in (1, 2, 3):
        history += publish(2.0 + seq, A, seq, 1) + publish(2.0 + seq, B, seq, 2)
        history += [deliver(2.1 + seq, A, seq, 1), deliver(2.1 + seq, B, seq, 2)]
    result = check(history)
    assert result["acknowledged"] == 6
    assert (result["acknowledged_qos1"], result["acknowledged_qos2"]) == (3, 3)
    assert result["deliveries"] == 6
    for key in ("lost", "qos2_duplicates", "order_violations", "wrong_session_present"):
        assert result[key] == 0, key
    assert result["double_owners"] == 0


def test_an_acknowledged_message_never_delivered_is_lost() -> None:
    history = base() + publish(2.0, A, 1, 1) + publish(3.0, B, 1, 2)
    history.append(deliver(2.1, A, 1, 1))
    result = check(history)
    assert result["lost"] == 1
    (lost,) = result["examples"]["lost"]
    assert (lost["subscriber"], lost["topic"], lost["seq"], lost["qos"]) == ("b", B, 1, 2)


def test_what_is_not_lost() -> None:
    # Never acknowledged (indeterminate), refused (0x80), sent before the subscription, or
    # for a session its device ended itself: none of these is lost.
    history = base()
    history += publish(2.0, A, 1, 1, acked=False)
    history += publish(3.0, A, 2, 1, code=0x80)
    history += [(0.5, "send", "a", A, 3, 1, False, 3), (1.5, "ack", "a", A, 3, 1, 0)]
    assert check(history)["lost"] == 0
    ended = base() + publish(2.0, A, 4, 1) + [(3.0, "session_end", "b")]
    assert check(ended)["lost"] == 0
    # A session the broker lost (Session Present 0 on a reconnection) does not excuse a loss.
    wrong = base() + publish(2.0, A, 4, 1) + [(3.0, "connack", "b", 2, False, True, 1003)]
    assert check(wrong)["lost"] == 1


def test_a_qos2_message_delivered_twice_is_a_duplicate() -> None:
    history = base() + publish(2.0, B, 1, 2)
    history += [deliver(2.1, B, 1, 2), deliver(5.0, B, 1, 2, conn=2)]
    result = check(history)
    assert result["qos2_duplicates"] == 1
    assert result["examples"]["qos2_duplicates"][0]["seq"] == 1


def test_what_is_not_a_qos2_duplicate() -> None:
    # A QoS 1 message twice is allowed (counted apart); a QoS 2 PUBLISH resent with its
    # unreleased packet identifier is no second delivery.
    history = base() + publish(2.0, A, 1, 1) + publish(2.0, B, 1, 2)
    history += [deliver(2.1, A, 1, 1), deliver(4.0, A, 1, 1, conn=2)]
    history += [deliver(2.1, B, 1, 2), deliver(4.0, B, 1, 2, conn=2, kind="redeliver")]
    result = check(history)
    assert result["qos2_duplicates"] == 0
    assert result["qos1_duplicates"] == 1


def test_a_lower_seq_first_delivered_after_a_higher_is_an_order_violation() -> None:
    history = base()
    for seq in (1, 2, 3):
        history += publish(2.0 + seq, A, seq, 1)
    history += [deliver(5.1, A, 1, 1), deliver(5.2, A, 3, 1), deliver(5.3, A, 2, 1)]
    result = check(history)
    assert result["order_violations"] == 1
    (violation,) = result["examples"]["order_violations"]
    assert (violation["seq"], violation["after"]) == (2, 3)


def test_a_redelivery_after_a_higher_seq_is_no_order_violation() -> None:
    history = base()
    for seq in (1, 2):
        history += publish(2.0 + seq, A, seq, 1)
    history += [deliver(4.1, A, 1, 1), deliver(4.2, A, 2, 1), deliver(6.0, A, 1, 1, conn=2)]
    history += [deliver(4.1, B, 5, 2), deliver(4.2, B, 2, 2)]  # another topic: its own order
    result = check(history)
    assert result["order_violations"] == 1
    assert result["examples"]["order_violations"][0]["topic"] == B


def test_a_wrong_session_present_is_reported() -> None:
    history = base()
    history += [(5.0, "lost_conn", "b", 1, "closed"), (5.5, "connack", "b", 2, True, True, 1004)]
    history += [(6.0, "lost_conn", "b", 2, "closed"), (9.0, "connack", "b", 3, False, True, 1005)]
    history += [(9.0, "connack", "c", 1, True, False, 1006)]  # present on a first connection
    nemesis = (8.0, "nemesis", "kill_node", "n2", 8.5, True, {})
    result = check(history + [nemesis], nodes={("b", 3): "n1"})
    assert result["wrong_session_present"] == 2
    first = result["examples"]["wrong_session_present"][0]
    assert (first["client"], first["conn"], first["node"]) == ("b", 3, "n1")
    assert first["nemesis"] == "kill_node n2"
    assert result["reconnects"] == 2
    assert result["longest_without_connection_s"] == 3.0  # 6.0 to 9.0
    assert result["longest_without_connection"]["client"] == "b"


def test_a_device_still_without_connection_counts_until_the_end() -> None:
    history = base() + [(5.0, "lost_conn", "a", 1, "closed"), (6.0, "connect_fail", "a", 5.2, "x")]
    result = check(history, end=20.0)
    assert result["longest_without_connection_s"] == 15.0
    assert result["connect_failures"] == 1
    assert result["longest_connect_failure_s"] == 0.8


def test_delivery_on_a_given_up_connection_after_a_newer_connack_is_a_double_owner() -> None:
    history = base()
    history += [(5.0, "lost_conn", "b", 1, "nothing from the broker for 6 s")]
    history += [(6.0, "connack", "b", 2, True, True, 1007)]
    history += publish(7.0, A, 1, 1)  # sent after b's new CONNACK...
    history += [(8.0, "zombie_deliver", "b", A, "a", 1, 1, 1)]  # ...yet came on the old one
    history += [deliver(7.1, A, 1, 1, conn=2)]
    nodes = {("b", 1): "n2", ("b", 2): "n3"}
    result = check(history, nodes=nodes)
    assert result["double_owners"] == 1
    (double,) = result["examples"]["double_owners"]
    assert (double["client"], double["old_node"], double["new_node"]) == ("b", "n2", "n3")
    assert result["lost"] == 0  # the delivery on the new connection counts, the stale one not


def test_a_stale_delivery_sent_before_the_newer_connack_is_no_double_owner() -> None:
    history = base() + publish(4.0, A, 1, 1)
    history += [(5.0, "lost_conn", "b", 1, "nothing from the broker for 6 s")]
    history += [(6.0, "connack", "b", 2, True, True, 1007)]
    history += [(8.0, "zombie_deliver", "b", A, "a", 1, 1, 1)]  # may have been on its way
    result = check(history)
    assert result["double_owners"] == 0
    assert result["zombie_deliveries"] == 1
    assert result["lost"] == 1  # a delivery on a given-up connection is not a delivery


def test_the_verdict_names_each_goal_missed_and_each_nemesis_that_never_acted() -> None:
    history = base() + publish(2.0, A, 1, 1)
    history += [
        (3.0, "nemesis", kind, "n1", 4.0, kind != "drop_node", {})
        for kind in NEMESIS_KINDS
        if kind != "kill_redis"
    ]
    result = check(history)
    missed = verdict(result)
    assert "lost = 1" in missed
    assert "nemesis kill_redis never acted" in missed
    assert "nemesis drop_node never acted" in missed  # it failed: it did not act
    assert not any("pause_node" in m or "qos2" in m for m in missed)
    text = table({"ours": result})
    assert "lost (acknowledged, never delivered)" in text
    assert "nemesis: drop_node" in text and "(1 failed)" in text

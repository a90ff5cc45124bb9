"""A cluster you can kill: a node killed (SIGKILL) or frozen (SIGSTOP) loses no acknowledged
message, and a client coming back at once, as a device behind a load balancer does, finds its
session on another node (Session Present 1) or is refused with a code it retries (0x88), never
given an empty session over its stored one.

Real node processes on a real redis-server, with the default ``node_ttl`` (10 s): a device does
not wait for a lease to run out before reconnecting."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import pytest
from support.clients import unique, wait_for
from support.cluster_clients import (
    SERVER_UNAVAILABLE,
    SHORT_LEASE,
    acknowledged,
    adopted,
    arrives,
    client,
    close_all,
    device,
    kill,
    payloads,
    resumed,
    subscribed,
    subscriber,
    until_routed,
)

pytestmark = pytest.mark.needs_redis


def asked_by_b(client_id: str) -> dict[str, Any]:
    """A hand-over request for ``client_id``'s session as node b writes it (b frozen: the test
    publishes it on the old node's control channel itself)."""
    return {
        "client": client_id,
        "reply": f"mqttbroker:handover:{client_id}",
        "clean": False,
        "user": None,
        "node": "b",
        "forgotten": {},
    }


def test_a_device_back_at_once_after_its_node_is_killed_finds_its_session(
    start_node: Any,
) -> None:
    """The device's session is on b; 300 QoS 1 messages are acknowledged on a (in b's stream);
    b is SIGKILLed and the device reconnects to a at once: its session is there (Session
    Present 1) with the 300 messages. Redis saw b's connection close: a adopts b without
    waiting for b's lease (node_ttl, 10 s) to run out."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("dur")
    topic = unique("p")
    sub = subscribed(b, client_id, f"{topic}/#", 1)
    pub = client(a)
    until_routed(pub, sub, f"{topic}/x")
    sub.close()  # away: the messages wait in b's stream and session
    sent = [f"m{i}".encode() for i in range(300)]
    infos = [pub.publish(f"{topic}/x", p, qos=1, wait=False) for p in sent]
    for info in infos:
        assert pub.wait_published(info, timeout=30) == 0  # acknowledged
    kill(b)
    again = resumed(a, client_id)  # at once, on the other node
    wait_for(lambda: set(payloads(again)) >= set(sent), "the 300 acknowledged messages", 30)
    assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 10) is not None
    connects = [line for line in a.log_text().splitlines() if f"client {client_id} conn" in line]
    assert connects and all("session resumed" in line for line in connects), connects
    close_all(again, pub)


def test_a_frozen_node_is_refused_then_adopted_and_fenced_when_it_wakes(
    start_node: Any,
) -> None:
    """b is frozen (SIGSTOP) with a device of a persistent session connected, and a publisher.
    The device, back on a at once, is refused with 0x88 while b's lease lasts (b does not
    answer), then gets its session (Session Present 1) once a adopts b. While frozen, b's
    clients send what they have (the device a QoS 1 message, the publisher one for the
    device's topic): when b wakes (SIGCONT), its lease is another's; it delivers nothing to
    the device's stale connection and acknowledges nothing for it, closes that connection, and
    what it acknowledges to the publisher reaches the session where it lives now."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("frozen")
    topic = unique("frozen")
    first = subscribed(b, client_id, topic, 1)
    local = client(b)  # a publisher on b
    pub = client(a)
    until_routed(pub, first, topic)
    b.send_signal(signal.SIGSTOP)
    try:
        early = device(a, client_id, clean=False)
        assert early.connect(expect_success=False) == SERVER_UNAVAILABLE
        assert early.connack is not None and getattr(early.connack[2], "ReasonString", None)
        early.close()
        sent = [f"f{i}".encode() for i in range(10)]
        acknowledged(pub, topic, sent)
        moved = adopted(a, client_id)
        wait_for(lambda: set(payloads(moved)) >= set(sent), "the messages b had not delivered", 30)
        # b's clients send while it is frozen; b reads it when it wakes.
        own = first.publish(f"{topic}/own", b"from-the-stale-device", qos=1, wait=False)
        late = local.publish(topic, b"to-the-device", qos=1, wait=False)
    finally:
        b.send_signal(signal.SIGCONT)
    first.wait_disconnected(30)
    assert b"to-the-device" not in payloads(first)
    assert own.mid not in first.acked  # nothing acknowledged for the adopted session
    local.wait_until(lambda: late.mid in local.acked or bool(local.disconnects), 30, "an answer")
    if late.mid in local.acked:  # acknowledged: it reached the session where it lives now
        wait_for(lambda: b"to-the-device" in payloads(moved), "the message b acknowledged")
    assert b.wait_for_log("lease of node 'b' was not renewed|node 'b' was fenced", 10)
    pub.publish(topic, b"after", qos=1)
    wait_for(lambda: b"after" in payloads(moved), "a message after the move")
    assert b"after" not in payloads(first)
    close_all(moved, first, pub, local)


def test_a_device_retrying_on_two_nodes_while_its_node_is_frozen_never_gets_an_empty_session(
    start_node: Any,
) -> None:
    """The device's session is on c, frozen; the device (behind a load balancer) tries a and b
    at the same time. Neither may start it an empty session: each is refused with 0x88 while
    c holds its lease, or resumes the session (Session Present 1) once c is adopted. The
    client id moves only with the session: a node asking for it does not own it meanwhile."""
    a = start_node("a")
    b = start_node("b")
    c = start_node("c")
    client_id = unique("twice")
    topic = unique("twice")
    subscribed(c, client_id, topic, 1).close()
    c.send_signal(signal.SIGSTOP)
    try:
        results: list[tuple[int, bool]] = []

        def attempt(node: Any) -> None:
            d = device(node, client_id, clean=False)
            code = d.connect(timeout=30, expect_success=False)
            results.append((code, d.session_present))
            d.close()

        threads = [threading.Thread(target=attempt, args=(n,)) for n in (a, b)]
        for t in threads:
            t.start()
            time.sleep(0.2)  # (the second asks while the first waits for c)
        for t in threads:
            t.join(60)
        assert len(results) == 2
        for code, present in results:
            assert (code, present) in ((SERVER_UNAVAILABLE, False), (0, True)), results
    finally:
        c.send_signal(signal.SIGCONT)


def test_a_session_handed_to_a_node_that_dies_before_writing_it_is_adopted_with_it(
    start_node: Any, redis_server: Any
) -> None:
    """b asks a for the device's session and freezes before it writes the session it got
    (here: b is frozen first and its request written to Redis as b writes it), then dies. a's
    answer moved the client id to b and counted the session among b's in the same step, and
    a's end of the session kept its hash (b owns the client id): a adopts b with the session,
    and the device, back on a, finds it (Session Present 1) with its subscription, where it
    used to get an empty one."""
    a = start_node("a", config=SHORT_LEASE)
    b = start_node("b", config=SHORT_LEASE)
    client_id = unique("handed")
    topic = unique("handed")
    subscribed(a, client_id, topic, 1).close()
    with redis_server.client() as r:
        wait_for(lambda: r.sismember("mqttbroker:owned:a", client_id), "the session in Redis")
        b.send_signal(signal.SIGSTOP)
        request = asked_by_b(client_id)
        assert r.publish("mqttbroker:ctl:a", json.dumps(request)) == 1
        wait_for(lambda: r.get(f"mqttbroker:client:{client_id}") == b"b", "a to answer b")
    kill(b)
    again = adopted(a, client_id)
    pub = client(a)
    acknowledged(pub, topic, [b"m1"])
    wait_for(lambda: payloads(again) == [b"m1"], "m1 on the session's subscription")
    close_all(again, pub)


def _stream_read(r: Any, node: str) -> bool:
    """Whether ``node`` has read and acknowledged every entry of its stream."""
    groups = r.xinfo_groups(f"mqttbroker:stream:{node}")
    return bool(groups) and all(g["pending"] == 0 and not g.get("lag") for g in groups)


@pytest.mark.parametrize("adopter", ["a", "c"])
@pytest.mark.parametrize("answered_first", [False, True], ids=["read-first", "answered-first"])
def test_a_message_for_a_session_on_its_way_to_a_node_that_dies_is_not_lost(
    start_node: Any, redis_server: Any, answered_first: bool, adopter: str
) -> None:
    """A QoS 2 message published on b while the device's session is on its way from a to b,
    b freezing before the session came and then dying: the node the device comes back to (a,
    or c, which never had the message) adopts b with the session, and the device gets the
    message. a reads the message from its stream before it answers (the message goes with the
    answer) or after (a forwards it to b). Either way it was lost: a's last write of the
    session says nothing of what it got since, and b's own counters, which say that b routed
    its own message to its sessions, say nothing of a session that never reached it (the long
    chaos run's d044 and d019). (a is frozen meanwhile; which of the two it does first, woken,
    is as its event loop finds them.)"""
    a = start_node("a", config=SHORT_LEASE)
    b = start_node("b", config=SHORT_LEASE)
    back = a if adopter == "a" else start_node("c", config=SHORT_LEASE)
    client_id = unique("onway")
    topic = unique("onway")
    first = subscribed(a, client_id, topic, 2)
    pub = device(b, unique("onway-pub"))  # (persistent: b writes its counters with its session)
    pub.connect()
    until_routed(pub, first, topic)
    first.close()
    request = asked_by_b(client_id)
    with redis_server.client() as r:
        wait_for(lambda: r.sismember("mqttbroker:owned:a", client_id), "the session in Redis")
        a.send_signal(signal.SIGSTOP)
        try:
            if answered_first:
                assert r.publish("mqttbroker:ctl:a", json.dumps(request)) == 1
            acknowledged(pub, topic, [b"on-its-way"], qos=2)  # in a's stream, not yet read
            b.send_signal(signal.SIGSTOP)
            if not answered_first:
                assert r.publish("mqttbroker:ctl:a", json.dumps(request)) == 1
        finally:
            a.send_signal(signal.SIGCONT)
        wait_for(lambda: r.get(f"mqttbroker:client:{client_id}") == b"b", "a to answer b")
        wait_for(lambda: _stream_read(r, "a"), "a to read its stream")
    kill(b)
    again = adopted(back, client_id)
    wait_for(lambda: payloads(again) == [b"on-its-way"], "the message acknowledged on b")
    close_all(again, pub)


def test_a_message_the_lost_node_had_is_routed_to_a_session_on_its_way_there(
    start_node: Any, redis_server: Any
) -> None:
    """The device's session on its way from a to b, as above; a QoS 1 message published on c
    meanwhile goes to a (the device's route) and to b (another subscriber's). b routes it to
    its own subscriber and acknowledges it in its stream, keeping it for the session coming;
    a, having answered, does not forward it (b has it). b freezes, then dies: a adopts b with
    the session and routes it the message itself, from what it routed since the session left
    (b's stream no longer holds it)."""
    a = start_node("a", config=SHORT_LEASE)
    b = start_node("b", config=SHORT_LEASE)
    c = start_node("c", config=SHORT_LEASE)
    client_id = unique("had")
    topic = unique("had")
    first = subscribed(a, client_id, topic, 1)
    other = subscriber(b, topic, 1)
    pub = client(c)
    until_routed(pub, first, topic)
    until_routed(pub, other, topic)
    first.close()
    request = asked_by_b(client_id)
    with redis_server.client() as r:
        wait_for(lambda: r.sismember("mqttbroker:owned:a", client_id), "the session in Redis")
        a.send_signal(signal.SIGSTOP)
        try:
            assert r.publish("mqttbroker:ctl:a", json.dumps(request)) == 1
            acknowledged(pub, topic, [b"both"])
            arrives(b"both", other)
            wait_for(lambda: _stream_read(r, "b"), "b to acknowledge it in its stream")
            b.send_signal(signal.SIGSTOP)
        finally:
            a.send_signal(signal.SIGCONT)
        wait_for(lambda: r.get(f"mqttbroker:client:{client_id}") == b"b", "a to answer b")
        wait_for(lambda: _stream_read(r, "a"), "a to read its stream")
    kill(b)
    again = adopted(a, client_id)
    wait_for(lambda: b"both" in payloads(again), "the message b had acknowledged")
    assert payloads(again) == [b"both"]
    close_all(again, pub, other)


def test_a_session_on_its_way_to_a_lost_node_is_not_routed_again_what_its_answer_holds(
    start_node: Any, redis_server: Any
) -> None:
    """b is frozen; a QoS 2 message published on c goes to a (the device's route: a queues it in
    the session) and to b's stream (another subscriber's), unread. The session is then handed
    from a to b (its answer holds the message) and b dies: a adopts b, and routes the session
    what b's stream holds but what its answer says it got. The message comes once."""
    a = start_node("a", config=SHORT_LEASE)
    b = start_node("b", config=SHORT_LEASE)
    c = start_node("c", config=SHORT_LEASE)
    client_id = unique("once")
    topic = unique("once")
    first = subscribed(a, client_id, topic, 2)
    other = subscriber(b, topic, 2)
    pub = client(c)
    until_routed(pub, first, topic)
    until_routed(pub, other, topic)
    first.close()
    request = asked_by_b(client_id)
    with redis_server.client() as r:
        wait_for(lambda: r.sismember("mqttbroker:owned:a", client_id), "the session in Redis")
        b.send_signal(signal.SIGSTOP)
        acknowledged(pub, topic, [b"once"], qos=2)
        wait_for(lambda: _stream_read(r, "a"), "a to queue it in the session")
        assert r.publish("mqttbroker:ctl:a", json.dumps(request)) == 1
        wait_for(lambda: r.get(f"mqttbroker:client:{client_id}") == b"b", "a to answer b")
    kill(b)
    again = adopted(a, client_id)
    acknowledged(pub, topic, [b"after"], qos=2)
    wait_for(lambda: b"after" in payloads(again), "a message published after")
    assert payloads(again) == [b"once", b"after"]
    close_all(again, pub, other)

"""Copies and gaps between nodes, on real node processes and a real redis-server: a stream
entry written twice (a batch sent again after Redis took it and its answer was lost) or read
twice (a node killed between committing a delivery and acknowledging the entry) delivers a
QoS 2 message once; a session handed over gets the messages that reached its new node before
it did and its old node only after it had gone (sequence.py); a node woken past its lease does
not send what the clients of sessions adopted meanwhile published there."""

from __future__ import annotations

import signal
import time
from collections import Counter
from typing import Any

import pytest
from support.clients import unique
from test_cluster_kill import client, device, payloads, until_routed, wait_for

pytestmark = pytest.mark.needs_redis

STREAM = "mqttbroker:stream:"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def publish_frame(topic: str, payload: bytes, ident: bytes, qos: int = 1) -> bytes:
    """A stream entry holding one QoS 1/2 message for a node's plain subscribers, as a node
    frames it (node.py): ``1<id>\\x1e\\0<MQTT 5 PUBLISH>``, after its length."""
    name = topic.encode()
    body = len(name).to_bytes(2, "big") + name + (1).to_bytes(2, "big") + b"\0" + payload
    packet = bytes([0x30 | qos << 1]) + _varint(len(body)) + body
    frame = b"1" + ident + b"\x1e\0" + packet
    return len(frame).to_bytes(4, "big") + frame


def entries_with(r: Any, stream: str, payload: bytes) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in r.xrange(stream) if payload in fields[b"m"]]


def test_a_stream_entry_written_twice_delivers_a_qos2_message_once(
    start_node: Any, redis_server: Any
) -> None:
    a = start_node("a")
    b = start_node("b")
    topic = unique("twice")
    sub = client(b)
    sub.subscribe(topic, qos=2)
    pub = client(a)
    until_routed(pub, sub, topic)
    assert pub.wait_published(pub.publish(topic, b"m1", qos=2, wait=False)) == 0
    wait_for(lambda: b"m1" in payloads(sub), "m1")
    r = redis_server.client()
    try:
        [entry] = entries_with(r, STREAM + "b", b"m1")
        r.xadd(STREAM + "b", entry)  # the same batch again: its first answer was lost
    finally:
        r.close()
    assert pub.wait_published(pub.publish(topic, b"m2", qos=2, wait=False)) == 0
    wait_for(lambda: b"m2" in payloads(sub), "m2")
    assert Counter(payloads(sub)) == {b"m1": 1, b"m2": 1}
    for c in (sub, pub):
        c.close()


def test_a_killed_nodes_entry_its_session_holds_is_not_routed_to_it_again(
    start_node: Any, redis_server: Any
) -> None:
    """b routed m1 to the device's session and was killed before acknowledging the entry
    (here: the entry put back as unread). a adopts b: the session in Redis holds m1 (or had
    it delivered), and what b wrote of what it routed says so: m1 is not delivered again."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("held")
    topic = unique("held")
    dev = device(b, client_id, clean=True)
    dev.connect()
    dev.subscribe(topic, qos=2)
    pub = client(a)
    until_routed(pub, dev, topic)
    assert pub.wait_published(pub.publish(topic, b"m1", qos=2, wait=False)) == 0
    wait_for(lambda: b"m1" in payloads(dev), "m1")
    r = redis_server.client()
    try:
        wait_for(lambda: bool(r.hgetall("mqttbroker:seen:b")), "b's counters in Redis")
        [entry] = entries_with(r, STREAM + "b", b"m1")
        b.send_signal(signal.SIGKILL)
        b.wait_exit()
        r.xadd(STREAM + "b", entry)  # not acknowledged when b died
    finally:
        r.close()
    dev.close()
    again = device(a, client_id, clean=False)
    again.connect()
    assert again.session_present, a.log_text()
    assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 10) is not None
    assert pub.wait_published(pub.publish(topic, b"m2", qos=2, wait=False)) == 0
    wait_for(lambda: b"m2" in payloads(again), "m2")
    assert Counter(payloads(dev) + payloads(again)) == {b"m1": 1, b"m2": 1}
    for c in (again, pub):
        c.close()


def test_a_session_handed_over_gets_what_its_new_node_routed_before_it_came(
    start_node: Any, redis_server: Any
) -> None:
    """A message from a third node reaches b's stream and a's; b routes it at once (to its own
    subscriber), a would only later. The device moves from a to b meanwhile: a's answer says
    a had routed none of that node's messages, so b routes it the message it routed before
    the session came (a, reading it later, has no session for it any more)."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("gap")
    topic = unique("gap")
    dev = device(a, client_id, clean=True)
    dev.connect()
    dev.subscribe(topic, qos=1)
    local = client(b)
    local.subscribe(topic, qos=1)
    pub = client(b)
    until_routed(pub, dev, topic)
    r = redis_server.client()
    try:
        # (a third node's message: for b's stream; a's copy is not read yet)
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"gap", b"c.00000001\x1d1")})
        wait_for(lambda: b"gap" in payloads(local), "b to route the message")
        dev.close()
        again = device(b, client_id, clean=False)
        again.connect()
        assert again.session_present, b.log_text()
        r.xadd(STREAM + "a", {"m": publish_frame(topic, b"gap", b"c.00000001\x1d1")})
    finally:
        r.close()
    wait_for(lambda: b"gap" in payloads(again), "the message b routed before the session came")
    pub.publish(topic, b"last", qos=1)
    wait_for(lambda: b"last" in payloads(again), "the last one")
    assert Counter(payloads(dev) + payloads(again)) == {b"gap": 1, b"last": 1}
    for c in (again, local, pub):
        c.close()


def test_what_the_old_node_routes_after_a_hand_over_is_forwarded_to_the_session(
    start_node: Any, redis_server: Any
) -> None:
    """b has no subscriber of the topic: a publisher's node that has not heard of b's new
    route yet sends to a only. a, the session gone to b, forwards it there."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("fwd")
    topic = unique("fwd")
    dev = device(a, client_id, clean=True)
    dev.connect()
    dev.subscribe(topic, qos=1)
    dev.close()
    again = device(b, client_id, clean=False)
    again.connect()
    assert again.session_present, b.log_text()
    r = redis_server.client()
    try:
        # (a third node's message, sent before it heard that b has the route now)
        r.xadd(STREAM + "a", {"m": publish_frame(topic, b"late", b"c.00000001\x1d1")})
    finally:
        r.close()
    wait_for(lambda: b"late" in payloads(again), "the message a forwarded")
    pub = client(b)
    pub.publish(topic, b"last", qos=1)
    wait_for(lambda: b"last" in payloads(again), "the last one")
    assert Counter(payloads(again)) == {b"late": 1, b"last": 1}
    for c in (again, pub):
        c.close()


def test_a_session_adopted_then_handed_over_gets_no_message_twice(
    start_node: Any, redis_server: Any
) -> None:
    """The device's session got m1 on b (from c's publisher); b is killed and a adopts it,
    though a never had the topic's route (m1 never reached a). The device moves on to c,
    which routed m1 too (its own subscriber): a's answer says what the session got on b, so
    c does not route m1 to it again."""
    a = start_node("a")
    b = start_node("b")
    c = start_node("c")
    client_id = unique("moved")
    topic = unique("moved")
    dev = device(b, client_id, clean=True)
    dev.connect()
    dev.subscribe(topic, qos=2)
    local = client(c)
    local.subscribe(topic, qos=2)
    pub = client(c)
    until_routed(pub, dev, topic)
    assert pub.wait_published(pub.publish(topic, b"m1", qos=2, wait=False)) == 0
    wait_for(lambda: b"m1" in payloads(dev) and b"m1" in payloads(local), "m1")
    r = redis_server.client()
    try:
        wait_for(lambda: bool(r.hgetall("mqttbroker:seen:b")), "b's counters in Redis")
    finally:
        r.close()
    b.send_signal(signal.SIGKILL)
    b.wait_exit()
    dev.close()
    on_a = device(a, client_id, clean=False)
    on_a.connect()
    assert on_a.session_present, a.log_text()
    on_a.close()
    on_c = device(c, client_id, clean=False)
    on_c.connect()
    assert on_c.session_present, c.log_text()
    assert pub.wait_published(pub.publish(topic, b"m2", qos=2, wait=False)) == 0
    wait_for(lambda: b"m2" in payloads(on_c), "m2")
    assert Counter(payloads(dev) + payloads(on_a) + payloads(on_c)) == {b"m1": 1, b"m2": 1}
    for x in (on_c, local, pub):
        x.close()


def test_a_message_of_an_adopted_stream_is_not_routed_again_from_the_adopters_own(
    start_node: Any, redis_server: Any
) -> None:
    """A third node's message went to b's stream and a's. b is killed; a adopts it and routes
    b's stream to the device's session, before a reads its own copy: that copy goes to a's
    own subscriber, not to the device's session again."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("adopted")
    topic = unique("adopted")
    dev = device(b, client_id, clean=True)
    dev.connect()
    dev.subscribe(topic, qos=2)
    local = client(a)
    local.subscribe(topic, qos=2)
    pub = client(a)
    until_routed(pub, dev, topic)
    b.send_signal(signal.SIGKILL)
    b.wait_exit()
    dev.close()
    entry = publish_frame(topic, b"m1", b"c.00000001\x1d1", qos=2)
    r = redis_server.client()
    try:
        r.xadd(STREAM + "b", {"m": entry})
        again = device(a, client_id, clean=False)
        again.connect()
        assert again.session_present, a.log_text()
        assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 10) is not None
        wait_for(lambda: b"m1" in payloads(again), "m1 from b's stream")
        r.xadd(STREAM + "a", {"m": entry})  # a's own copy, read only now
    finally:
        r.close()
    wait_for(lambda: b"m1" in payloads(local), "a's own copy")
    assert pub.wait_published(pub.publish(topic, b"m2", qos=2, wait=False)) == 0
    wait_for(lambda: b"m2" in payloads(again) and b"m2" in payloads(local), "m2")
    assert Counter(payloads(again)) == {b"m1": 1, b"m2": 1}
    assert Counter(payloads(local)) == {b"m1": 1, b"m2": 1}
    for c in (again, local, pub):
        c.close()


def test_a_node_woken_past_its_lease_does_not_send_what_a_moved_session_published(
    start_node: Any,
) -> None:
    """The publisher's QoS 2 message reaches b while b is frozen (SIGSTOP) past its lease;
    its session is adopted by a, where the publisher sends the message again (b never
    answered it). When b wakes (SIGCONT) it reads the stale copy: the session is a's now,
    so b does not send it on, and the subscriber gets the message once."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("stale-pub")
    topic = unique("stale")
    sub = client(a)
    sub.subscribe(topic, qos=2)
    first = device(b, client_id, clean=True)
    first.connect()
    until_routed(first, sub, topic)
    b.send_signal(signal.SIGSTOP)
    try:
        first.publish(topic, b"m1", qos=2, wait=False)  # (b reads it when it wakes)
        moved = None
        deadline = time.monotonic() + 60
        while moved is None:  # b's lease runs out, then a adopts it
            again = device(a, client_id, clean=False)
            if again.connect(expect_success=False) == 0:
                moved = again
                break
            assert time.monotonic() < deadline, "a never adopted b"
            again.close()
            time.sleep(1)
        assert moved.session_present, a.log_text()
        assert moved.wait_published(moved.publish(topic, b"m1", qos=2, wait=False)) == 0
        wait_for(lambda: b"m1" in payloads(sub), "m1, sent again on a")
    finally:
        b.send_signal(signal.SIGCONT)
    assert b.wait_for_log(r"reachable again; routes resynchronised", 30) is not None
    assert moved.wait_published(moved.publish(topic, b"m2", qos=2, wait=False)) == 0
    wait_for(lambda: b"m2" in payloads(sub), "m2")
    assert Counter(payloads(sub)) == {b"m1": 1, b"m2": 1}
    for c in (moved, sub):
        c.close()

"""Copies and gaps between nodes, on real node processes and a real redis-server: a stream
entry written twice (a batch sent again after Redis took it and its answer was lost) or read
twice (a node killed between committing a delivery and acknowledging the entry) delivers a
QoS 2 message once; a session handed over gets the messages that reached its new node before
it did and its old node only after it had gone (sequence.py), and a forward from its old node
that comes after its new node let go of what it routed is not routed again; a node woken past
its lease does not send what the clients of sessions adopted meanwhile published there."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
from support.clients import RawClient, connect_packet, prop, subscribe_packet, unique, wait_for
from support.cluster_clients import (
    SHORT_LEASE,
    acknowledged,
    adopted,
    arrives,
    client,
    close_all,
    counted,
    device,
    kill,
    moved,
    payloads,
    resumed,
    routed,
    subscribed,
    subscriber,
    until_routed,
)

from mqttbroker.cluster.sequence import REPLAY_MAX, REPLAY_SECONDS

pytestmark = pytest.mark.needs_redis

STREAM = "mqttbroker:stream:"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def publish_frame(
    topic: str, payload: bytes, ident: bytes, qos: int = 1, sent: bytes = b""
) -> bytes:
    """A stream entry holding one QoS 1/2 message for a node's plain subscribers, as a node
    frames it (node.py): ``1<id>\\x1e\\0<MQTT 5 PUBLISH>``, after its length; with ``sent``
    (the nodes its node sent it to), ``1<id>\\x1e<sent>\\x1c\\0<MQTT 5 PUBLISH>``."""
    name = topic.encode()
    body = len(name).to_bytes(2, "big") + name + (1).to_bytes(2, "big") + b"\0" + payload
    packet = bytes([0x30 | qos << 1]) + _varint(len(body)) + body
    frame = b"1" + ident + b"\x1e" + (sent + b"\x1c" if sent else b"") + b"\0" + packet
    return len(frame).to_bytes(4, "big") + frame


def read_up_to(r: Any, stream: str, last: Any, what: str) -> None:
    """Wait until the node reading ``stream`` has read it up to ``last`` and acknowledged
    every entry (routed, or kept for a session on its way)."""

    def read() -> bool:
        [group] = r.xinfo_groups(stream)
        return bool(group["last-delivered-id"] == last and not group["pending"])

    wait_for(read, what)


def entries_with(r: Any, stream: str, payload: bytes) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in r.xrange(stream) if payload in fields[b"m"]]


def test_a_stream_entry_written_twice_delivers_a_qos2_message_once(
    start_node: Any, redis_server: Any
) -> None:
    a = start_node("a")
    b = start_node("b")
    topic = unique("twice")
    sub = subscriber(b, topic, 2)
    pub = client(a)
    until_routed(pub, sub, topic)
    acknowledged(pub, topic, [b"m1"], 2)
    arrives(b"m1", sub)
    with redis_server.client() as r:
        [entry] = entries_with(r, STREAM + "b", b"m1")
        r.xadd(STREAM + "b", entry)  # the same batch again: its first answer was lost
    acknowledged(pub, topic, [b"m2"], 2)
    arrives(b"m2", sub)
    assert counted(sub) == {b"m1": 1, b"m2": 1}
    close_all(sub, pub)


def test_a_killed_nodes_entry_its_session_holds_is_not_routed_to_it_again(
    start_node: Any, redis_server: Any
) -> None:
    """b routed m1 to the device's session and was killed before acknowledging the entry
    (here: the entry put back as unread). a adopts b: the session in Redis holds m1 (or had
    it delivered), and what b wrote of what it routed says so: m1 is not delivered again."""
    a = start_node("a")
    b = start_node("b")
    client_id, topic, dev, pub = routed(b, a, 2, "held")
    acknowledged(pub, topic, [b"m1"], 2)
    arrives(b"m1", dev)
    with redis_server.client() as r:
        wait_for(lambda: bool(r.hgetall("mqttbroker:seen:b")), "b's counters in Redis")
        [entry] = entries_with(r, STREAM + "b", b"m1")
        kill(b)
        r.xadd(STREAM + "b", entry)  # not acknowledged when b died
    dev.close()
    again = resumed(a, client_id)
    assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 10) is not None
    acknowledged(pub, topic, [b"m2"], 2)
    arrives(b"m2", again)
    assert counted(dev, again) == {b"m1": 1, b"m2": 1}
    close_all(again, pub)


def test_a_session_handed_over_gets_what_its_new_node_routed_before_it_came(
    start_node: Any, redis_server: Any
) -> None:
    """A message from a third node reaches b's stream and a's; b routes it at once (to its own
    subscriber), a would only later. The device moves from a to b meanwhile: a's answer says
    a had routed none of that node's messages, so b routes it the message it routed before
    the session came (a, reading it later, has no session for it any more)."""
    a = start_node("a")
    b = start_node("b")
    client_id, topic, dev, pub = routed(a, b, 1, "gap")
    local = subscriber(b, topic, 1)
    with redis_server.client() as r:
        # (a third node's message: for b's stream; a's copy is not read yet)
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"gap", b"c.00000001\x1d1")})
        wait_for(lambda: b"gap" in payloads(local), "b to route the message")
        dev.close()
        again = resumed(b, client_id)
        r.xadd(STREAM + "a", {"m": publish_frame(topic, b"gap", b"c.00000001\x1d1")})
    wait_for(lambda: b"gap" in payloads(again), "the message b routed before the session came")
    pub.publish(topic, b"last", qos=1)
    wait_for(lambda: b"last" in payloads(again), "the last one")
    assert counted(dev, again) == {b"gap": 1, b"last": 1}
    close_all(again, local, pub)


def test_what_the_old_node_routes_after_a_hand_over_is_forwarded_to_the_session(
    start_node: Any, redis_server: Any
) -> None:
    """b has no subscriber of the topic: a publisher's node that has not heard of b's new
    route yet sends to a only. a, the session gone to b, forwards it there."""
    b = start_node("b")
    _, topic, _, again = moved(start_node("a"), b, 1, "fwd")
    with redis_server.client() as r:
        # (a third node's message, sent before it heard that b has the route now)
        r.xadd(STREAM + "a", {"m": publish_frame(topic, b"late", b"c.00000001\x1d1")})
    wait_for(lambda: b"late" in payloads(again), "the message a forwarded")
    pub = client(b)
    pub.publish(topic, b"last", qos=1)
    wait_for(lambda: b"last" in payloads(again), "the last one")
    assert counted(again) == {b"late": 1, b"last": 1}
    close_all(again, pub)


def test_a_session_back_on_its_old_node_gets_no_forwarded_message_twice(
    start_node: Any, redis_server: Any
) -> None:
    """As above, and the device moves back to a within REPLAY_SECONDS. a routed the message
    while the session was away (forwarded to b, which routed it to the session there; b
    never had a copy of its own): b's answer says which forwards the session got, so a does
    not route that message to it again with what it routed while it was away."""
    a = start_node("a")
    client_id, topic, dev, there = moved(a, start_node("b"), 2, "back")
    frame = publish_frame(topic, b"m1", b"c.00000001\x1d1", qos=2, sent=b"a")
    with redis_server.client() as r:
        r.xadd(STREAM + "a", {"m": frame})  # (sent to a alone)
    arrives(b"m1", there)
    there.close()
    back = resumed(a, client_id)
    pub = client(a)
    acknowledged(pub, topic, [b"m2"], 2)
    arrives(b"m2", back)
    assert counted(dev, there, back) == {b"m1": 1, b"m2": 1}
    close_all(back, pub)


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
    client_id, topic, dev, pub = routed(b, c, 2, "moved")
    local = subscriber(c, topic, 2)
    acknowledged(pub, topic, [b"m1"], 2)
    arrives(b"m1", dev, local)
    with redis_server.client() as r:
        wait_for(lambda: bool(r.hgetall("mqttbroker:seen:b")), "b's counters in Redis")
    kill(b)
    dev.close()
    on_a = resumed(a, client_id)
    on_a.close()
    on_c = resumed(c, client_id)
    acknowledged(pub, topic, [b"m2"], 2)
    arrives(b"m2", on_c)
    assert counted(dev, on_a, on_c) == {b"m1": 1, b"m2": 1}
    close_all(on_c, local, pub)


def test_a_session_adopted_long_before_its_next_move_gets_no_message_twice(
    start_node: Any, redis_server: Any
) -> None:
    """As above, but the device moves on more than REPLAY_SECONDS after a adopted its
    session, to c, which routed its own copy of m1 (another origin's) only lately: c read
    its stream late (frozen, Redis away, or keeping what it routed while another session was
    on its way to it). a's answer still says that the session got m1 on b, so c does not
    route m1 to it again."""
    a = start_node("a")
    b = start_node("b")
    c = start_node("c")
    client_id = unique("stay")
    topic = unique("stay")
    dev = subscribed(b, client_id, topic, 2)
    local = subscriber(c, topic, 2)
    frame = publish_frame(topic, b"m1", b"x.00000001\x1d1", qos=2)
    with redis_server.client() as r:
        r.xadd(STREAM + "b", {"m": frame})
        arrives(b"m1", dev)
        wait_for(lambda: r.hget("mqttbroker:seen:b", "x.00000001") == b"1", "b's counters in Redis")
        kill(b)
        dev.close()
        on_a = resumed(a, client_id)
        assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 10) is not None
        time.sleep(REPLAY_SECONDS + 1)
        r.xadd(STREAM + "c", {"m": frame})
        arrives(b"m1", local)
    on_a.close()
    on_c = resumed(c, client_id)
    pub = client(c)
    acknowledged(pub, topic, [b"m2"], 2)
    arrives(b"m2", on_c)
    assert counted(dev, on_a, on_c) == {b"m1": 1, b"m2": 1}
    close_all(on_c, local, pub)


def test_a_message_of_an_adopted_stream_is_not_routed_again_from_the_adopters_own(
    start_node: Any, redis_server: Any
) -> None:
    """A third node's message went to b's stream and a's. b is killed; a adopts it and routes
    b's stream to the device's session, before a reads its own copy: that copy goes to a's
    own subscriber, not to the device's session again."""
    a = start_node("a")
    b = start_node("b")
    client_id, topic, dev, pub = routed(b, a, 2, "adopted")
    local = subscriber(a, topic, 2)
    kill(b)
    dev.close()
    entry = publish_frame(topic, b"m1", b"c.00000001\x1d1", qos=2)
    with redis_server.client() as r:
        r.xadd(STREAM + "b", {"m": entry})
        again = resumed(a, client_id)
        assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 10) is not None
        wait_for(lambda: b"m1" in payloads(again), "m1 from b's stream")
        r.xadd(STREAM + "a", {"m": entry})  # a's own copy, read only now
    wait_for(lambda: b"m1" in payloads(local), "a's own copy")
    acknowledged(pub, topic, [b"m2"], 2)
    arrives(b"m2", again, local)
    assert counted(again) == {b"m1": 1, b"m2": 1}
    assert counted(local) == {b"m1": 1, b"m2": 1}
    close_all(again, local, pub)


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
    sub = subscriber(a, topic, 2)
    first = device(b, client_id)
    first.connect()
    until_routed(first, sub, topic)
    b.send_signal(signal.SIGSTOP)
    try:
        first.publish(topic, b"m1", qos=2, wait=False)  # (b reads it when it wakes)
        moved = adopted(a, client_id)  # once b's lease has run out
        acknowledged(moved, topic, [b"m1"], 2)
        wait_for(lambda: b"m1" in payloads(sub), "m1, sent again on a")
    finally:
        b.send_signal(signal.SIGCONT)
    assert b.wait_for_log(r"reachable again; routes resynchronised", 30) is not None
    acknowledged(moved, topic, [b"m2"], 2)
    arrives(b"m2", sub)
    assert counted(sub) == {b"m1": 1, b"m2": 1}
    close_all(moved, sub)


def test_a_node_woken_past_its_lease_does_not_replay_what_it_did_not_send(
    start_node: Any, redis_server: Any
) -> None:
    """b routes the publisher's m1 (it keeps it, for sessions coming) but freezes before
    sending it on: Redis is stopped a moment, with m0's write in flight and m1's waiting
    behind it. a adopts the publisher's session, where m1 is sent again and reaches the
    subscriber. b wakes and drops m1 (its publisher's session moved); when the subscriber's
    session then comes to b, b does not route it m1 from what it kept. (A lease of 2 s:
    all of it within the 10 s b keeps what it routed.)"""
    a = start_node("a", config=SHORT_LEASE)
    b = start_node("b", config=SHORT_LEASE)
    client_id = unique("unsent-pub")
    topic = unique("unsent")
    sub_id = unique("unsent-sub")
    sub = subscribed(a, sub_id, topic, 2)
    first = device(b, client_id)
    first.connect()
    until_routed(first, sub, topic)
    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        first.publish(topic, b"m0", qos=2, wait=False)
        time.sleep(0.3)  # (its write in flight)
        first.publish(topic, b"m1", qos=2, wait=False)
        time.sleep(0.3)  # (routed, its write waiting)
        b.send_signal(signal.SIGSTOP)
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    try:
        arrives(b"m0", sub)
        moved = adopted(a, client_id)  # once b's lease has run out
        acknowledged(moved, topic, [b"m1"], 2)
        arrives(b"m1", sub)
    finally:
        b.send_signal(signal.SIGCONT)
    assert b.wait_for_log(r"reachable again; routes resynchronised", 30) is not None
    sub.close()
    again = resumed(b, sub_id)
    acknowledged(moved, topic, [b"m2"], 2)
    arrives(b"m2", again)
    assert counted(sub, again) == {b"m0": 1, b"m1": 1, b"m2": 1}
    close_all(moved, again)


def publishes(data: bytes) -> list[bytes]:
    """The payloads of the MQTT 5 PUBLISH packets (no properties) in ``data``, whole packets."""
    found = []
    pos = 0
    while pos < len(data):
        first = data[pos]
        length, body = 0, pos + 1
        shift = 0
        while True:
            byte = data[body]
            length |= (byte & 0x7F) << shift
            body += 1
            shift += 7
            if not byte & 0x80:
                break
        end = body + length
        if first >> 4 == 3:
            start = body + 2 + int.from_bytes(data[body : body + 2], "big")
            start += 2 if first & 0x06 else 0  # (the packet id)
            found.append(data[start + 1 : end])  # (after the properties' length, 0)
        pos = end
    return found


def test_a_qos2_message_leaves_for_its_subscriber_once_redis_has_its_packet_id(
    start_node: Any, redis_server: Any
) -> None:
    """b routes a QoS 2 message to the device's session, and its write of that delivery is
    refused (b's lease is another's now: fenced). Had b sent the PUBLISH at once, the device
    would have it from b, then from a, which adopts b and routes b's stream to the session
    (nothing in Redis says it went) under another packet id: twice. It leaves b only once
    Redis has it under its packet id, so here never from b, and once from a."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("held")
    topic = unique("held")
    raw = RawClient(b.host, b.port)
    expiry = prop(0x11, (3600).to_bytes(4, "big"))
    raw.send(connect_packet(client_id, properties=expiry))
    raw.read_packet()  # CONNACK
    raw.send(subscribe_packet(1, [(topic, 2)]))
    raw.read_packet()  # SUBACK
    r = redis_server.client()
    try:
        pipe = r.pipeline(transaction=True)
        pipe.set("mqttbroker:node:b", "another-token")  # b's next write is fenced
        pipe.xadd(STREAM + "b", {"m": publish_frame(topic, b"m1", b"c.00000001\x1d1", qos=2)})
        pipe.execute()
        assert b.wait_for_log(r"was fenced|is held by another node", 10) is not None
        kill(b)
        from_b = publishes(raw.read_until_closed())
        r.delete("mqttbroker:node:b")  # (b is gone)
    finally:
        r.close()
        raw.close()
    again = resumed(a, client_id)
    arrives(b"m1", again)  # (from b's stream)
    pub = client(a)
    acknowledged(pub, topic, [b"m2"], 2)
    arrives(b"m2", again)
    assert from_b == []
    assert counted(again) == {b"m1": 1, b"m2": 1}
    close_all(again, pub)


def test_an_adopted_session_gets_its_gone_nodes_messages_before_newer_ones(
    start_node: Any,
) -> None:
    """A publisher on a publishes without a pause while b, which has the device's session,
    is killed and the device comes back on a. a adopts b: the messages b's stream holds for
    the session (and a's own on their way there) reach it before any a routes to it after,
    so the device gets every message once and in the order published (MQTT 4.6)."""
    a = start_node("a")
    b = start_node("b")
    client_id, topic, dev, pub = routed(b, a, 1, "order")
    dev.close()
    kill(b)
    count = 900  # (fewer than a session queues while its client is away)
    sent: list[Any] = []

    def publish() -> None:
        for n in range(count):
            sent.append(pub.publish(topic, str(n).encode(), qos=1, wait=False))
            time.sleep(0.001)

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        wait_for(lambda: len(sent) > 100, "messages for b's stream")
        again = resumed(a, client_id)
    finally:
        publisher.join()
    assert all(pub.wait_published(info) == 0 for info in sent)
    wait_for(lambda: len(set(payloads(again))) == count, "every message")
    got = [int(p) for p in payloads(again)]
    first = list(dict.fromkeys(got))  # (first deliveries, in the order they came)
    assert first == sorted(first), [
        (x, y) for x, y in zip(first, first[1:], strict=False) if x > y
    ][:5]
    close_all(again, pub)


def test_a_message_read_by_the_new_node_after_the_session_came_is_not_routed_again(
    start_node: Any, redis_server: Any
) -> None:
    """A third node's QoS 2 message reaches a's stream and b's; a routes it to the device's
    session, and the device moves to b before b has read its own copy (b is behind). a's
    answer says the session got it: b, reading its copy now, does not route it again."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("late")
    topic = unique("late")
    dev = subscribed(a, client_id, topic, 2)
    m1 = publish_frame(topic, b"m1", b"c.00000001\x1d1", qos=2)
    r = redis_server.client()
    try:
        r.xadd(STREAM + "a", {"m": m1})
        arrives(b"m1", dev)
        dev.close()
        again = resumed(b, client_id)
        r.xadd(STREAM + "b", {"m": m1})  # b's own copy, read only now
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"m2", b"c.00000001\x1d2", qos=2)})
    finally:
        r.close()
    arrives(b"m2", again)
    assert counted(dev, again) == {b"m1": 1, b"m2": 1}
    again.close()


def test_a_message_the_new_node_reads_long_after_the_session_came_is_not_routed_again(
    start_node: Any, redis_server: Any
) -> None:
    """As above, but b reads its own copies (of m1 and m2) more than REPLAY_SECONDS after the
    session came (its stream that far behind): the counters the session came with still say
    it got both, and b lets go of them only once it has read that far itself."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("later")
    topic = unique("later")
    dev = subscribed(a, client_id, topic, 2)
    frames = [publish_frame(topic, b"m%d" % n, b"c.00000001\x1d%d" % n, qos=2) for n in (1, 2, 3)]
    r = redis_server.client()
    try:
        for frame in frames[:2]:
            r.xadd(STREAM + "a", {"m": frame})
        arrives(b"m2", dev)
        dev.close()
        again = resumed(b, client_id)
        time.sleep(REPLAY_SECONDS + 1)
        for frame in frames:  # b's own copies, read only now
            r.xadd(STREAM + "b", {"m": frame})
    finally:
        r.close()
    arrives(b"m3", again)
    assert counted(dev, again) == {b"m1": 1, b"m2": 1, b"m3": 1}
    again.close()


def forward_frame(
    client_id: str, topic: str, payload: bytes, ident: bytes, qos: int = 1, sent: bytes = b""
) -> bytes:
    """A stream entry holding a QoS 1/2 message forwarded by the node a session left for that
    session (node.py ``_forward``): ``f<id>\\x1e<client id>\\0<MQTT 5 PUBLISH>``; with ``sent``
    (the nodes the message's own node sent it to), ``f<id>\\x1e<sent>\\x1c<client id>...``."""
    frame = publish_frame(topic, payload, ident, qos)[4:]
    named = client_id.encode() if not sent else sent + b"\x1c" + client_id.encode()
    frame = b"f" + frame[1:].replace(b"\x1e\0", b"\x1e" + named + b"\0", 1)
    return len(frame).to_bytes(4, "big") + frame


def test_what_the_old_node_forwarded_before_the_session_came_goes_first(
    start_node: Any, redis_server: Any
) -> None:
    """b had no route for the topic: a third node's m1 went to a only, which forwarded it to
    b for the device's session, on its way there; m2, published once that node knew b's
    route, reached b directly. Both came before the session did: it gets m1, then m2."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("early")
    topic = unique("early")
    subscribed(a, client_id, topic, 1).close()
    r = redis_server.client()
    try:
        r.xadd(STREAM + "b", {"m": forward_frame(client_id, topic, b"m1", b"c.00000001\x1d1")})
        last = r.xadd(STREAM + "b", {"m": publish_frame(topic, b"m2", b"c.00000001\x1d2")})

        read_up_to(r, STREAM + "b", last, "b to read both")
    finally:
        r.close()
    again = resumed(b, client_id)
    wait_for(lambda: len(payloads(again)) == 2, "m1 and m2")
    assert payloads(again) == [b"m1", b"m2"]
    again.close()


def test_an_adoption_that_fails_reading_the_stream_keeps_the_sessions_it_took(
    start_node: Any, redis_server: Any
) -> None:
    """a takes b's sessions (their client ids are a's then), and reading b's stream fails
    (here: not a stream). The sessions are built all the same: the device, refused once
    (0x88) and trying again, finds its session on a, never an empty one."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("failed")
    topic = unique("failed")
    subscribed(b, client_id, topic, 1).close()
    kill(b)
    r = redis_server.client()
    try:
        r.delete(STREAM + "b")
        r.set(STREAM + "b", b"not a stream")
    finally:
        r.close()
    for _ in range(10):
        again = device(a, client_id, clean=False)
        if again.connect(expect_success=False) == 0:
            break
        again.close()
    assert again.session_present, a.log_text()
    again.close()


def test_a_forward_that_waited_for_a_session_is_not_routed_to_it_if_it_had_it(
    start_node: Any, redis_server: Any
) -> None:
    """A node forwards to b what it routes for a session that went to b; the session moved on
    meanwhile (b died and a adopted it, say) and got the message on a. When it comes to b
    again, the forward waiting there is not routed to it: a's answer says it had it."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("stale-fwd")
    topic = unique("stale-fwd")
    dev = subscribed(a, client_id, topic, 2)
    m1 = b"c.00000001\x1d1"
    with redis_server.client() as r:
        r.xadd(STREAM + "a", {"m": publish_frame(topic, b"m1", m1, qos=2)})
        arrives(b"m1", dev)
        last = r.xadd(STREAM + "b", {"m": forward_frame(client_id, topic, b"m1", m1, 2)})

        read_up_to(r, STREAM + "b", last, "b to read the forward")
        dev.close()
        again = resumed(b, client_id)
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"m2", b"c.00000001\x1d2", qos=2)})
    arrives(b"m2", again)
    assert counted(dev, again) == {b"m1": 1, b"m2": 1}
    again.close()


def test_a_message_forwarded_for_two_sessions_that_moved_reaches_both(
    start_node: Any, redis_server: Any
) -> None:
    """Two devices move from a to b, which has no subscriber of their topic otherwise: a
    third node's message reaches a only (it has not heard of b's route yet; its frame says
    so), and a forwards it to b once for each session. b routes each forward to its
    session: both get it."""
    a = start_node("a")
    b = start_node("b")
    topic = unique("both")
    ids = [unique("both"), unique("both")]
    for client_id in ids:
        subscribed(a, client_id, topic, 1).close()
    moved = [resumed(b, client_id) for client_id in ids]
    with redis_server.client() as r:
        r.xadd(STREAM + "a", {"m": publish_frame(topic, b"m1", b"c.00000001\x1d1", sent=b"a")})
    arrives(b"m1", *moved)
    close_all(*moved)


def test_a_late_forward_is_routed_once_whether_or_not_the_node_had_the_message(
    start_node: Any, redis_server: Any
) -> None:
    """The device moved from a to b; b routed m1 to it (its node c sent m1 to a and b). a
    forwards m1 to b for the session (a routed it too, after the session left) but the
    forward comes only once b no longer keeps m1 among what it routed lately (a node woken
    from a pause sends what it queued before, 15 s late; here: REPLAY_MAX newer messages
    pushed m1 out). The forward says c sent m1 to b: b had it, and does not route it again
    (no QoS 2 message twice). m0, older still, c sent to a only (before c knew of b's
    route): its forward comes as late, says so, and b, which never had m0, routes it (no
    acknowledged message lost). A forward of a message b never had that does not say where
    it went, but is newer than anything b let go of, is routed too."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("forgotten")
    topic = unique("forgotten")
    subscribed(a, client_id, topic, 2).close()
    again = resumed(b, client_id)
    other = unique("other")  # (nobody's: b only counts these among what it routed)
    n = REPLAY_MAX

    def ident(counter: int) -> bytes:
        return b"c.00000001\x1d%d" % counter

    with redis_server.client() as r:
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"m1", ident(2), qos=2)})
        arrives(b"m1", again)
        newer = b"".join(publish_frame(other, b"x", ident(c), 2) for c in range(3, n + 3))
        r.xadd(STREAM + "b", {"m": newer})
        late = [(b"m1", 2, b"a,b"), (b"m0", 1, b"a"), (b"m2", n + 3, b"")]
        for payload, counter, sent in late:
            frame = forward_frame(client_id, topic, payload, ident(counter), 2, sent)
            r.xadd(STREAM + "b", {"m": frame})
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"m3", ident(n + 4), qos=2)})
    arrives(b"m3", again)
    assert counted(again) == {b"m0": 1, b"m1": 1, b"m2": 1, b"m3": 1}
    again.close()


def test_a_forward_left_in_a_killed_nodes_stream_reaches_the_session_adopted(
    start_node: Any, redis_server: Any
) -> None:
    """The device's session had just come to b; its old node forwarded b m1, which the
    publisher's node c had sent to another node only, and b was killed before reading it
    (here: the entry added once b is dead). b had routed newer messages of c (what it wrote
    it routed says 5): that does not cover a message b never had. a adopts b: the session
    gets m1, once."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("fwdgone")
    topic = unique("fwdgone")
    subscribed(b, client_id, topic, 2).close()
    with redis_server.client() as r:
        wait_for(lambda: r.sismember("mqttbroker:owned:b", client_id), "the session in Redis")
        kill(b)
        r.hset("mqttbroker:seen:b", "c.00000001", 5)
        frame = forward_frame(client_id, topic, b"m1", b"c.00000001\x1d3", 2, sent=b"x")
        r.xadd(STREAM + "b", {"m": frame})
    again = resumed(a, client_id)
    assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 10) is not None
    pub = client(a)
    acknowledged(pub, topic, [b"m2"], 2)
    arrives(b"m2", again)
    assert payloads(again) == [b"m1", b"m2"]
    close_all(again, pub)


def test_a_forward_a_killed_node_routed_is_not_routed_again_by_its_adopter(
    start_node: Any, redis_server: Any
) -> None:
    """b routed a forward of m1 to the device's session (offline: queued) and wrote it with
    the session, then was killed before acknowledging the entry (here: the entry put back as
    unread). a adopts b: the session's hash says m1 was forwarded to it there, and m1 is
    delivered once (QoS 2)."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("fwdheld")
    topic = unique("fwdheld")
    subscribed(b, client_id, topic, 2).close()
    frame = forward_frame(client_id, topic, b"m1", b"c.00000001\x1d3", 2, sent=b"x")
    session = f"mqttbroker:session:{client_id}"
    with redis_server.client() as r:
        wait_for(lambda: r.sismember("mqttbroker:owned:b", client_id), "the session in Redis")
        r.xadd(STREAM + "b", {"m": frame})
        wait_for(
            lambda: any(k.startswith(b"g:") for k in r.hkeys(session)), "b to write the forward"
        )
        kill(b)
        r.xadd(STREAM + "b", {"m": frame})  # not acknowledged when b died
    again = resumed(a, client_id)
    assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 10) is not None
    pub = client(a)
    acknowledged(pub, topic, [b"m2"], 2)
    arrives(b"m2", again)
    assert counted(again) == {b"m1": 1, b"m2": 1}
    close_all(again, pub)


def test_a_forward_sent_again_later_than_the_node_remembers_is_routed_once(
    start_node: Any, redis_server: Any
) -> None:
    """A forward of m1 for the device's session at b (from the node it came from) is routed to
    it; the same forward comes again after b's memory of what it routed lately has gone (an
    outbox sending a batch again whose answer was lost, after a long cut). The session's own
    record of the forwards it got here keeps m1 from coming twice (QoS 2)."""
    b = start_node("b")
    client_id = unique("fwdtwice")
    topic = unique("fwdtwice")
    dev = subscribed(b, client_id, topic, 2)
    frame = forward_frame(client_id, topic, b"m1", b"c.00000001\x1d3", 2, sent=b"x")
    with redis_server.client() as r:
        r.xadd(STREAM + "b", {"m": frame})
        arrives(b"m1", dev)
        time.sleep(REPLAY_SECONDS + 1)  # (b's memory of forwards lasts REPLAY_SECONDS ...)
        other = forward_frame(client_id, topic, b"m2", b"c.00000001\x1d4", 2, sent=b"x")
        r.xadd(STREAM + "b", {"m": other})  # (... from the next one it adds)
        r.xadd(STREAM + "b", {"m": frame})
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"m3", b"c.00000001\x1d5", qos=2)})
    arrives(b"m3", dev)
    assert counted(dev) == {b"m1": 1, b"m2": 1, b"m3": 1}
    dev.close()


def test_a_message_the_new_node_let_go_of_before_the_session_came_is_forwarded_to_it(
    start_node: Any, redis_server: Any
) -> None:
    """c sent m1 to a and b. b routed it at once, and REPLAY_MAX newer messages made it let go
    of m1 before the device's session came to it from a, whose stream was behind (a had not
    routed m1): b cannot give the session m1 when it comes. a routes m1 after the session
    left; b's request said what b had let go of, so a forwards m1 although c sent it to b,
    and b routes it to the session (no acknowledged message lost), once."""
    a = start_node("a")
    b = start_node("b")
    client_id = unique("letgo")
    topic = unique("letgo")
    subscribed(a, client_id, topic, 2).close()
    m1 = publish_frame(topic, b"m1", b"c.00000001\x1d1", qos=2, sent=b"a,b")
    newer = b"".join(
        publish_frame(unique("other"), b"x", b"d.00000001\x1d%d" % c, 2)
        for c in range(1, REPLAY_MAX + 1)
    )
    with redis_server.client() as r:
        r.xadd(STREAM + "b", {"m": m1})
        last = r.xadd(STREAM + "b", {"m": newer})

        read_up_to(r, STREAM + "b", last, "b to route them")
        again = resumed(b, client_id)
        r.xadd(STREAM + "a", {"m": m1})
        arrives(b"m1", again)
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"m2", b"c.00000001\x1d2", 2, b"a,b")})
    arrives(b"m2", again)
    assert counted(again) == {b"m1": 1, b"m2": 1}
    again.close()


@pytest.mark.parametrize(
    "how", ["forward-passed-on", "own-copy-read-before", "own-copy-read-after"]
)
def test_a_message_the_old_node_was_never_sent_reaches_the_session(
    start_node: Any, redis_server: Any, how: str
) -> None:
    """x sent m1 to a (the device's node a moment before), not to b (x had not heard of b's
    route yet), and then m2 to b, which routed it to the device's session. The session moves
    on from b to c: b's counters in its answer cover m1, but b was never sent it (the frames
    say so), and c routes m1 to the session once (no acknowledged message lost), whether it
    comes as a's forward of it, passed on by b as it came, or as c's own copy (x sent it to
    c too, for another subscriber there), read before the session came (from what c routed
    lately) or after."""
    b = start_node("b")
    c = start_node("c")
    client_id = unique("unsent")
    topic = unique("unsent")
    dev = subscribed(b, client_id, topic, 2)
    m1 = b"x.00000001\x1d1"
    if how == "forward-passed-on":
        frame = forward_frame(client_id, topic, b"m1", m1, 2, sent=b"a")
    else:
        frame = publish_frame(topic, b"m1", m1, 2, b"a,c")
    with redis_server.client() as r:
        if how == "own-copy-read-before":
            last = r.xadd(STREAM + "c", {"m": frame})
            read_up_to(r, STREAM + "c", last, "c to route m1")
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"m2", b"x.00000001\x1d2", 2, b"b")})
        arrives(b"m2", dev)
        dev.close()
        again = resumed(c, client_id)
        if how != "own-copy-read-before":
            r.xadd(STREAM + "c", {"m": frame})
        r.xadd(STREAM + "c", {"m": publish_frame(topic, b"m3", b"x.00000001\x1d3", 2, b"c")})
    arrives(b"m3", again)
    assert counted(dev, again) == {b"m1": 1, b"m2": 1, b"m3": 1}
    again.close()


@pytest.mark.parametrize("via", [False, True], ids=["c-to-b", "c-to-d-to-b"])
def test_a_message_forwarded_to_the_session_is_not_routed_again_where_it_goes_next(
    start_node: Any, redis_server: Any, via: bool
) -> None:
    """x sent m1 to a and b (not c, the device's node, whose route it had not heard of yet),
    a forwarded it to c and c routed it to the session; then c routed x's m2 itself. The
    session moves on to b (or through d, which x never sent m1 either), and b reads its own
    copy of m1 only then: no node the session was at was sent m1, but the answer names the
    forwards it got there, and m1 is not routed to it a second time (QoS 2)."""
    b = start_node("b")
    c = start_node("c")
    client_id = unique("fwdnext")
    topic = unique("fwdnext")
    dev = subscribed(c, client_id, topic, 2)
    m1 = b"x.00000001\x1d1"
    clients = [dev]
    with redis_server.client() as r:
        r.xadd(STREAM + "c", {"m": forward_frame(client_id, topic, b"m1", m1, 2, sent=b"a,b")})
        r.xadd(STREAM + "c", {"m": publish_frame(topic, b"m2", b"x.00000001\x1d2", 2, b"c")})
        arrives(b"m2", dev)
        dev.close()
        if via:
            clients.append(resumed(start_node("d"), client_id))
            clients[-1].close()
        clients.append(resumed(b, client_id))
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"m1", m1, 2, b"a,b")})
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"m3", b"x.00000001\x1d3", 2, b"b")})
    arrives(b"m3", clients[-1])
    assert counted(*clients) == {b"m1": 1, b"m2": 1, b"m3": 1}
    clients[-1].close()


def test_a_forward_for_an_earlier_stay_coming_long_after_the_session_came_back_is_dropped(
    start_node: Any, redis_server: Any
) -> None:
    """The device's session went from c to b and came back to c. x sent m1 to a (the device's
    node before c, whose forward of it to c is late: a frozen past its lease, say) and to b,
    which routed it to the session there. The forward comes to c more than REPLAY_SECONDS
    after the session came back: b's counters, in its answer and kept for the session's stay,
    cover m1, which x sent to b, and c does not route it a second time (QoS 2)."""
    b = start_node("b")
    c = start_node("c")
    client_id = unique("staylate")
    topic = unique("staylate")
    subscribed(c, client_id, topic, 2).close()
    there = resumed(b, client_id)
    m1 = b"x.00000001\x1d1"
    with redis_server.client() as r:
        r.xadd(STREAM + "b", {"m": publish_frame(topic, b"m1", m1, 2, b"a,b")})
        arrives(b"m1", there)
        there.close()
        back = resumed(c, client_id)
        time.sleep(REPLAY_SECONDS + 1)
        r.xadd(STREAM + "c", {"m": forward_frame(client_id, topic, b"m1", m1, 2, sent=b"a,b")})
        r.xadd(STREAM + "c", {"m": publish_frame(topic, b"m2", b"x.00000001\x1d2", 2, b"c")})
    arrives(b"m2", back)
    assert counted(there, back) == {b"m1": 1, b"m2": 1}
    back.close()

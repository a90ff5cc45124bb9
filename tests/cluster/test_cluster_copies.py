"""Copies between nodes, on real node processes and a real redis-server: a stream entry
written twice (a batch sent again after Redis took it and its answer was lost) or read twice
(a node killed between committing a delivery and acknowledging the entry) delivers a QoS 2
message once (sequence.py)."""

from __future__ import annotations

import signal
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

"""Clients of a cluster's nodes (broker processes on one redis-server, started by the
``start_node`` fixture of tests/cluster/conftest.py), for the cluster tests:

- ``client``: a connected MQTT 5 client, ``subscriber``: one subscribed; ``device``: one with a
  persistent session (Session Expiry Interval an hour), not yet connected; ``subscribed``: a
  device connected with Clean Start and subscribed; ``resumed``: a device back on a node, its
  session there (Session Present 1); ``routed``: a device subscribed on one node and a
  publisher on another that has the device's route.
- ``until_routed``: publish probes until a subscriber gets one (route changes reach the other
  nodes through Redis, a moment after the SUBACK); ``payloads``: what a client got, probes left
  out; ``arrives``: wait for a payload; ``counted``: how often each payload came.
- ``acknowledged``: publish one message after the other, each acknowledged with reason 0;
  ``kill``: SIGKILL a node and reap it; ``adopted``: a device retrying on a node until that node
  has adopted its frozen node's session; ``close_all``.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple

from support.clients import MQTT_5, PahoClient, unique, wait_for

HOUR = 3600
PROBE = b"probe"
SERVER_UNAVAILABLE = 0x88
TAKEN_OVER = 0x8E
# A lease of 2 s, a node adopted 1 s after it runs out: a node killed is adopted within seconds.
SHORT_LEASE = "[cluster]\nnode_ttl = 2.0\nadopt_after = 1.0\n"


def client(node: Any, **kw: Any) -> PahoClient:
    c = PahoClient(node.host, node.port, MQTT_5, **kw)
    c.connect()
    return c


def subscriber(node: Any, topic_filter: str, qos: int) -> PahoClient:
    c = client(node)
    c.subscribe(topic_filter, qos=qos)
    return c


def device(node: Any, client_id: str, clean: bool = True) -> PahoClient:
    """A client with a persistent session (Session Expiry Interval an hour), not yet
    connected."""
    return PahoClient(node.host, node.port, MQTT_5, client_id=client_id, clean=clean, expiry=HOUR)


def subscribed(node: Any, client_id: str, topic_filter: str, qos: int) -> PahoClient:
    """A device connected to ``node`` with Clean Start, subscribed to ``topic_filter``."""
    c = device(node, client_id)
    c.connect()
    c.subscribe(topic_filter, qos=qos)
    return c


def resumed(node: Any, client_id: str) -> PahoClient:
    """The device ``client_id`` connected again, to ``node``: its session is there."""
    c = device(node, client_id, clean=False)
    c.connect()
    assert c.session_present, node.log_text()
    return c


def payloads(c: PahoClient) -> list[bytes]:
    return [m.payload for m in c.received() if m.payload != PROBE]


def arrives(payload: bytes, *clients: PahoClient) -> None:
    """Wait until ``payload`` has reached each of ``clients``."""
    wait_for(lambda: all(payload in payloads(c) for c in clients), repr(payload))


def counted(*clients: PahoClient) -> Counter[bytes]:
    """How often each payload reached ``clients`` (one device's connections, say) in all."""
    return Counter(p for c in clients for p in payloads(c))


def until_routed(pub: PahoClient, sub: PahoClient, topic: str) -> None:
    """Publish probes (QoS 0) until ``sub`` gets one: ``pub``'s node has the route."""

    def probed() -> bool:
        pub.publish(topic, PROBE)
        time.sleep(0.05)
        return any(m.payload == PROBE for m in sub.received())

    wait_for(probed, f"the route of {topic!r} to reach the publisher's node", 10)


class Routed(NamedTuple):
    client_id: str
    topic: str
    device: PahoClient
    pub: PahoClient


def routed(device_on: Any, publisher_on: Any, qos: int, name: str) -> Routed:
    """A device (client id and topic ``name`` made unique) connected to ``device_on`` with Clean
    Start and subscribed to its topic, and a publisher on ``publisher_on`` whose node has the
    route."""
    client_id = unique(name)
    topic = unique(name)
    dev = subscribed(device_on, client_id, topic, qos)
    pub = client(publisher_on)
    until_routed(pub, dev, topic)
    return Routed(client_id, topic, dev, pub)


def moved(old: Any, new: Any, qos: int, name: str) -> tuple[str, str, PahoClient, PahoClient]:
    """A device (client id and topic ``name`` made unique) subscribed on ``old`` with Clean
    Start, then connected again to ``new``, its session there: (client id, topic, its first
    connection, its second)."""
    client_id = unique(name)
    topic = unique(name)
    dev = subscribed(old, client_id, topic, qos)
    dev.close()
    return client_id, topic, dev, resumed(new, client_id)


def acknowledged(pub: PahoClient, topic: str, sent: Iterable[bytes], qos: int = 1) -> None:
    """Publish each of ``sent`` once the one before is acknowledged; each with reason 0."""
    for payload in sent:
        assert pub.wait_published(pub.publish(topic, payload, qos=qos, wait=False), 30) == 0


def kill(node: Any) -> None:
    node.send_signal(signal.SIGKILL)
    node.wait_exit()


def adopted(node: Any, client_id: str, timeout: float = 60) -> PahoClient:
    """The device ``client_id`` retrying on ``node`` once a second, as devices do, while its
    own node is frozen: refused (0x88) until ``node`` adopts that node, then resumed."""
    deadline = time.monotonic() + timeout
    while True:
        again = device(node, client_id, clean=False)
        code = again.connect(expect_success=False)
        if code == 0:
            assert again.session_present, node.log_text()
            return again
        again.close()
        assert code == SERVER_UNAVAILABLE and time.monotonic() < deadline, code
        time.sleep(1)


def close_all(*clients: PahoClient) -> None:
    for c in clients:
        c.close()

"""The ``$SYS/broker/...`` topics: the broker's counters, published as retained QoS 0 messages
every ``interval`` seconds, so that any MQTT client can watch them
(``mosquitto_sub -t '$SYS/#' -v``). They stay in memory: the durable store never sees them, and
they are not counted as retained messages. Subscribing to ``#`` does not reach them
(MQTT-4.7.2-1); ``$SYS/#`` does.

Names follow Mosquitto's where it has the figure, so that dashboards made for it work
(``uptime``, ``version``, ``bytes/...``, ``load/...``, ``clients/connected``, ``clients/total``,
``clients/disconnected``, ``messages/sent``, ``publish/messages/...``, ``store/messages/count``).
"Messages" are PUBLISH packets: ``messages/received`` (also ``publish/messages/received``)
those accepted from clients, ``messages/delivered`` (also ``messages/sent`` and
``publish/messages/sent``) those sent to subscribers (resends included; a message queued for an
offline session counts when it is sent, one dropped never); ``store/messages/count`` the
messages queued or in flight to sessions.
Bytes are MQTT bytes (inside TLS and WebSocket frames), counted by the transports per read and
per write. A ``load/.../1min``, ``5min`` or ``15min`` figure is a rate per minute, averaged
exponentially over that period, as Mosquitto's are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import __version__
from ..broker.core import Broker
from ..broker.message import Message
from ..broker.state import CONNECTED
from ..broker.stats import Snapshot

PREFIX = "$SYS/broker/"
# Name -> seconds the moving average spans.
PERIODS = {"1min": 60.0, "5min": 300.0, "15min": 900.0}


def snapshot(broker: Broker) -> Snapshot:
    """The broker's totals now, its sessions' drops counted exactly (a walk over them all)."""
    return broker.stats.snapshot(
        broker.connections, broker.stats.queue_dropped(broker.sessions.values())
    )


def totals(snap: Snapshot) -> dict[str, int]:
    """The running totals the ``load/...`` figures are rates of, by their name there."""
    return {
        "messages/received": snap.received,
        "messages/sent": snap.delivered,
        "publish/received": snap.received,
        "publish/sent": snap.delivered,
        "bytes/received": snap.bytes_received,
        "bytes/sent": snap.bytes_sent,
        "connections": snap.connects,
    }


def stats(broker: Broker, snap: Snapshot, uptime: float) -> dict[str, Any]:
    """The broker's counters, by the name they are published under (the loads aside)."""
    sessions = broker.sessions.values()
    router = broker.router
    offline = sum(1 for s in sessions if s.connection is None)
    sent = snap.delivered
    queued = sum(len(s.queue) for s in sessions)
    inflight = sum(len(s.inflight) for s in sessions)
    dropped = snap.queue_dropped
    return {
        "version": f"mqttbroker version {__version__}",
        "uptime": f"{int(uptime)} seconds",
        "clients/connected": sum(1 for c in broker.connections if c.state == CONNECTED),
        "clients/total": len(broker.sessions),  # Mosquitto: connected and persistent
        "clients/disconnected": offline,
        "sessions/total": len(broker.sessions),
        "sessions/offline": offline,
        "subscriptions/count": router.trie.count,
        "retained messages/count": len(router.retained),
        "messages/received": snap.received,
        "messages/delivered": sent,
        "messages/sent": sent,
        "messages/queued": queued,
        "messages/inflight": inflight,
        "messages/dropped": dropped,
        "publish/messages/received": snap.received,
        "publish/messages/sent": sent,
        "publish/messages/dropped": dropped,
        "store/messages/count": queued + inflight,
        "messages/denied": snap.denied,
        "connections/refused": snap.refused,
        "bytes/received": snap.bytes_received,
        "bytes/sent": snap.bytes_sent,
    }


class SysTree:
    def __init__(self, broker: Broker, interval: float) -> None:
        self.broker = broker
        self.interval = interval
        self.started = broker.clock()
        self._next = 0.0
        self._sampled_at = self.started
        self._totals = totals(snapshot(broker))
        # load name ("messages/received/1min") -> messages (bytes, ...) per minute
        self.loads = {f"{name}/{period}": 0.0 for name in self._totals for period in PERIODS}
        # More figures, by name under $SYS/broker/ (the integrations' status).
        self.sources: list[Callable[[], dict[str, Any]]] = []

    def _sample(self, snap: Snapshot, now: float) -> None:
        """Fold the counts since the last sample into the moving averages."""
        elapsed = now - self._sampled_at
        if elapsed <= 0:
            return
        current = totals(snap)
        for name, total in current.items():
            rate = (total - self._totals[name]) * 60.0 / elapsed
            for period, span in PERIODS.items():
                key = f"{name}/{period}"
                keep = math.exp(-elapsed / span)
                self.loads[key] = rate + keep * (self.loads[key] - rate)
        self._totals = current
        self._sampled_at = now

    def tick(self) -> None:
        """Publish the counters if ``interval`` has passed since the last time."""
        if not self.interval:
            return
        broker = self.broker
        now = broker.clock()
        if now < self._next:
            return
        self._next = now + self.interval
        snap = snapshot(broker)
        self._sample(snap, now)
        figures = stats(broker, snap, now - self.started)
        figures.update((f"load/{key}", f"{load:.2f}") for key, load in self.loads.items())
        for source in self.sources:
            figures.update(source())
        router = broker.router
        for name, value in figures.items():
            topic = PREFIX + name
            message = Message(topic, str(value).encode(), 0, True)
            match = router.lookup(topic)
            if match is not None:
                router.publish(message, match, None, now)

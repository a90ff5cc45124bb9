"""The ``$SYS/broker/...`` topics: the broker's counters, published as retained QoS 0 messages
every ``interval`` seconds, so that any MQTT client can watch them
(``mosquitto_sub -t '$SYS/#' -v``). They stay in memory: the durable store never sees them.
Subscribing to ``#`` does not reach them (MQTT-4.7.2-1); ``$SYS/#`` does."""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..broker.core import Broker
from ..broker.message import Message

PREFIX = "$SYS/broker/"


def stats(broker: Broker) -> dict[str, Any]:
    """The broker's counters, by the name they are published under."""
    sessions = broker.sessions.values()
    router = broker.router
    return {
        "version": f"mqttbroker {__version__}",
        "clients/connected": len(broker.connections),
        "sessions/total": len(broker.sessions),
        "sessions/offline": sum(1 for s in sessions if s.connection is None),
        "subscriptions/count": router.trie.count,
        "retained messages/count": len(router.retained),
        "messages/received": broker.received,
        "messages/delivered": router.delivered,
        "messages/queued": sum(len(s.queue) for s in sessions),
        "messages/inflight": sum(len(s.inflight) for s in sessions),
        "messages/dropped": sum(s.dropped for s in sessions),
        "messages/denied": broker.denied,
        "connections/refused": broker.refused,
    }


class SysTree:
    def __init__(self, broker: Broker, interval: float) -> None:
        self.broker = broker
        self.interval = interval
        self._next = 0.0

    def tick(self) -> None:
        """Publish the counters if ``interval`` has passed since the last time."""
        if not self.interval:
            return
        broker = self.broker
        now = broker.clock()
        if now < self._next:
            return
        self._next = now + self.interval
        router = broker.router
        for name, value in stats(broker).items():
            topic = PREFIX + name
            message = Message(topic, str(value).encode(), 0, True)
            match = router.lookup(topic)
            if match is not None:
                router.publish(message, match, None, now)

"""Integrations with the world beyond MQTT clients: bridges to other brokers (bridge.py) and
webhooks (webhooks.py), both sinks of the broker (broker/sink.py), configured by ``[[bridge]]``
and ``[[webhook]]`` sections (read by mqttbroker.config)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from ..broker.message import Message
from ..broker.sink import retire

if TYPE_CHECKING:
    from ..broker.core import Broker
    from ..config import Config
    from .bridge import Bridge
    from .webhooks import Webhook


class Integrations:
    """Every configured bridge and webhook of one broker. Build after the store is loaded (their
    sessions and queues are restored by then), ``start()`` once the event loop runs."""

    def __init__(self, broker: Broker, config: Config) -> None:
        from .bridge import Bridge
        from .webhooks import Webhook

        # Names this broker in the user property that marks bridged messages (loop prevention).
        broker_id = uuid.uuid4().hex[:16]
        announce(broker, broker_id)
        self.bridges: list[Bridge] = [Bridge(broker, c, broker_id) for c in config.bridges]
        self.webhooks: list[Webhook] = [Webhook(broker, c) for c in config.webhooks]
        self.sinks: list[Bridge | Webhook] = [*self.bridges, *self.webhooks]
        retire(broker, {sink.session.client_id for sink in self.sinks})

    def start(self) -> None:
        for sink in self.sinks:
            sink.start()

    async def stop(self) -> None:
        for sink in self.sinks:
            await sink.stop()

    def status(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{"bridges": {name: Bridge.status()}, "webhooks": {name: Webhook.status()}}``."""
        return {
            "bridges": {b.name: b.status() for b in self.bridges},
            "webhooks": {w.name: w.status() for w in self.webhooks},
        }

    def sys_figures(self) -> dict[str, Any]:
        """``$SYS/broker/bridges/<name>/<figure>`` and ``.../webhooks/<name>/<figure>``."""
        figures: dict[str, Any] = {}
        for kind, sinks in self.status().items():
            for name, status in sinks.items():
                for key, value in status.items():
                    if isinstance(value, bool):
                        value = int(value)
                    elif key == "since":
                        value = int(value)
                    figures[f"{kind}/{name}/{key}"] = value
        return figures


def announce(broker: Broker, broker_id: str) -> None:
    """This broker's id as the retained ``$SYS/broker/id``: the bridges of other brokers of
    ours read it to recognise messages that were here already (see bridge.py)."""
    from .bridge import ID_TOPIC

    match = broker.router.lookup(ID_TOPIC)
    assert match is not None
    broker.router.publish(Message(ID_TOPIC, broker_id.encode(), 0, True), match, None, 0.0)

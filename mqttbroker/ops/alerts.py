"""Stuck sessions, and the figures that need a walk over every session or connection.

The age of a session's oldest queued message is the alarm that matters for a slow consumer: a
small backlog can be hours old. Each queued Delivery records when it joined its session's queue
(``Delivery.queued_at``) and the queue is in order, so a session's oldest age is
``now - queue[0].queued_at``.

:class:`Survey` walks the sessions and connections once (at most once a second, however often
``/metrics`` is scraped or the dashboard polls) and keeps the totals: sessions online and
offline, queued and in-flight messages, connections per listener, the oldest queued age over all
sessions, and which sessions are stuck. The walk also drives the alarms
(``[alerts] oldest_queued_age``, seconds; 0: off): a session whose oldest queued message is older
is logged once when it becomes stuck and once when it recovers, counted, and published as a
``$SYS/broker/alerts/stuck/<client id>`` event (JSON, not retained).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..broker.core import Broker
from ..broker.message import Message
from ..broker.session import Session
from ..broker.state import CONNECTED

log = logging.getLogger("mqttbroker.alerts")

ALERT_PREFIX = "$SYS/broker/alerts/stuck/"
SURVEY_INTERVAL = 1.0  # seconds a survey's figures are reused


def oldest_queued_age(session: Session, now: float) -> float:
    """Seconds the session's oldest queued message has waited (0: nothing queued)."""
    queue = session.queue
    return now - queue[0].queued_at if queue else 0.0


@dataclass(slots=True)
class Figures:
    at: float = float("-inf")
    sessions_online: int = 0
    sessions_offline: int = 0
    queued: int = 0
    inflight: int = 0
    dropped: int = 0
    oldest_age: float = 0.0
    connections: dict[str, int] = field(default_factory=dict)  # listener name -> connected
    stuck: dict[str, float] = field(default_factory=dict)  # client id -> oldest queued age


def listener_label(index: int) -> str:
    return f"listener[{index}]"


class Survey:
    """The figures of one walk, and the stuck-session alarms. ``listeners``: the configured
    listeners, whose labels (``listener[0]``...) name the connections' listeners."""

    def __init__(self, broker: Broker, threshold: float, listeners: Sequence[object] = ()) -> None:
        self.broker = broker
        self.threshold = threshold
        self.listeners = list(listeners)
        self.figures = Figures()
        self.alerts = 0  # sessions that became stuck, since the start

    def listener_name(self, listener: object) -> str:
        """The label of the listener a connection came through (its ``link.listener``)."""
        for index, config in enumerate(self.listeners):
            if config is listener:
                return listener_label(index)
        return "other"

    def listener_names(self) -> list[str]:
        return [listener_label(index) for index in range(len(self.listeners))]

    def current(self) -> Figures:
        """The figures, walked again if the last walk is older than SURVEY_INTERVAL."""
        now = self.broker.clock()
        if now - self.figures.at >= SURVEY_INTERVAL:
            self._walk(now)
        return self.figures

    def tick(self) -> None:
        """Called about twice a second: walks (and raises or clears alarms) once a second."""
        if self.threshold:
            self.current()

    def _walk(self, now: float) -> None:
        broker = self.broker
        figures = Figures(at=now)
        threshold = self.threshold
        stuck = figures.stuck
        dropped = broker.dropped_ended
        for session in broker.sessions.values():
            if session.connection is None:
                figures.sessions_offline += 1
            else:
                figures.sessions_online += 1
            figures.inflight += len(session.inflight)
            dropped += session.dropped
            queue = session.queue
            if queue:
                figures.queued += len(queue)
                age = now - queue[0].queued_at
                if age > figures.oldest_age:
                    figures.oldest_age = age
                if threshold and age > threshold:
                    stuck[session.client_id] = age
        figures.dropped = dropped
        connections = figures.connections
        for conn in broker.connections:
            if conn.state == CONNECTED:
                name = self.listener_name(getattr(conn.link, "listener", None))
                connections[name] = connections.get(name, 0) + 1
        previous = self.figures.stuck
        self.figures = figures
        for client_id, age in stuck.items():
            if client_id not in previous:
                self.alerts += 1
                log.warning(
                    "session %s is stuck: its oldest queued message has waited %.0f s "
                    "(alerts.oldest_queued_age = %g)",
                    client_id,
                    age,
                    threshold,
                )
                self._publish(client_id, "stuck", age, now)
        for client_id in previous:
            if client_id not in stuck:
                ended = broker.sessions.get(client_id)
                age = oldest_queued_age(ended, now) if ended is not None else 0.0
                log.info("session %s recovered (oldest queued message %.0f s)", client_id, age)
                self._publish(client_id, "recovered", age, now)

    def _publish(self, client_id: str, state: str, age: float, now: float) -> None:
        topic = ALERT_PREFIX + client_id
        router = self.broker.router
        if not router.within_limits(topic):
            return
        payload = json.dumps(
            {"client_id": client_id, "state": state, "oldest_queued_age": round(age, 3)}
        ).encode()
        match = router.lookup(topic)
        if match is not None:
            router.publish(Message(topic, payload, 0, False), match, None, now)

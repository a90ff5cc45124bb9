"""Stuck sessions, and the figures that need a walk over every session or connection.

The age of a session's oldest queued message is the alarm that matters for a slow consumer: a
small backlog can be hours old. Each queued Delivery records when it joined its session's queue
(``Delivery.queued_at``) and the queue is in order, so a session's oldest age is
``now - queue[0].queued_at``.

:class:`Survey` keeps the totals (at most one survey a second, however often ``/metrics`` is
scraped or the dashboard polls). The queued messages, the oldest queued age and the stuck
sessions come from the broker's backlog index (``Broker.backlog``: only the sessions that have
a queue), so they are current at every survey. Sessions online and offline, in-flight and
dropped messages and connections per listener need every session and connection: they are
counted in slices of at most ``CENSUS_SLICE`` per survey over a snapshot of the sessions and
connections, and the figures of the last complete pass are reported, so no survey stalls the
broker however many sessions it keeps. The survey also drives the alarms
(``[alerts] oldest_queued_age``, seconds; 0: off): a session whose oldest queued message is older
is logged once when it becomes stuck and once when it recovers, counted, and published as a
``$SYS/broker/alerts/stuck/<client id>`` event (JSON, not retained).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..broker.connection import Connection
from ..broker.core import Broker
from ..broker.message import Message
from ..broker.session import Session
from ..broker.state import CONNECTED

log = logging.getLogger("mqttbroker.alerts")

ALERT_PREFIX = "$SYS/broker/alerts/stuck/"
SURVEY_INTERVAL = 1.0  # seconds a survey's figures are reused
# Sessions and connections counted per survey, at most: what an idle fleet costs each second
# (10,000 devices, a session and a connection each: a full pass every 5 s).
CENSUS_SLICE = 4_000


def oldest_queued_age(session: Session, now: float) -> float:
    """Seconds the session's oldest queued message has waited (0: nothing queued)."""
    queue = session.queue
    return now - queue[0].queued_at if queue else 0.0


@dataclass(slots=True)
class Census:
    """The counts that need every session and connection, as of the last complete pass."""

    sessions_online: int = 0
    sessions_offline: int = 0
    inflight: int = 0
    dropped: int = 0
    connections: dict[str, int] = field(default_factory=dict)  # listener name -> connected


@dataclass(slots=True)
class Figures:
    """One survey: the census of the last complete pass, and what the backlog index gives at
    once (queued messages, the oldest queued age, the stuck sessions)."""

    at: float = float("-inf")
    census: Census = field(default_factory=Census)
    queued: int = 0
    oldest_age: float = 0.0
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
        # each listener's label by the identity of its configuration (the survey looks one up
        # per connection: no string made each time)
        self._labels = {id(config): listener_label(i) for i, config in enumerate(self.listeners)}
        self.figures = Figures()
        self.alerts = 0  # sessions that became stuck, since the start
        self.census = Census()  # the last complete pass
        self._partial = Census()  # the pass under way, over the snapshots below
        self._sessions: list[Session] = []
        self._connections: list[Connection] = []
        self.counted = 0  # sessions and connections counted by the last survey

    def listener_name(self, listener: object) -> str:
        """The label of the listener a connection came through (its ``link.listener``)."""
        return self._labels.get(id(listener), "other")

    def listener_names(self) -> list[str]:
        return [listener_label(index) for index in range(len(self.listeners))]

    def _count(self, budget: int) -> Census:
        """Count up to ``budget`` more sessions and connections of the pass under way (a new
        pass starts from snapshots of both when the last one is complete); the census of the
        last complete pass."""
        broker = self.broker
        partial = self._partial
        if not self._sessions and not self._connections:
            self._sessions = list(broker.sessions.values())
            self._connections = list(broker.connections)
            partial.dropped = broker.stats.dropped_ended
        sessions = self._sessions
        take = min(budget, len(sessions))
        for session in sessions[len(sessions) - take :]:
            if session.connection is None:
                partial.sessions_offline += 1
            else:
                partial.sessions_online += 1
            partial.inflight += len(session.inflight)
            partial.dropped += session.dropped
        del sessions[len(sessions) - take :]
        connections = self._connections
        rest = min(budget - take, len(connections))
        counts = partial.connections
        labels = self._labels
        for conn in connections[len(connections) - rest :]:
            if conn.state == CONNECTED:
                name = labels.get(id(getattr(conn.link, "listener", None)), "other")
                counts[name] = counts.get(name, 0) + 1
        del connections[len(connections) - rest :]
        self.counted = take + rest
        if not sessions and not connections:  # the pass is complete
            # Dropped is a total that never goes down, though sessions end during a pass.
            partial.dropped = max(partial.dropped, self.census.dropped)
            self.census = partial
            self._partial = Census()
        return self.census

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
        figures = Figures(at=now, census=self._count(CENSUS_SLICE))
        threshold = self.threshold
        stuck = figures.stuck
        for session in broker.backlog:  # every one has queued messages
            queue = session.queue
            figures.queued += len(queue)
            age = now - queue[0].queued_at
            if age > figures.oldest_age:
                figures.oldest_age = age
            if threshold and age > threshold:
                stuck[session.client_id] = age
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
                left = broker.sessions.get(client_id)
                if left is None:
                    # Deleted (API, Clean Start) or expired: nothing recovered, the alarm ends.
                    log.info(
                        "session %s is no longer stuck: it ended (deleted or expired) with its "
                        "queued messages",
                        client_id,
                    )
                    self._publish(client_id, "recovered", 0.0, now)
                    continue
                age = oldest_queued_age(left, now)
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

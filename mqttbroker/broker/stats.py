"""The broker's running totals, and the one reading of them that every report uses.

The connections and handlers count as they go, with plain attribute increments on
:class:`BrokerStats` (nothing is counted per message for the reports: no locks, no labels).
:meth:`BrokerStats.snapshot` turns the totals into the figures that ``$SYS`` (ops/sys_tree.py),
``/metrics`` (ops/metrics.py), the admin API (ops/api.py) and the dashboard (ops/admin.py)
publish, so that the four always agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..protocol.reasons import CONNACK_CODES, ReasonCode

if TYPE_CHECKING:
    from .connection import Connection
    from .session import Session

# The label of a refused connection: its CONNACK reason code's name in the spec, in lower case
# (0x86 "bad_user_name_or_password", 0x87 "not_authorized", 0x8A "banned"...); a 3.1.1 client
# is counted under the same reason, whatever return code (if any) it was sent.
REFUSAL_REASONS = {code: ReasonCode(code).name.lower() for code in sorted(CONNACK_CODES) if code}
CONNECTION_LIMIT = "connection_limit"  # closed at once: max_connections or per address
OTHER = "other"  # a refusal without a CONNACK reason code of its own (none so far)


class Snapshot:
    """The totals at one moment, as the reports name them."""

    def __init__(
        self,
        received_by_qos: tuple[int, int, int],
        delivered: int,
        queue_dropped: int,
        denied: int,
        refused: int,
        refusals: dict[int, int],
        connects: int,
        bytes_received: int,
        bytes_sent: int,
    ) -> None:
        self.received_by_qos = received_by_qos  # PUBLISHes accepted, per QoS (index 0, 1, 2)
        self.delivered = delivered  # PUBLISH packets sent to subscribers (resends included)
        self.queue_dropped = queue_dropped  # dropped by the sessions' queue policy
        self.denied = denied  # PUBLISHes the authorizer refused
        self.refused = refused  # connections closed at once by the connection limits
        self.refusals = refusals  # CONNECTs refused, per CONNACK reason code
        self.connects = connects  # CONNECT packets received
        self.bytes_received = bytes_received  # MQTT bytes read from clients
        self.bytes_sent = bytes_sent  # MQTT bytes written to clients

    @property
    def received(self) -> int:
        """PUBLISHes accepted from clients (and from the integrations), all QoS together."""
        return self.received_by_qos[0] + self.received_by_qos[1] + self.received_by_qos[2]

    @property
    def dropped(self) -> int:
        """Messages not delivered, whatever the reason: dropped by a queue, or refused."""
        return self.queue_dropped + self.denied

    def refusals_by_reason(self) -> dict[str, int]:
        """Refused connections by reason label, every label present (0 when none)."""
        counts = dict.fromkeys(REFUSAL_REASONS.values(), 0)
        counts[CONNECTION_LIMIT] = self.refused
        counts[OTHER] = 0
        for code, count in self.refusals.items():
            reason = REFUSAL_REASONS.get(code, OTHER)
            counts[reason] = counts.get(reason, 0) + count
        return counts


class BrokerStats:
    def __init__(self) -> None:
        # PUBLISHes accepted from clients, per QoS: three native ints (a list's items would be
        # boxed again at every increment, on the hot path)
        self.received_q0 = 0
        self.received_q1 = 0
        self.received_q2 = 0
        self.denied = 0  # PUBLISHes refused by the authorizer
        self.refused = 0  # connections refused by the connection limits
        self.refusals: dict[int, int] = {}  # CONNECTs refused, per reason code (Connection.fail)
        self.connects = 0  # CONNECT packets received
        self.delivered_closed = 0  # PUBLISH packets sent on connections now closed
        self.dropped_ended = 0  # messages dropped by sessions that have ended
        # Bytes read from and written to clients (MQTT bytes: inside TLS and WebSocket frames),
        # counted by the connections per read and per write (Connection.data_received, flush).
        self.bytes_received = 0
        self.bytes_sent = 0

    def count_received(self, qos: int) -> None:
        """One more PUBLISH accepted at ``qos``."""
        if qos == 0:
            self.received_q0 += 1
        elif qos == 1:
            self.received_q1 += 1
        else:
            self.received_q2 += 1

    def queue_dropped(self, sessions: Iterable[Session]) -> int:
        """Messages the sessions' queues dropped since the start: those of ``sessions`` (every
        session open now) and of the sessions that have ended."""
        return self.dropped_ended + sum(s.dropped for s in sessions)

    def snapshot(self, connections: Iterable[Connection], queue_dropped: int) -> Snapshot:
        """The totals now. ``connections``: every open connection (their PUBLISH packets sent
        count as delivered); ``queue_dropped``: the messages the sessions' queues dropped, from
        :meth:`queue_dropped` or from a census that walks the sessions a slice at a time."""
        return Snapshot(
            (self.received_q0, self.received_q1, self.received_q2),
            self.delivered_closed + sum(c.output.publishes for c in connections),
            queue_dropped,
            self.denied,
            self.refused,
            dict(self.refusals),
            self.connects,
            self.bytes_received,
            self.bytes_sent,
        )

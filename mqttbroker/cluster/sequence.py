"""Which QoS 1/2 message is which across nodes: an id given where it was published, and what a
node routed of each origin. Sans I/O, like ownership.py.

A QoS 1/2 message that leaves its node carries an id: ``<origin>`` (the node id and a random
word new each run) and a counter, ``<origin>\\x1d<n>`` in its frame (node.py). One origin adds
its messages to one stream in the order of their counters (the writer sends batches in order;
while Redis is unreachable they wait in the outbox and go before anything newer), so the node
reading a stream sees each origin's counters rise, and:

- **A copy is known.** A message whose counter is not above the highest one routed from its
  origin (:class:`Routed`) is one routed already: a batch sent again after Redis took it but its
  answer was lost (Redis restarted, killed, or the connection cut), or an entry read again
  after a crash. Routing it again would deliver a QoS 2 message twice. A node writes its
  ``Routed`` to Redis with the session changes it covers (``seen:<node>``, fenced like them):
  a node adopting it routes from its stream only what its sessions in Redis do not hold.
"""

from __future__ import annotations

import secrets
from typing import Any


def new_origin(node_id: str) -> str:
    """This run's origin: the node id and a random word (a restarted node counts from 1)."""
    return f"{node_id}.{secrets.token_hex(4)}"


def parse_id(ident: bytes) -> tuple[str, int] | None:
    """``<origin>\\x1d<counter>`` as (origin, counter); None if it is not one."""
    origin, sep, counter = ident.rpartition(b"\x1d")
    if not sep or not counter.isdigit():
        return None
    return origin.decode(), int(counter)


class Routed:
    """The highest counter routed from each origin (in the order they come from a stream)."""

    __slots__ = ("highest", "changed")

    def __init__(self, highest: dict[str, int] | None = None) -> None:
        self.highest: dict[str, int] = dict(highest or {})
        self.changed = False  # since last written (taken by ``written``)

    def first(self, origin: str, counter: int) -> bool:
        """Whether this message is new (and it counts as routed now), not a copy of one."""
        if counter <= self.highest.get(origin, 0):
            return False
        self.highest[origin] = counter
        self.changed = True
        return True

    def covers(self, origin: str, counter: int) -> bool:
        return counter <= self.highest.get(origin, 0)

    def snapshot(self) -> dict[str, int]:
        return dict(self.highest)

    @staticmethod
    def from_redis(found: dict[Any, Any]) -> Routed:
        highest = {}
        for origin, counter in found.items():
            key = origin.decode() if isinstance(origin, bytes) else str(origin)
            try:
                highest[key] = int(counter)
            except (TypeError, ValueError):
                continue
        return Routed(highest)

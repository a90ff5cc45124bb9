"""A connection's topic aliases (MQTT 5.0 section 3.3.2.3.4), made on its first use of one:
most clients never use them, and an idle connection keeps one slot for both directions."""

from __future__ import annotations

from collections import OrderedDict

from mypy_extensions import mypyc_attr


@mypyc_attr(acyclic=True)
class TopicAliases:
    __slots__ = ("inbound", "outbound")

    def __init__(self) -> None:
        self.inbound: dict[int, str] = {}  # the client's: alias -> topic
        # Ours for the client: topic -> alias, least recently used first (deliver.send_publish).
        self.outbound: OrderedDict[str, int] = OrderedDict()

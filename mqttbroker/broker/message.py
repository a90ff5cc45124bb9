"""An application message as the broker routes it: received once, encoded once per shape.

A QoS 0 delivery with no per-subscriber properties is the same bytes for every subscriber, so
they are built once and cached on the message; QoS 1/2 deliveries differ only in the packet id.
"""

from __future__ import annotations

from typing import Any

from mypy_extensions import mypyc_attr

from ..protocol.fastpath import encode_properties, encode_publish_raw, encode_topic
from ..protocol.packets import MQTT_5
from ..protocol.properties import MESSAGE_EXPIRY_INTERVAL as _EXPIRY
from ..protocol.properties import SUBSCRIPTION_IDENTIFIER as _SUB_ID
from ..protocol.properties import TOPIC_ALIAS as _TOPIC_ALIAS

_NOT_FORWARDED = (_TOPIC_ALIAS, _SUB_ID, _EXPIRY)
# The properties of every message published without any: shared, so never changed (nothing
# changes a message's properties; what a delivery adds goes into a copy).
_NO_PROPERTIES: dict[int, Any] = {}


# Compiled, a message is not tracked by the cycle collector (it refers to no object that could
# refer back to it: strings, bytes, numbers, and dicts of them) and the last one freed is
# reused by the next: one is made and dropped for every PUBLISH received.
@mypyc_attr(acyclic=True, free_list_len=1)
class Message:
    __slots__ = (
        "_topic",
        "payload",
        "qos",
        "retain",
        "properties",
        "expires_at",
        "expiry_interval",
        "topic_bytes",
        "_props5",
        "_q0_key",
        "_q0_data",
        "_q0_more",
        "stored",
        "store_refs",
        "origin_id",
        "origin_user",
    )

    def __init__(
        self,
        topic: str | None,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        properties: dict[int, Any] | None = None,
        expires_at: float | None = None,
        topic_bytes: bytes | None = None,
        expiry_interval: int | None = None,
        forwarded: bytes | None = None,
        version: int = 0,
    ) -> None:
        """``topic``: its name, or None when ``topic_bytes`` is given (a topic the match cache
        knows, which routing does not need as text: decoded on first use, see :attr:`topic`).
        ``forwarded``: this message's QoS 0 PUBLISH, without properties, as a client of
        ``version`` sent it: subscribers of that version get it as it is (same RETAIN flag)."""
        self._topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        # Properties forwarded to subscribers (MQTT-3.3.2-4, -15..-20), without Topic Alias,
        # Subscription Identifier and Message Expiry Interval, which are set per delivery.
        self.properties = properties if properties is not None else _NO_PROPERTIES
        self.expires_at = expires_at
        self.expiry_interval = expiry_interval  # as published; the forwarded value never exceeds it
        if topic_bytes is None:
            assert topic is not None
            topic_bytes = encode_topic(topic)
        self.topic_bytes = topic_bytes
        self._props5: bytes | None = None
        # Its QoS 0 PUBLISH by version * 2 + RETAIN: the first one built (or forwarded) in a
        # pair of fields, since most messages go out in one shape; any other in a dict.
        if forwarded is None:
            self._q0_key = -1
            self._q0_data = b""
        else:
            self._q0_key = version * 2 + retain
            self._q0_data = forwarded
        self._q0_more: dict[int, bytes] | None = None
        self.stored = 0  # the store's handle (0: none); only the store reads it (broker/store.py)
        # The store's deliveries that refer to it, while it has a handle; only the store keeps it
        # (on the message, not in a table of the store's: such a table, one entry per message
        # queued, stops the broker to copy itself each time it doubles).
        self.store_refs = 0
        # The client id and user name of its publisher, recorded by Router.publish only while
        # an integration needs them (a webhook names the publisher); None otherwise, for the
        # broker's own messages, and for messages restored from the store.
        self.origin_id: str | None = None
        self.origin_user: str | None = None

    @property
    def topic(self) -> str:
        """The topic name; decoded from the wire form at first use when the message was made
        without it (a topic the match cache holds as validated bytes only)."""
        topic = self._topic
        if topic is None:
            topic = self._topic = self.topic_bytes[2:].decode()
        return topic

    @staticmethod
    def received(
        topic: str | None,
        topic_bytes: bytes,
        payload: bytes,
        qos: int,
        retain: bool,
        props: dict[int, Any] | None,
        now: float,
    ) -> Message:
        """A message as a client published it; ``props`` are the PUBLISH's properties."""
        expires_at = interval = None
        if props:
            interval = props.get(_EXPIRY)
            if interval is not None:
                expires_at = now + interval
            if _EXPIRY in props or _TOPIC_ALIAS in props or _SUB_ID in props:
                props = {k: v for k, v in props.items() if k not in _NOT_FORWARDED}
        # Message(), not a classmethod's cls(): compiled, a direct call of the constructor
        return Message(topic, payload, qos, retain, props, expires_at, topic_bytes, interval)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def remaining_expiry(self, now: float) -> int | None:
        """Whole seconds left (MQTT-3.3.2-6): rounded down, never more than was published (the
        millisecond slack absorbs float rounding of large intervals)."""
        if self.expires_at is None:
            return None
        left = max(0, int(self.expires_at - now + 0.001))
        interval = self.expiry_interval
        return left if interval is None or left < interval else interval

    def _properties_v5(self, sub_ids: tuple[int, ...], now: float, alias: int = 0) -> bytes:
        if not sub_ids and self.expires_at is None and not alias:
            cached = self._props5
            if cached is None:
                cached = self._props5 = encode_properties(self.properties)
            return cached
        props = dict(self.properties)
        if self.expires_at is not None:
            props[_EXPIRY] = self.remaining_expiry(now)  # MQTT-3.3.2-6
        if sub_ids:
            props[_SUB_ID] = list(sub_ids)
        if alias:
            props[_TOPIC_ALIAS] = alias
        return encode_properties(props)

    def encode(
        self,
        version: int,
        flags: int,
        packet_id: int | None,
        sub_ids: tuple[int, ...],
        now: float,
        alias: int = 0,
        with_topic: bool = True,
    ) -> bytes:
        """The PUBLISH packet for one delivery; ``flags``: its fixed header's DUP, QoS and
        RETAIN bits (section 3.3.1.1). With ``alias`` (MQTT 5 only), it carries that Topic
        Alias, and the topic name only ``with_topic`` (the alias being set): an empty one when
        the client already knows the alias (section 3.3.2.3.4)."""
        if flags < 2 and not sub_ids and self.expires_at is None and not alias:
            # QoS 0 (no DUP either, MQTT-3.3.1-2): one packet per version and RETAIN flag
            key = version * 2 + flags
            if key == self._q0_key:
                return self._q0_data
            more = self._q0_more
            if more is not None:
                cached = more.get(key)
                if cached is not None:
                    return cached
            props = self._properties_v5((), now) if version == MQTT_5 else None
            data = encode_publish_raw(flags, self.topic_bytes, None, props, self.payload)
            if self._q0_key < 0:
                self._q0_key = key
                self._q0_data = data
            elif more is None:
                self._q0_more = {key: data}
            else:
                more[key] = data
            return data
        props = self._properties_v5(sub_ids, now, alias) if version == MQTT_5 else None
        return encode_publish_raw(
            flags,
            self.topic_bytes if with_topic else b"\x00\x00",
            packet_id if flags & 6 else None,
            props,
            self.payload,
        )

    @property
    def size(self) -> int:
        return len(self.payload) + len(self.topic_bytes)

    def __repr__(self) -> str:
        return f"Message({self.topic!r}, {len(self.payload)} bytes, qos={self.qos}, retain={self.retain})"

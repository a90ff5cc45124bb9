"""Checks both codecs (grammar.py and fastpath.py) apply after slicing a packet: one copy of
each rule, so the two decoders can only disagree on how they read bytes, not on what they
accept."""

from __future__ import annotations

from . import packets as pk
from .errors import MalformedPacket, ProtocolError, UnsupportedProtocolVersion
from .packets import MQTT_5


def check_protocol(name: str, level: int) -> None:
    """MQTT-3.1.2-1 / -2: the protocol names and levels this broker speaks."""
    if (name, level) not in (("MQTT", 5), ("MQTT", 4), ("MQIsdp", 3)):
        raise UnsupportedProtocolVersion(f"unsupported protocol {name!r} level {level}")


def subscription_request(topic_filter: str, options: int, version: int) -> pk.SubscriptionRequest:
    """One Topic Filter with its Subscription Options byte (section 3.8.3.1), checked."""
    if version == MQTT_5:
        if options & 0xC0:
            raise MalformedPacket("reserved subscription option bits are not 0")  # 3.8.3-5
        retain_handling = (options >> 4) & 3
        if retain_handling == 3:
            raise ProtocolError("Retain Handling 3")
    else:
        if options & 0xFC:
            raise MalformedPacket("reserved subscription option bits are not 0")
        retain_handling = 0
    if options & 3 == 3:
        if version == MQTT_5:
            raise ProtocolError("subscription Maximum QoS 3")  # section 3.8.3.1
        raise MalformedPacket("subscription QoS 3")
    return pk.SubscriptionRequest(
        topic_filter,
        qos=options & 3,
        no_local=bool(options & 4) and version == MQTT_5,
        retain_as_published=bool(options & 8) and version == MQTT_5,
        retain_handling=retain_handling,
    )

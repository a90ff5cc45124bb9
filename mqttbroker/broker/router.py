"""PUBLISH fan-out: match the topic, apply each subscription's options, hand the message to each
matching session once.

A match cache maps a topic name to its matching subscriptions. A hit also stands for "this topic
name was validated", so the per-message cost of a repeated topic is one dict lookup. The cache is
cleared on every subscription change and when it grows past its bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol.errors import MalformedPacket
from ..protocol.fastpath import encode_topic
from .auth import Authorizer
from .message import Message
from .options import BrokerOptions
from .retained import RetainedStore
from .store import Store
from .topics import Match, Subscription, SubscriptionTrie, valid_topic_name

if TYPE_CHECKING:
    from .session import Session


class Router:
    def __init__(self, options: BrokerOptions, store: Store | None = None) -> None:
        self.options = options
        self.store = store or Store()
        self.trie = SubscriptionTrie()
        self.retained = RetainedStore(self.store)
        self._cache: dict[bytes, tuple[str, Match]] = {}

    def subscribe(self, sub: Subscription) -> bool:
        """Add or replace ``sub``; True if it replaced one (MQTT-3.8.4-3)."""
        self._cache.clear()
        return self.trie.add(sub)

    def unsubscribe(self, sub: Subscription) -> bool:
        self._cache.clear()
        return self.trie.remove(sub)

    def lookup_raw(self, raw: bytes) -> tuple[str, Match] | None:
        """The topic name and the subscriptions matching it, from the topic as it is on the wire
        (2-byte length, then UTF-8); None if it is not a valid Topic Name. A cache hit skips
        decoding and validation as well as matching."""
        found = self._cache.get(raw)
        if found is None:
            try:
                topic = raw[2:].decode()
            except UnicodeDecodeError:
                raise MalformedPacket("topic name is not well-formed UTF-8") from None
            if "\x00" in topic:
                raise MalformedPacket("topic name contains U+0000")  # MQTT-4.7.3-2
            if not valid_topic_name(topic) or not self.within_limits(topic):
                return None
            found = (topic, self.trie.match(topic))
            cache = self._cache
            if len(cache) >= self.options.match_cache_size:
                cache.clear()
            cache[raw] = found
        return found

    def within_limits(self, topic: str) -> bool:
        """The configured length and depth limits for topic names and filters."""
        opts = self.options
        return len(topic) <= opts.max_topic_length and topic.count("/") < opts.max_topic_levels

    def lookup(self, topic: str) -> Match | None:
        """The subscriptions matching ``topic``, or None if it is not a valid Topic Name."""
        found = self.lookup_raw(encode_topic(topic))
        return None if found is None else found[1]

    def publish(self, message: Message, match: Match, publisher: Session | None, now: float) -> int:
        """Store if retained, then deliver to every matching session; returns how many sessions
        it was handed to."""
        if message.retain:
            self.retained.store(message)  # and in the durable store
        targets, groups = match
        count = 0
        msg_qos = message.qos
        retain = message.retain
        for session, subs in targets:
            if len(subs) == 1:
                sub = subs[0]
                if sub.no_local and session is publisher:
                    continue  # MQTT-3.8.3-3
                if sub.read_check is not None and not sub.read_check(message.topic):
                    continue  # an ACL denial inside the filter
                qos = sub.qos if sub.qos < msg_qos else msg_qos  # MQTT-3.8.4-8
                ident = sub.identifier
                session.deliver(
                    message, qos, retain and sub.retain_as_published, (ident,) if ident else (), now
                )
                count += 1
            else:
                # Overlapping subscriptions of one client: one copy at the highest QoS, carrying
                # every matching Subscription Identifier (MQTT-3.3.4-2, -3, -4).
                qos = -1
                rap = False
                ids: list[int] = []
                for sub in subs:
                    if sub.no_local and session is publisher:
                        continue
                    if sub.read_check is not None and not sub.read_check(message.topic):
                        continue
                    if sub.qos > qos:
                        qos = sub.qos
                    rap = rap or sub.retain_as_published
                    if sub.identifier:
                        ids.append(sub.identifier)
                if qos < 0:
                    continue
                session.deliver(message, min(qos, msg_qos), retain and rap, tuple(ids), now)
                count += 1
        strategy = self.options.shared_subscription_strategy
        for group in groups:
            member = group.pick(strategy, message.topic, publisher.client_id if publisher else "")
            if member is None or (
                member.read_check is not None and not member.read_check(message.topic)
            ):
                continue
            ident = member.identifier
            member.session.deliver(
                message,
                min(member.qos, msg_qos),
                retain and member.retain_as_published,
                (ident,) if ident else (),
                now,
                member.topic_filter,
            )
            count += 1
        return count

    def send_retained(
        self, sub: Subscription, now: float, authorizer: Authorizer | None = None
    ) -> None:
        """Deliver the retained messages matching a new subscription, RETAIN set (MQTT-3.3.1-9),
        those the authorizer lets this client read."""
        session = sub.session
        ident = sub.identifier
        ids = (ident,) if ident else ()
        for message in list(self.retained.match(sub.filter, now)):
            if authorizer is not None and not authorizer.can_read(
                session.client_id, session.username, message.topic
            ):
                continue
            session.deliver(message, min(sub.qos, message.qos), True, ids, now)

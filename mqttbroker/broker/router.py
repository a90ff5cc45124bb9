"""PUBLISH fan-out: match the topic, apply each subscription's options, hand the message to each
matching session once.

A match cache maps a topic name, as it is on the wire, to its matching subscriptions. A hit also
stands for "this topic name was validated", so the per-message cost of a repeated topic is one
dict lookup; the name is not kept as text (a message decodes it if something asks, see
Message.topic), so a fleet's topics cost the cache their wire form and a dict slot each. A
subscription change forgets what it may change: the one topic a filter without wildcards
matches, or else the whole cache; the cache is cleared too when it grows past its bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..protocol.errors import MalformedPacket
from ..protocol.fastpath import encode_topic
from .backplane import Backplane
from .message import Message
from .options import BrokerOptions
from .retained import RetainedStore
from .store import Store
from .topics import NO_MATCH, Match, Subscription, SubscriptionTrie, valid_topic_name

if TYPE_CHECKING:
    from .session import Session

# About what one match-cache entry costs beside its topic's bytes: the dict slot and the bytes
# object's own header, and the match unless it is one trie node's shared one
# (topics.SubscriptionTrie.match).
_ENTRY_BYTES = 120
# The server's own topics, on which no message is kept as a retained one: the dynamic
# security's commands carry passwords, and a retained one would be stored (in the durable store
# too) and sent to every later subscriber. The message is handled as if published without
# RETAIN, as Mosquitto does ($CONTROL topics are the server's, MQTT 5.0 section 4.7.2).
UNRETAINED = "$CONTROL/dynamic-security/"


class Publisher(Protocol):
    def may_publish(self, topic: str) -> bool: ...


class Router:
    def __init__(self, options: BrokerOptions, store: Store | None = None) -> None:
        self.options = options
        self.store = store or Store()
        self.trie = SubscriptionTrie()
        self.retained = RetainedStore(self.store)
        # The match cache (see lookup_raw): read directly by publish.route, a hit without a call
        self.cache: dict[bytes, Match] = {}
        self._cache_bytes = 0  # what the cached topics take, about
        # Record each message's publisher on it (Message.origin_id): set by webhooks.
        self.track_origin = False
        self.backplane: Backplane | None = None  # the other nodes of a cluster (None: alone)
        self.route_counts: dict[str, int] = {}  # with a backplane: subscriptions per filter

    def subscribe(self, sub: Subscription) -> bool:
        """Add or replace ``sub``; True if it replaced one (MQTT-3.8.4-3)."""
        self._invalidate(sub.filter)
        replaced = self.trie.add(sub)
        if not replaced and self.backplane is not None:
            count = self.route_counts.get(sub.topic_filter, 0)
            self.route_counts[sub.topic_filter] = count + 1
            if not count:
                self.backplane.route_added(sub.topic_filter)
        return replaced

    def unsubscribe(self, sub: Subscription) -> bool:
        self._invalidate(sub.filter)
        removed = self.trie.remove(sub)
        if removed and self.backplane is not None:
            count = self.route_counts.pop(sub.topic_filter, 1) - 1
            if count:
                self.route_counts[sub.topic_filter] = count
            else:
                self.backplane.route_removed(sub.topic_filter)
        return removed

    def _invalidate(self, topic_filter: str) -> None:
        """Forget the cached matches a subscription to ``topic_filter`` (a shared one's inner
        filter) changes: a filter without wildcards matches one topic name, itself."""
        cache = self.cache
        if not cache:
            return
        if "+" in topic_filter or "#" in topic_filter:
            self._clear_cache()
            return
        raw = encode_topic(topic_filter)
        if cache.pop(raw, None) is not None:
            self._cache_bytes -= len(raw) + _ENTRY_BYTES

    def _clear_cache(self) -> None:
        self.cache.clear()
        self._cache_bytes = 0

    def lookup_raw(
        self, raw: bytes, publisher: Publisher | None = None
    ) -> tuple[str | None, Match] | None:
        """The subscriptions matching a topic as it is on the wire (2-byte length, then UTF-8),
        with its name when it had to be decoded (None on a cache hit: the caller decodes it if
        it needs it); None if it is not a valid Topic Name. A cache hit skips decoding and
        validation as well as matching. A topic ``publisher`` may not publish to is neither
        matched nor cached (it gets no match): the cache holds only topics that someone may
        publish to."""
        cache = self.cache
        match = cache.get(raw)
        if match is not None:
            return None, match
        try:
            topic = raw[2:].decode()
        except UnicodeDecodeError:
            raise MalformedPacket("topic name is not well-formed UTF-8") from None
        if "\x00" in topic:
            raise MalformedPacket("topic name contains U+0000")  # MQTT-4.7.3-2
        if not valid_topic_name(topic) or not self.within_limits(topic):
            return None
        if publisher is not None and not publisher.may_publish(topic):
            return topic, NO_MATCH
        match = self.trie.match(topic)
        size = len(raw) + _ENTRY_BYTES
        opts = self.options
        if len(cache) >= opts.match_cache_size or self._cache_bytes + size > opts.match_cache_bytes:
            self._clear_cache()
        if size <= opts.match_cache_bytes:
            cache[raw] = match
            self._cache_bytes += size
        return topic, match

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
        if self.track_origin and publisher is not None:
            message.origin_id = publisher.client_id
            message.origin_user = publisher.username
        if message.retain:
            if message.topic.startswith(UNRETAINED):
                message.retain = False  # never kept (see UNRETAINED)
            else:
                self.retained.store(message)  # and in the durable store
        targets, groups = match
        count = 0
        backplane = self.backplane
        if backplane is not None:  # a cluster: other nodes too, and shared groups may be there
            count, groups = backplane.publish(message, groups, publisher)
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
        if not groups:
            return count
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

"""Topic names and filters (section 4.7), shared-subscription names (4.8.2), and the subscription
trie the router matches against.

The trie has one node per topic level, children in a dict keyed by the level's text; a node holds
the subscriptions whose filter ends there, keyed by client id, and the shared-subscription groups
whose filter ends there. A match walks only the branches that can match: the literal level, ``+``
and ``#``. Never a scan of all subscriptions.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .session import Session

SHARE_PREFIX = "$share/"


def valid_topic_name(topic: str) -> bool:
    """A Topic Name: at least one character, no wildcards (MQTT-4.7.0-1, -4.7.3-1). U+0000 and the
    65,535-byte limit are enforced by the codec."""
    return bool(topic) and "+" not in topic and "#" not in topic


def valid_topic_filter(topic_filter: str) -> bool:
    """A Topic Filter: '#' alone in the last level, '+' alone in its level (MQTT-4.7.1-1, -2)."""
    if not topic_filter:
        return False
    if "+" not in topic_filter and "#" not in topic_filter:
        return True
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != last):
            return False
        if "+" in level and level != "+":
            return False
    return True


def parse_shared(topic_filter: str) -> tuple[str, str] | None:
    """Split ``$share/<group>/<filter>`` into (group, filter); None if not a shared filter.
    Raises ValueError if it is one but malformed (MQTT-4.8.2-1, -2)."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    rest = topic_filter[len(SHARE_PREFIX) :]
    group, sep, inner = rest.partition("/")
    if not group or not sep or "+" in group or "#" in group:
        raise ValueError("malformed shared subscription name")
    if not valid_topic_filter(inner):
        raise ValueError("malformed topic filter in shared subscription")
    return group, inner


def matches(topic_filter: str, topic: str) -> bool:
    """Whether ``topic_filter`` matches the Topic Name ``topic``: the plain definition, for one
    filter against one topic (a bridge's rules); the trie matches all subscriptions at once,
    and is tested against this."""
    return matches_levels(topic_filter.split("/"), topic.split("/"))


def matches_levels(flevels: Sequence[str], tlevels: Sequence[str]) -> bool:
    """:func:`matches` for a filter and a topic already split into levels (access control
    keeps its filters split)."""
    if tlevels[0].startswith("$") and flevels[0] in ("+", "#"):
        return False  # MQTT-4.7.2-1
    for index, level in enumerate(flevels):
        if level == "#":
            return True
        if index >= len(tlevels):
            return False
        if level != "+" and level != tlevels[index]:
            return False
    return len(flevels) == len(tlevels)


class Subscription:
    """One subscription of one session: the filter as the client sent it and its options."""

    __slots__ = (
        "topic_filter",
        "qos",
        "no_local",
        "retain_as_published",
        "retain_handling",
        "identifier",
        "session",
        "share_group",
        "filter",
        "read_check",
    )

    def __init__(
        self,
        session: Session,
        topic_filter: str,
        qos: int = 0,
        *,
        no_local: bool = False,
        retain_as_published: bool = False,
        retain_handling: int = 0,
        identifier: int | None = None,
    ) -> None:
        self.session = session
        self.topic_filter = topic_filter  # as subscribed, "$share/g/a/b" included
        self.qos = qos
        self.no_local = no_local
        self.retain_as_published = retain_as_published
        self.retain_handling = retain_handling
        self.identifier = identifier
        shared = parse_shared(topic_filter)
        self.share_group = shared[0] if shared else None
        self.filter = shared[1] if shared else topic_filter  # the part matched against names
        # Set when an ACL deny rule overlaps the filter (decided when subscribing): whether the
        # client may read a topic; messages it refuses are not delivered through this
        # subscription. None (nearly always): nothing to check per message.
        self.read_check: Callable[[str], bool] | None = None

    def __repr__(self) -> str:
        return f"Subscription({self.session.client_id!r}, {self.topic_filter!r}, qos={self.qos})"


SHARE_STRATEGIES = ("round_robin", "random", "sticky", "hash")


class SharedGroup:
    """The members of one ``$share/<group>/<filter>``; each message goes to one of them.

    Strategies: ``round_robin`` (each member in turn, whether its client is connected or its
    persistent session queues the message), ``random``, ``sticky`` (a publisher's messages keep
    going to the member first chosen for it, while that member stays), ``hash`` (by topic: one
    topic always reaches the same member while the membership is unchanged)."""

    __slots__ = ("name", "members", "next_index", "sticky")

    def __init__(self, name: str) -> None:
        self.name = name
        self.members: list[Subscription] = []
        self.next_index = 0
        self.sticky: dict[str, Subscription] = {}

    def pick(
        self,
        strategy: str = "round_robin",
        topic: str = "",
        publisher: str = "",
        exclude: Session | None = None,
    ) -> Subscription | None:
        members = self.members
        if exclude is not None:
            members = [m for m in members if m.session is not exclude]
        count = len(members)
        if not count:
            return None
        if strategy == "round_robin":
            sub = members[self.next_index % count]
            self.next_index += 1
            return sub
        if strategy == "random":
            return members[random.randrange(count)]
        if strategy == "hash":
            return members[zlib.crc32(topic.encode()) % count]
        sticky = self.sticky
        chosen = sticky.get(publisher)
        if chosen is None or chosen not in members:
            if len(sticky) >= 65536:  # bounded: publishers come and go
                sticky.clear()
            chosen = sticky[publisher] = members[self.next_index % count]
            self.next_index += 1
        return chosen


# One topic's match: per session the matching non-shared subscriptions, and the shared groups.
# Its readers never change it: one match may serve many topics.
Match = tuple[list[tuple["Session", tuple[Subscription, ...]]], list[SharedGroup]]
NO_MATCH: Match = ([], [])


class _Node:
    """One level of the trie. Its tables are created on first use: most nodes are leaves with
    subscriptions and no groups, or inner levels with children only. ``matched`` is the match
    of a topic this node alone matches, kept until its subscriptions change: the topics a
    fleet publishes under one wildcard filter share it instead of holding one each."""

    __slots__ = ("children", "subs", "groups", "matched")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.subs: dict[str, Subscription] | None = None
        self.groups: dict[str, SharedGroup] | None = None
        self.matched: Match | None = None


def _match_of(found: list[_Node]) -> Match:
    """The subscriptions of the ``found`` nodes, grouped per session."""
    per_session: dict[str, list[Subscription]] = {}
    groups: list[SharedGroup] = []
    for node in found:
        if node.subs:
            for client_id, sub in node.subs.items():
                entry = per_session.get(client_id)
                if entry is None:
                    per_session[client_id] = [sub]
                else:
                    entry.append(sub)
        if node.groups:
            groups.extend(node.groups.values())
    return [(subs[0].session, tuple(subs)) for subs in per_session.values()], groups


class SubscriptionTrie:
    def __init__(self) -> None:
        self._root = _Node()
        self.count = 0

    @property
    def root(self) -> _Node:
        """The top node (``children`` by level, ``subs`` by client id, ``groups`` by name),
        for readers that walk the trie themselves: the admin API pages through it."""
        return self._root

    def add(self, sub: Subscription) -> bool:
        """Insert or replace; returns True if it replaced an existing subscription."""
        node = self._root
        for level in sub.filter.split("/"):
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(level)
            if child is None:
                child = children[level] = _Node()
            node = child
        node.matched = None
        client_id = sub.session.client_id
        if sub.share_group is None:
            subs = node.subs
            if subs is None:
                subs = node.subs = {}
            existed = client_id in subs
            subs[client_id] = sub
        else:
            groups = node.groups
            if groups is None:
                groups = node.groups = {}
            group = groups.get(sub.share_group)
            if group is None:
                group = groups[sub.share_group] = SharedGroup(sub.share_group)
            existed = False
            for index, member in enumerate(group.members):
                if member.session.client_id == client_id:
                    group.members[index] = sub
                    existed = True
                    break
            if not existed:
                group.members.append(sub)
        if not existed:
            self.count += 1
        return existed

    def remove(self, sub: Subscription) -> bool:
        path = [self._root]
        node = self._root
        levels = sub.filter.split("/")
        for level in levels:
            child = node.children.get(level) if node.children else None
            if child is None:
                return False
            path.append(child)
            node = child
        node.matched = None
        client_id = sub.session.client_id
        removed = False
        if sub.share_group is None:
            if node.subs:
                removed = node.subs.pop(client_id, None) is not None
                if not node.subs:
                    node.subs = None
        elif node.groups:
            group = node.groups.get(sub.share_group)
            if group is not None:
                before = len(group.members)
                group.members = [m for m in group.members if m.session.client_id != client_id]
                removed = len(group.members) != before
                group.sticky = {p: m for p, m in group.sticky.items() if m in group.members}
                if not group.members:
                    del node.groups[sub.share_group]
                    if not node.groups:
                        node.groups = None
        if removed:
            self.count -= 1
        # Prune empty nodes bottom-up so the trie does not grow with churn.
        for depth in range(len(levels), 0, -1):
            child = path[depth]
            if child.subs or child.groups or child.children:
                break
            parent = path[depth - 1]
            assert parent.children is not None  # it holds ``child``
            del parent.children[levels[depth - 1]]
            if not parent.children:
                parent.children = None
        return removed

    def shared_group(self, topic_filter: str) -> SharedGroup | None:
        """The group of ``$share/<group>/<filter>`` as it is now; None once it has no members."""
        shared = parse_shared(topic_filter)
        if shared is None:
            return None
        node = self._root
        for level in shared[1].split("/"):
            child = node.children.get(level) if node.children else None
            if child is None:
                return None
            node = child
        return node.groups.get(shared[0]) if node.groups else None

    def match(self, topic: str) -> Match:
        """Every subscription whose filter matches ``topic``, grouped per session."""
        levels = topic.split("/")
        dollar = topic.startswith("$")
        found: list[_Node] = []
        nodes = [self._root]
        for index, level in enumerate(levels):
            following: list[_Node] = []
            for node in nodes:
                children = node.children
                if not children:
                    continue
                wild_ok = index or not dollar  # MQTT-4.7.2-1
                if wild_ok:
                    hash_node = children.get("#")
                    if hash_node is not None:
                        found.append(hash_node)
                    plus = children.get("+")
                    if plus is not None:
                        following.append(plus)
                child = children.get(level)
                if child is not None:
                    following.append(child)
            nodes = following
            if not nodes:
                break
        else:
            for node in nodes:
                found.append(node)
                if node.children:
                    hash_node = node.children.get("#")  # "a/#" matches "a"
                    if hash_node is not None:
                        found.append(hash_node)
        if len(found) != 1:
            return _match_of(found) if found else NO_MATCH
        node = found[0]
        matched = node.matched
        if matched is None:
            matched = node.matched = _match_of(found)
        return matched

    def __iter__(self) -> Iterator[Subscription]:
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.subs:
                yield from node.subs.values()
            if node.groups:
                for group in node.groups.values():
                    yield from group.members
            if node.children:
                stack.extend(node.children.values())

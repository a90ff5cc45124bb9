"""The route table: which other nodes have subscriptions matching a topic.

Each node keeps its own filters in Redis (a hash per node) and announces the first subscription
to a filter and the end of its last one; every node mirrors the others' filters here, in a tree
of topic levels, and caches the answer per topic name until the table changes.

A shared subscription is a route of its own (``$share/<group>/<filter>``): a message matching it
goes to one node among those with members of the group (node.py chooses), not to all of them.
"""

from __future__ import annotations

from ..broker.topics import parse_shared

# What a topic matches: the nodes with plain subscriptions, and per shared subscription
# ("$share/<group>/<filter>") the nodes with members of it.
Found = tuple[tuple[str, ...], dict[str, tuple[str, ...]]]


class _Level:
    __slots__ = ("children", "nodes", "shares")

    def __init__(self) -> None:
        self.children: dict[str, _Level] = {}
        self.nodes: set[str] = set()  # nodes with a subscription to the filter ending here
        self.shares: dict[str, set[str]] = {}  # "$share/g/<filter>" -> nodes with members


class RouteTable:
    def __init__(self, cache_size: int = 65536) -> None:
        self._root = _Level()
        self._cache: dict[str, Found] = {}
        self._cache_size = cache_size
        self.filters: dict[str, set[str]] = {}  # node -> its filters

    @staticmethod
    def _inner(topic_filter: str) -> tuple[str, bool]:
        """The filter matched against topic names, and whether it is a shared one."""
        shared = parse_shared(topic_filter)
        return (topic_filter, False) if shared is None else (shared[1], True)

    def add(self, node: str, topic_filter: str) -> None:
        mine = self.filters.setdefault(node, set())
        if topic_filter in mine:
            return
        inner, shared = self._inner(topic_filter)
        mine.add(topic_filter)
        level = self._root
        for name in inner.split("/"):
            child = level.children.get(name)
            if child is None:
                child = level.children[name] = _Level()
            level = child
        if not shared:
            level.nodes.add(node)
        else:
            level.shares.setdefault(topic_filter, set()).add(node)
        self._cache.clear()

    def remove(self, node: str, topic_filter: str) -> None:
        mine = self.filters.get(node)
        if mine is None or topic_filter not in mine:
            return
        mine.discard(topic_filter)
        if not mine:
            del self.filters[node]
        inner, shared = self._inner(topic_filter)
        names = inner.split("/")
        path = [self._root]
        for name in names:
            path.append(path[-1].children[name])
        end = path[-1]
        if not shared:
            end.nodes.discard(node)
        else:
            members = end.shares[topic_filter]
            members.discard(node)
            if not members:
                del end.shares[topic_filter]
        for depth in range(len(names), 0, -1):  # prune empty levels
            level = path[depth]
            if level.nodes or level.shares or level.children:
                break
            del path[depth - 1].children[names[depth - 1]]
        self._cache.clear()

    def replace(self, node: str, filters: set[str]) -> None:
        """``node``'s filters are now ``filters`` (a snapshot read from Redis)."""
        for topic_filter in self.filters.get(node, set()) - filters:
            self.remove(node, topic_filter)
        for topic_filter in filters:
            self.add(node, topic_filter)

    def match(self, topic: str) -> Found:
        """The nodes with a plain filter matching ``topic``, each once; and the shared
        subscriptions matching it with their nodes."""
        found = self._cache.get(topic)
        if found is None:
            nodes: set[str] = set()
            shares: dict[str, set[str]] = {}
            self._walk(self._root, topic.split("/"), 0, nodes, shares)
            found = (
                tuple(sorted(nodes)),
                {share: tuple(sorted(members)) for share, members in shares.items()},
            )
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[topic] = found
        return found

    def _walk(
        self,
        level: _Level,
        names: list[str],
        index: int,
        nodes: set[str],
        shares: dict[str, set[str]],
    ) -> None:
        children = level.children
        hashed = children.get("#")
        # "#" matches the parent level too; neither wildcard matches a first level of "$"
        # (MQTT-4.7.2-1).
        if hashed is not None and not (index == 0 and names[0].startswith("$")):
            self._take(hashed, nodes, shares)
        if index == len(names):
            self._take(level, nodes, shares)
            return
        name = names[index]
        exact = children.get(name)
        if exact is not None:
            self._walk(exact, names, index + 1, nodes, shares)
        plus = children.get("+")
        if plus is not None and not (index == 0 and name.startswith("$")):
            self._walk(plus, names, index + 1, nodes, shares)

    @staticmethod
    def _take(level: _Level, nodes: set[str], shares: dict[str, set[str]]) -> None:
        nodes.update(level.nodes)
        for share, members in level.shares.items():
            shares.setdefault(share, set()).update(members)

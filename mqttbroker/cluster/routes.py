"""The route table: which other nodes have subscriptions matching a topic.

Each node keeps its own filters in Redis (a hash per node) and announces the first subscription
to a filter and the end of its last one; every node mirrors the others' filters here, in a tree
of topic levels, and caches the answer per topic name until the table changes.
"""

from __future__ import annotations


class _Level:
    __slots__ = ("children", "nodes")

    def __init__(self) -> None:
        self.children: dict[str, _Level] = {}
        self.nodes: set[str] = set()  # nodes with a subscription to the filter ending here


class RouteTable:
    def __init__(self, cache_size: int = 65536) -> None:
        self._root = _Level()
        self._cache: dict[str, tuple[str, ...]] = {}
        self._cache_size = cache_size
        self.filters: dict[str, set[str]] = {}  # node -> its filters

    def add(self, node: str, topic_filter: str) -> None:
        mine = self.filters.setdefault(node, set())
        if topic_filter in mine:
            return
        mine.add(topic_filter)
        level = self._root
        for name in topic_filter.split("/"):
            child = level.children.get(name)
            if child is None:
                child = level.children[name] = _Level()
            level = child
        level.nodes.add(node)
        self._cache.clear()

    def remove(self, node: str, topic_filter: str) -> None:
        mine = self.filters.get(node)
        if mine is None or topic_filter not in mine:
            return
        mine.discard(topic_filter)
        if not mine:
            del self.filters[node]
        names = topic_filter.split("/")
        path = [self._root]
        for name in names:
            path.append(path[-1].children[name])
        path[-1].nodes.discard(node)
        for depth in range(len(names), 0, -1):  # prune empty levels
            if path[depth].nodes or path[depth].children:
                break
            del path[depth - 1].children[names[depth - 1]]
        self._cache.clear()

    def replace(self, node: str, filters: set[str]) -> None:
        """``node``'s filters are now ``filters`` (a snapshot read from Redis)."""
        for topic_filter in self.filters.get(node, set()) - filters:
            self.remove(node, topic_filter)
        for topic_filter in filters:
            self.add(node, topic_filter)

    def drop(self, node: str) -> None:
        self.replace(node, set())

    def match(self, topic: str) -> tuple[str, ...]:
        """The nodes with a filter matching ``topic``, each once."""
        found = self._cache.get(topic)
        if found is None:
            nodes: set[str] = set()
            self._walk(self._root, topic.split("/"), 0, nodes)
            found = tuple(sorted(nodes))
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[topic] = found
        return found

    def _walk(self, level: _Level, names: list[str], index: int, out: set[str]) -> None:
        children = level.children
        hashed = children.get("#")
        # "#" matches the parent level too; neither wildcard matches a first level of "$"
        # (MQTT-4.7.2-1).
        if hashed is not None and not (index == 0 and names[0].startswith("$")):
            out.update(hashed.nodes)
        if index == len(names):
            out.update(level.nodes)
            return
        name = names[index]
        exact = children.get(name)
        if exact is not None:
            self._walk(exact, names, index + 1, out)
        plus = children.get("+")
        if plus is not None and not (index == 0 and name.startswith("$")):
            self._walk(plus, names, index + 1, out)

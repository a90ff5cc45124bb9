"""The retained-message store (section 3.3.1.3): at most one message per topic, kept in a tree of
topic levels so that a wildcard subscription walks only the matching branches."""

from __future__ import annotations

from collections.abc import Iterator

from .message import Message
from .store import Store


class _Node:
    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.message: Message | None = None


def _own(levels: list[str]) -> bool:
    """A ``$SYS/...`` topic: the broker's own counters, kept in memory only, and not counted
    (neither in ``$SYS/broker/retained messages/count`` nor against ``max_retained``)."""
    return len(levels) > 1 and levels[0] == "$SYS"


class RetainedStore:
    def __init__(self, store: Store | None = None) -> None:
        self._root = _Node()
        self.count = 0  # retained messages, those of $SYS topics left out
        self._store = store or Store()

    @property
    def root(self) -> _Node:
        """The top node (``children`` by level, ``message``), for readers that walk the tree
        themselves: the admin API pages through it."""
        return self._root

    def store(self, message: Message, save: bool = True) -> None:
        """Keep ``message`` as its topic's retained message, or clear the topic if the payload is
        empty (MQTT-3.3.1-5, -6, -7). ``save`` False: restored from the store, which has it."""
        levels = message.topic.split("/")
        if not message.payload:
            self._clear(levels)
            self._store.delete_retained(message.topic)
            return
        node = self._root
        for level in levels:
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        own = _own(levels)
        if node.message is None and not own:
            self.count += 1
        node.message = message
        if save and not own:
            self._store.save_retained(message)

    def _clear(self, levels: list[str]) -> None:
        path = [self._root]
        for level in levels:
            child = path[-1].children.get(level)
            if child is None:
                return
            path.append(child)
        if path[-1].message is not None:
            path[-1].message = None
            if not _own(levels):
                self.count -= 1
        for depth in range(len(levels), 0, -1):
            if path[depth].message is not None or path[depth].children:
                break
            del path[depth - 1].children[levels[depth - 1]]

    def get(self, topic: str) -> Message | None:
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            node = child
        return node.message

    def match(self, topic_filter: str, now: float) -> Iterator[Message]:
        """Retained messages whose topic matches ``topic_filter``; expired ones are removed
        instead of returned. The store may change while this is consumed (a connection sends
        them over several loop passes): an expired message replaced meanwhile stays replaced."""
        expired: list[Message] = []
        for message in self._walk(self._root, topic_filter.split("/"), 0):
            if message.expired(now):
                expired.append(message)
            else:
                yield message
        for message in expired:
            if self.get(message.topic) is message:
                self._clear(message.topic.split("/"))
                self._store.delete_retained(message.topic)

    def _walk(self, node: _Node, levels: list[str], index: int) -> Iterator[Message]:
        if index == len(levels):
            if node.message is not None:
                yield node.message
            return
        level = levels[index]
        top = index == 0
        if level == "#":
            yield from self._subtree(node, skip_dollar=top, include_self=not top)
        elif level == "+":
            for name, child in list(node.children.items()):
                if top and name.startswith("$"):
                    continue  # MQTT-4.7.2-1
                yield from self._walk(child, levels, index + 1)
        else:
            exact = node.children.get(level)
            if exact is not None:
                yield from self._walk(exact, levels, index + 1)

    def _subtree(self, node: _Node, skip_dollar: bool, include_self: bool) -> Iterator[Message]:
        if include_self and node.message is not None:
            yield node.message  # "a/#" matches "a" itself
        stack = [
            child
            for name, child in node.children.items()
            if not (skip_dollar and name.startswith("$"))
        ]
        while stack:
            current = stack.pop()
            if current.message is not None:
                yield current.message
            stack.extend(current.children.values())

    def __iter__(self) -> Iterator[Message]:
        return self._subtree(self._root, skip_dollar=False, include_self=False)

    def __len__(self) -> int:
        return self.count

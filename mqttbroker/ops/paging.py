"""Listings that page without walking everything.

One request of the admin API examines at most SCAN_LIMIT entries (sessions, connections, nodes
of a topic tree, subscriptions, retained messages), however sparse its filter: it answers with
the matches found so far and a cursor to go on from, so that a listing of a few subscriptions
among a million costs each request the same bounded work, and the MQTT side waits for none of
them longer than that.

A cursor is a list of non-negative integers (dot-separated in the API, opaque to clients). In a
dict or set it is the position in the iteration order, skipped in C (no entry examined); in a
topic tree, the child indexes from the root down to the next node to visit, then the index of
the next item in that node. A filter walks only the branches it can match (its literal levels,
every child under ``+`` and ``#``). Entries added or removed while a listing is paged may shift
positions: its pages may then miss or repeat some, as offset paging would.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

SCAN_LIMIT = 10_000  # entries one request examines at most
MAX_CURSOR_PARTS = 1024  # deeper than any topic tree max_topic_levels allows by default

T = TypeVar("T")
Path = tuple[int, ...]


def parse_cursor(text: str) -> list[int]:
    """The cursor of ``text`` (as :func:`format_cursor` wrote it); ValueError if it is none."""
    parts = text.split(".")
    if len(parts) > MAX_CURSOR_PARTS or not all(p.isdigit() and len(p) <= 10 for p in parts):
        raise ValueError(text)
    return [int(p) for p in parts]


def format_cursor(cursor: list[int] | None) -> str | None:
    return None if cursor is None else ".".join(map(str, cursor))


def scan(
    entries: Iterable[T], wanted: Callable[[T], bool], start: int, limit: int
) -> tuple[list[T], list[int] | None]:
    """Up to ``limit`` entries that are ``wanted``, from position ``start`` of ``entries`` (a
    dict's keys or values), examining at most SCAN_LIMIT; and the cursor to go on from (None:
    the end)."""
    found: list[T] = []
    position = start
    budget = SCAN_LIMIT
    for entry in itertools.islice(entries, start, None):
        if len(found) == limit or not budget:
            return found, [position]
        budget -= 1
        position += 1
        if wanted(entry):
            found.append(entry)
    return found, None


def scan_tree(
    root: Any,
    levels: list[str],
    cursor: list[int],
    items: Callable[[Any], Iterable[T]],
    wanted: Callable[[T], bool],
    limit: int,
) -> tuple[list[T], list[int] | None]:
    """Up to ``limit`` wanted items of the nodes of a topic tree (nodes with ``children``, a
    dict by level) whose topic the filter ``levels`` matches, from ``cursor`` on, examining at
    most SCAN_LIMIT nodes and items; and the cursor to go on from (None: the end)."""
    resume: Path = tuple(cursor[:-1])
    skip = cursor[-1] if cursor else 0
    found: list[T] = []
    budget = SCAN_LIMIT
    for path, node, matching in _nodes(root, levels, resume):
        if len(found) == limit or not budget:
            return found, [*path, 0]
        budget -= 1
        first = skip if path == resume else 0
        skip = 0
        if not matching:
            continue
        for index, item in enumerate(itertools.islice(items(node), first, None), first):
            if len(found) == limit or not budget:
                return found, [*path, index]
            budget -= 1
            if wanted(item):
                found.append(item)
    return found, None


# A node to visit: (node, depth, path, whole); whole: below a "#", everything matches.
_Visit = tuple[Any, int, Path, bool]
# A child the filter reaches: (node, its index among its parent's children, whole).
_Child = tuple[Any, int, bool]


def _children(
    node: Any, levels: list[str], depth: int, whole: bool, start: int
) -> Iterator[_Child]:
    """The children of ``node`` (at ``depth``) the filter reaches, from child index ``start``."""
    children: dict[str, Any] = node.children
    if not children or (not whole and depth == len(levels)):
        return iter(())
    level = "#" if whole else levels[depth]
    if level not in ("#", "+"):
        child = children.get(level)
        return iter(() if child is None or start else ((child, 0, False),))
    below = level == "#"
    named = enumerate(itertools.islice(children.items(), start, None), start)
    if depth:
        return ((child, index, below) for index, (_, child) in named)
    # MQTT-4.7.2-1: a wildcard at the top does not reach the "$" topics
    return ((child, index, below) for index, (name, child) in named if name[:1] != "$")


def _nodes(root: Any, levels: list[str], resume: Path) -> Iterator[tuple[Path, Any, bool]]:
    """(path, node, whether the filter matches its topic) in pre-order, from the node at
    ``resume`` (child indexes from the root; the next one if it is gone) on."""
    last = len(levels)
    frames: list[tuple[int, Path, Iterator[_Child]]] = []  # nodes whose children are walked
    current: _Visit | None = (root, 0, (), False)
    for index in resume:
        assert current is not None
        node, depth, path, whole = current
        children = _children(node, levels, depth, whole, index)
        frames.append((depth, path, children))
        found = next(children, None)
        if found is None:
            current = None
            break
        child, position, below = found
        current = (child, depth + 1, (*path, position), below)
        if position != index:
            break  # the node at the cursor is gone: on from the next one
    while True:
        if current is not None:
            node, depth, path, whole = current
            yield path, node, whole or depth == last or (depth > 0 and levels[depth] == "#")
            frames.append((depth, path, _children(node, levels, depth, whole, 0)))
            current = None
        while frames:
            depth, path, children = frames[-1]
            found = next(children, None)
            if found is None:
                frames.pop()
                continue
            child, position, below = found
            current = (child, depth + 1, (*path, position), below)
            break
        if current is None:
            return

"""Topic-filter algebra for access control: does a filter match a topic, does one filter match
everything another does (``covers``), can two filters match a common topic (``overlaps``).

Filters and topics are given split into levels. The ``$`` rule holds throughout (MQTT-4.7.2-1):
a filter starting with ``+`` or ``#`` matches no topic starting with ``$``.
"""

from __future__ import annotations

from ..broker.topics import matches_levels

Levels = tuple[str, ...]


def split(text: str) -> Levels:
    return tuple(text.split("/"))


def _wild(level: str) -> bool:
    return level == "+" or level == "#"


# Whether the filter ``pattern`` matches the topic name ``topic``: the broker's own matcher.
matches = matches_levels


def covers(outer: Levels, inner: Levels) -> bool:
    """Whether every topic the filter ``inner`` matches is matched by the filter ``outer``.

    Exact for single filters; a filter that only a union of several filters covers is not
    reported as covered (access control then errs on the side of refusing)."""
    for index, level in enumerate(outer):
        if level == "#":
            # "#" at the top matches no "$" topic, which an inner filter with a "$" literal there
            # reaches; an inner wildcard there reaches none.
            return not (index == 0 and inner[0].startswith("$"))
        if index >= len(inner):
            return False  # outer needs more levels than some topics of inner have
        other = inner[index]
        if other == "#":
            # inner reaches any depth, and the parent level; "+/#" at the top still covers it
            # (a topic has at least one level), nowhere else ("a/+/#" misses "a").
            return index == 0 and level == "+" and outer[1:2] == ("#",)
        if level == "+":
            if index == 0 and other.startswith("$"):
                return False
            continue
        if other != level:
            return False  # inner is "+" (any name) or another literal
    return len(outer) == len(inner)


def overlaps(first: Levels, second: Levels) -> bool:
    """Whether some topic is matched by both filters."""
    a0, b0 = first[0], second[0]
    if _wild(a0) and not _wild(b0) and b0.startswith("$"):
        return False
    if _wild(b0) and not _wild(a0) and a0.startswith("$"):
        return False
    for index in range(max(len(first), len(second))):
        a = first[index] if index < len(first) else None
        b = second[index] if index < len(second) else None
        if a == "#" or b == "#":
            return True  # "#" also matches the parent level, so a shorter filter still meets it
        if a is None or b is None:
            return False
        if a == "+" or b == "+" or a == b:
            continue
        return False
    return True

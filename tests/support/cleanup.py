"""What a test starts is ended after it: ``ended_after`` is the body of every fixture that
hands a test a factory (brokers, clients, harnesses) and cleans up what it made."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


@contextmanager
def ended_after(end: Callable[[T], object]) -> Iterator[Callable[[T], T]]:
    """``keep``: each thing given to it is ended with ``end`` when the block (the test) is over,
    in the order made, also when the test failed."""
    made: list[T] = []

    def keep(thing: T) -> T:
        made.append(thing)
        return thing

    try:
        yield keep
    finally:
        for thing in made:
            end(thing)

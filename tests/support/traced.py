"""What an operation leaves allocated, measured with ``tracemalloc``: the memory tests' one way."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def bytes_per(
    items: Sequence[T], each: Callable[[T], object], settle: Callable[[], object] = lambda: None
) -> float:
    """The bytes still allocated per item after ``each(item)`` for every one of ``items`` and
    then ``settle()``, garbage collected before and after."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for item in items:
            each(item)
        settle()
        gc.collect()
        return (tracemalloc.get_traced_memory()[0] - before) / len(items)
    finally:
        tracemalloc.stop()

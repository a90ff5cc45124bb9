"""Giving the allocator's free memory back to the system once a burst of connections is over.

A storm of connections (devices reconnecting after a restart, say) allocates far more for a
while than the connections keep: a TLS handshake in progress holds its buffers, key exchange and
transcript (tens of KiB), and with a thousand in progress at once the C heap grows by that much.
When they end, malloc keeps what they freed: glibc returns memory to the system only from the top
of its heaps, and the connections' lasting allocations (their SSL objects, made during the same
storm) sit between the freed chunks. The process's RSS then stays at the storm's peak, 2-3 KiB
per TLS connection more than the connections hold. ``malloc_trim(0)`` gives the pages of those
free chunks back (madvise), whatever lies around them; it takes a few milliseconds for a heap of
100 MB, outside the GIL.

:class:`Trimmer` calls it from the broker's periodic pass (every 0.5 s): once at least ``burst``
connections have come or gone since it last did, and the last period saw fewer than ``quiet``
(the burst is over: trimming within one would only give back pages that the next connections
fault in again). Steady churn above ``quiet`` per period never trims, which is as well: there the
freed memory is used again at once. Only with glibc; elsewhere :func:`malloc_trim` is None and
nothing is done."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

BURST = 64  # connections come or gone since the last trim, at least
QUIET = 16  # ... and fewer than this in the last period


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)`` as a function (ctypes releases the GIL around it), or None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return lambda: trim(0)


malloc_trim = _malloc_trim()


class Trimmer:
    """Calls ``trim`` after a burst of connections: see the module's docstring."""

    __slots__ = ("trim", "burst", "quiet", "connects", "open", "churn", "trims")

    def __init__(
        self,
        trim: Callable[[], object] | None = malloc_trim,
        burst: int = BURST,
        quiet: int = QUIET,
    ) -> None:
        self.trim = trim
        self.burst = burst
        self.quiet = quiet
        self.connects = 0  # the broker's CONNECT count at the last tick
        self.open = 0  # its open connections then
        self.churn = 0  # connections come or gone since the last trim
        self.trims = 0

    def tick(self, connects: int, open_connections: int) -> bool:
        """One period: ``connects``, the CONNECT packets received so far, and the connections
        open now. True if it trimmed."""
        came = connects - self.connects
        gone = max(0, came - (open_connections - self.open))  # came, less what stayed
        self.connects, self.open = connects, open_connections
        recent = came + gone
        self.churn += recent
        if self.trim is None or self.churn < self.burst or recent >= self.quiet:
            return False
        self.churn = 0
        self.trims += 1
        self.trim()
        return True

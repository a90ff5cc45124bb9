"""``busy_poll_us``: trade a core's idle time for latency.

Between two messages an idle broker sleeps in the kernel's poll, and the next message pays for
the wake-up: the scheduler, the CPU leaving its idle state and, on a virtual machine, the host
giving the virtual CPU back. At light load that wake-up is most of the delivery latency and all
of its tail, for any broker (benchmarks/README.md, scenario 5, has the figures).

With ``busy_poll_us`` set, every loop pass that produced output (or left input over for the next
pass) keeps the loop polling its sockets without sleeping (a zero-timeout poll per pass) for that
long. While messages keep arriving closer together than the window the core never sleeps and no
wake-up is paid; once the traffic stops, the loop sleeps again after the window. The cost is one
core at 100% while it spins, so it is off unless set.

The broker's own threads (the SQLite store's writer, password checks) share the core: each spin
pass yields it (``sched_yield``), and the loop lets go of the GIL in every poll, so a thread that
is ready runs at once: a spin that did not yield would starve the SQLite writer that the
acknowledgements of persistent sessions wait for.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

_yield_cpu: Callable[[], None] = getattr(os, "sched_yield", lambda: None)  # not on Windows


class BusyPoll:
    """The scheduler's :attr:`~mqttbroker.broker.passes.PassScheduler.wake` when
    ``busy_poll_us`` is set: schedules the flush, as the plain wake does, and keeps the loop
    spinning for ``window`` seconds after the last wake."""

    __slots__ = ("loop", "flush", "window", "clock", "spinning", "woken", "deadline", "_spin_cb")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        flush: Callable[[], None],
        window: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.loop = loop
        self.flush = flush
        self.window = window
        self.clock = clock
        self.spinning = False  # a spin pass is scheduled
        self.woken = False  # output since the last spin pass: the window starts again
        self.deadline = 0.0
        self._spin_cb = self._spin

    def wake(self) -> None:
        self.loop.call_soon(self.flush)
        self.woken = True
        if not self.spinning:
            self.spinning = True
            self.loop.call_soon(self._spin_cb)

    def stop(self) -> None:
        """No more spinning (shutdown): the current window ends at the next pass, and later
        wakes only schedule the flush."""
        self.window = 0.0
        self.woken = False
        self.deadline = 0.0

    def _spin(self) -> None:
        # A callback in the ready queue makes the loop's next poll a zero-timeout one (asyncio
        # and uvloop alike), so rescheduling ourselves is the spin.
        now = self.clock()
        if self.woken:
            self.woken = False
            self.deadline = now + self.window
        if now < self.deadline:
            _yield_cpu()
            self.loop.call_soon(self._spin_cb)
        else:
            self.spinning = False

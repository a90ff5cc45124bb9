"""The info lines about clients: connected, disconnected, connection lost, and what takes their
place when thousands connect at once.

A line per client is what an operator reads to follow one device, but written for every one of
a connection storm it costs about as much as the connection itself (the logging module's record,
formatting and escaping, and a write per line). So the lines are written one by one up to
``connection_log_rate`` a second; past that, the rest of the second is counted and one line
gives the counts once the second is over. ``connection_log_interval = N`` counts every client
instead, in one line every N seconds; ``connection_log_rate = 0`` writes every line.
"""

from __future__ import annotations

import logging

from .options import BrokerOptions

log = logging.getLogger("mqttbroker.connection")  # the lines of each client
counts_log = logging.getLogger("mqttbroker.broker")  # the lines counting them


class ConnectionLog:
    """Writes or counts the line of each client connected, disconnected or lost. Counting works
    in windows: within one, ``allowed`` lines are written one by one and the rest counted; the
    first event or tick (:meth:`tick`, twice a second) after the window's end writes the
    counts, if any, and starts the next window."""

    def __init__(self, options: BrokerOptions) -> None:
        self.interval = options.connection_log_interval
        self.rate = options.connection_log_rate
        # Counting at all: with an interval (nothing one by one), or with a rate.
        self.counting = bool(self.interval or self.rate)
        self.window = self.interval or 1.0  # seconds
        self.allowed = 0 if self.interval else self.rate  # lines one by one per window
        self.window_ends = 0.0
        self.lines = 0  # written one by one in this window
        # Counted, not written one by one, in this window.
        self.connected_count = 0
        self.disconnected_count = 0
        self.lost_count = 0

    def connected(
        self,
        now: float,
        client_id: str,
        peer: str,
        version: str,
        transport: str,
        username: str | None,
        keep_alive: int,
        resumed: bool,
    ) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        if self._one_by_one(now):
            log.info(
                "client %s connected from %s (MQTT %s over %s, user %r, keep alive %ds, "
                "session %s)",
                client_id,
                peer,
                version,
                transport,
                username,
                keep_alive,
                "resumed" if resumed else "new",
            )
        else:
            self.connected_count += 1

    def disconnected(self, now: float, client_id: str, reason_code: int) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        if self._one_by_one(now):
            log.info("client %s disconnected (reason 0x%02X)", client_id, reason_code)
        else:
            self.disconnected_count += 1

    def lost(self, now: float, client_id: str) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        if self._one_by_one(now):
            log.info("client %s: connection lost", client_id)
        else:
            self.lost_count += 1

    def tick(self, now: float) -> None:
        """Writes the counts of a window that has ended (none when nothing was counted)."""
        if self.counting and now >= self.window_ends:
            self._next_window(now)

    def _one_by_one(self, now: float) -> bool:
        if not self.counting:
            return True
        if now >= self.window_ends:
            self._next_window(now)
        if self.lines < self.allowed:
            self.lines += 1
            return True
        return False

    def _next_window(self, now: float) -> None:
        if self.connected_count or self.disconnected_count or self.lost_count:
            if self.interval:
                counts_log.info(
                    "in the last %gs: %d clients connected, %d disconnected, %d connections lost",
                    self.interval,
                    self.connected_count,
                    self.disconnected_count,
                    self.lost_count,
                )
            else:
                counts_log.info(
                    "past %d lines in 1s (connection_log_rate): %d more clients connected, "
                    "%d disconnected, %d connections lost",
                    self.rate,
                    self.connected_count,
                    self.disconnected_count,
                    self.lost_count,
                )
            self.connected_count = self.disconnected_count = self.lost_count = 0
        self.lines = 0
        self.window_ends = now + self.window

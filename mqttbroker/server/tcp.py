"""The TCP listener: an asyncio Protocol per socket that hands bytes to a broker Connection.

It is the Link the connection writes through. Nothing here parses or decides anything. On a TLS
listener TLS sits underneath (OpenSSL in the C transport, streams.py, or the Python TLS layer,
tlslayer.py): the Protocol sees plain bytes, after the handshake; the user name the client's verified certificate gives, when the listener has
``tls_certificate_username`` (see ``tls.py``), is handed to the broker with the listener's
policy when the connection is made.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from ..broker.connection import Connection
from ..broker.core import Broker
from ..broker.policy import OPEN, ListenerPolicy
from ..config import ListenerConfig
from .tls import certificate_user

log = logging.getLogger("mqttbroker.tcp")

# Bytes a slow subscriber's socket may buffer before the broker stops writing to it (QoS 0 is
# then dropped and counted, QoS 1/2 waits in the session queue).
WRITE_HIGH_WATER = 4 * 1_048_576
# Seconds a closed connection's client has to read what is still buffered for it: after the
# broker's close, and after the client's EOF (a half-closed client that does not read would
# otherwise keep its socket for ever: the transport closes only once its buffer is written).
CLOSE_GRACE = 10.0

# The lingering close (as nginx's): when the broker closes a connection (after a DISCONNECT or a
# refusing CONNACK) it shuts down its sending side and reads and discards what the client still
# sends, until the client closes, LINGER_SECONDS pass or LINGER_BYTES arrive, and only then
# closes. Closing at once would answer the client's next segment with a reset: its next write
# fails, or its stack discards the DISCONNECT it has not read yet, and the reason is lost. Over
# TLS the sending side's shutdown is the close_notify (see close()).
LINGER_SECONDS = 2.0
LINGER_BYTES = 1_048_576


class Graces:
    """The close graces of one event loop's connections (see CLOSE_GRACE): each protocol armed,
    with its end, in the order they were armed (so in the order of their ends: the grace is one
    for all), and one timer of the loop for the earliest. The client's EOF arms a grace on
    nearly every connection that ends, and connection_lost, which nearly always comes at once,
    disarms it: a timer of the loop for each would be made and cancelled per connection (in
    uvloop a libuv timer, started, stopped and closed), a cost to be seen beside a TLS
    handshake's (benchmarks/README.md, "TLS in the C transport"). Here arming and disarming are
    a dictionary's insertion and removal; the timer, when one is armed already, stays."""

    __slots__ = ("loop", "due", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.due: dict[MQTTProtocol, float] = {}
        self.timer: asyncio.TimerHandle | None = None

    def arm(self, protocol: MQTTProtocol) -> None:
        """Abort ``protocol``'s transport CLOSE_GRACE seconds from now, unless disarmed."""
        self.due[protocol] = self.loop.time() + CLOSE_GRACE
        if self.timer is None:
            self.timer = self.loop.call_later(CLOSE_GRACE, self._expire)

    def disarm(self, protocol: MQTTProtocol) -> None:
        self.due.pop(protocol, None)

    def _expire(self) -> None:
        """Abort the transports whose grace is over; the timer again for the next end."""
        self.timer = None
        due = self.due
        now = self.loop.time() + 0.001  # (the loop's timers are of milliseconds)
        while due:
            protocol = next(iter(due))
            end = due[protocol]
            if end > now:
                self.timer = self.loop.call_at(end, self._expire)
                return
            del due[protocol]
            try:
                protocol.grace_over()
            except Exception:  # the others' graces end all the same
                log.exception("aborting a connection after its close grace failed")


# The graces of the loop that armed one last (one broker runs on one loop). Another loop's
# gets its own; a protocol disarms where it armed (MQTTProtocol.grace), so two of one loop
# (loops taking turns, in tests) would only mean two timers.
_graces: list[Graces] = []


def graces_of(loop: asyncio.AbstractEventLoop) -> Graces:
    """The close graces of ``loop``."""
    if _graces and _graces[0].loop is loop:
        return _graces[0]
    graces = Graces(loop)
    _graces[:] = [graces]
    return graces


def peer_name(peer: object) -> str:
    """A socket's peer as the log names it: "address:port" (a Unix socket's path as it is)."""
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)


class ListenerContext:
    """What the connections of one listener share: the broker, the listener's configuration
    and its rules, one object that each connection's protocol refers to. ``origin``: (name,
    address) of the client a PROXY protocol header named (proxy.py), which the log and the
    per-address limit then use instead of the socket's peer: such a connection has a context
    of its own (:meth:`for_origin`), so that the others keep no field for it."""

    __slots__ = ("broker", "listener", "policy", "origin")

    def __init__(
        self,
        broker: Broker,
        listener: ListenerConfig | None = None,
        policy: ListenerPolicy = OPEN,
        origin: tuple[str, str | None] | None = None,
    ) -> None:
        self.broker = broker
        self.listener = listener if listener is not None else ListenerConfig()
        self.policy = policy
        self.origin = origin

    def for_origin(self, origin: tuple[str, str | None]) -> ListenerContext:
        """This context, for a connection whose client a PROXY header named ``origin``."""
        return ListenerContext(self.broker, self.listener, self.policy, origin)


class MQTTProtocol:
    """An asyncio protocol (it has every method of ``asyncio.Protocol``, and is compiled, so it
    does not derive from that Python class: the event loop calls a read straight into C)."""

    __slots__ = (
        "context",
        "transport",
        "conn",
        "lingering",
        "grace",
    )

    def __init__(self, context: ListenerContext) -> None:
        self.context = context
        self.transport: asyncio.Transport | None = None
        self.conn: Connection | None = None
        self.lingering = -1  # while lingering: the bytes discarded so far
        self.grace: Graces | None = None  # where the abort after CLOSE_GRACE is armed, once it is

    @property
    def listener(self) -> ListenerConfig:
        """The listener this connection came through (the dashboard's and metrics' label)."""
        return self.context.listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        context = self.context
        if context.origin is None:
            name, address = peer_name(transport.get_extra_info("peername")), None
        else:
            name, address = context.origin
        field = context.listener.tls_certificate_username
        user = None
        if field != "none":
            user = certificate_user(transport.get_extra_info("peercert"), field)
            log.debug("connection from %s: client certificate user %r", name, user)
        self.conn = context.broker.connect(self, name, address, context.policy, user)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None:
            self._discard(len(data))
            return
        conn.broker.scheduler.handle_read(conn, data)

    def eof_received(self) -> bool:
        # The client sends nothing more: the transport closes once what is buffered is written.
        # A client that does not read it would keep the socket for ever (and keep alive, which
        # finds the transport closing already, would only uncount it): CLOSE_GRACE seconds.
        self._arm_grace()
        return False  # close our side too

    def _arm_grace(self) -> None:
        """Abort the transport CLOSE_GRACE seconds from now, unless it has closed by then."""
        if self.grace is None and self.transport is not None:
            graces = graces_of(asyncio.get_running_loop())
            graces.arm(self)
            self.grace = graces

    def grace_over(self) -> None:
        """The close grace ran out (Graces): abort the transport."""
        self.grace = None
        transport = self.transport
        if transport is not None:
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        grace = self.grace
        if grace is not None:
            grace.disarm(self)
            self.grace = None
        conn = self.conn
        if conn is not None:
            conn.connection_lost()
            self.conn = None  # no reference cycle left for the garbage collector

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.pause_writing()

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.resume_writing()

    # Link
    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        """Close after the broker's last packet, lingering (see LINGER_SECONDS): the sending side
        is shut down after what is buffered (TCP: a FIN; TLS: a close_notify), what the client
        still sends is read and discarded, and the socket closes when the client closes, or
        after LINGER_SECONDS or LINGER_BYTES."""
        transport = self.transport
        if transport is None or self.lingering >= 0:
            return
        if transport.is_closing():
            # Closing already (after the client's EOF, say: keep alive ran out meanwhile), and
            # maybe still writing: bounded as below (eof_received armed it; a no-op then). Not
            # once connection_lost has come (it let go of the connection): nothing to bound.
            if self.conn is not None:
                self._arm_grace()
            return
        loop = asyncio.get_running_loop()
        buffered = transport.get_write_buffer_size()
        if buffered:
            # A client that does not read would keep the socket, and what waits for it, for
            # ever: it has CLOSE_GRACE seconds to take it.
            self._arm_grace()
        self.lingering = 0
        self.conn = None  # closed: what the client still sends is discarded
        transport.resume_reading()
        if transport.can_write_eof():
            transport.write_eof()  # after what is buffered: the client reads it all, then EOF
            loop.call_later(LINGER_SECONDS, transport.close)
        else:
            # TLS: close() sends the close_notify after what is buffered, then waits for the
            # client's close_notify or EOF (the TLS transport drops what the client still
            # sends meanwhile; cut short here), once the TLS read that brought us here is over
            # (the SSL object is not shut down while it reads records).
            loop.call_soon(transport.close)
            if not buffered:
                loop.call_later(LINGER_SECONDS, transport.abort)

    def _discard(self, count: int) -> None:
        self.lingering += count
        transport = self.transport
        if self.lingering > LINGER_BYTES and transport is not None:
            # TLS is closing already: abort it; TCP's close() still sends what is buffered
            if transport.is_closing():
                transport.abort()
            else:
                transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def buffered(self) -> int:
        return 0 if self.transport is None else self.transport.get_write_buffer_size()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

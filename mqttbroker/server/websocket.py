"""MQTT over WebSocket (``ws://`` and ``wss://``) on aiohttp: the Link of a connection whose
bytes travel in WebSocket binary frames (MQTT 5.0 section 6).

- The handshake must offer the subprotocol ``mqtt`` (``mqttv3.1`` is accepted for MQTT 3.1
  clients); it is selected and returned (MQTT-6.0.0-3, -4). A request without it gets HTTP 400.
- Only binary data frames carry MQTT. Any other data frame (text) closes the connection
  (MQTT-6.0.0-1) with WebSocket close code 1003, unsupported data.
- Frames and packets are independent (MQTT-6.0.0-2): the payload of every binary message goes to
  ``Connection.data_received``, which joins a packet spread over several messages and walks
  several packets in one. (aiohttp itself joins the fragments of one fragmented message.)
- Ping/pong control frames are answered by aiohttp; MQTT's keep alive is the broker's business.
  permessage-deflate is not offered: it would make sending asynchronous and costly.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from ..broker.connection import Connection
from ..broker.core import Broker
from ..broker.policy import OPEN, ListenerPolicy
from ..config import IPNetwork, ListenerConfig, trusted_networks
from .proxy import IPAddress, ip_of, within
from .tcp import WRITE_HIGH_WATER, peer_name
from .tls import certificate_user

log = logging.getLogger("mqttbroker.websocket")

# The request handlers (one per accepted connection) that reached the WebSocket upgrade.
UPGRADED = web.AppKey("upgraded", set)

SUBPROTOCOLS = ("mqtt", "mqttv3.1")
# The writer stops the connection's output (Connection.pause_writing) past this many bytes
# written and not yet accepted by the socket, and resumes it at a quarter of it.
WRITE_LOW_WATER = WRITE_HIGH_WATER // 4
# Output that piled up while a send waited is joined into frames of about this size.
FRAME_TARGET = 256 * 1024
CLOSE_TIMEOUT = 5.0  # seconds to wait for the client's answer to our close frame
SHUTDOWN_TIMEOUT = 2.0  # seconds aiohttp gives the handlers at shutdown before cancelling them


class WebSocketLink:
    """The Link of one WebSocket connection (``write``, ``close``, ``pause_reading``,
    ``resume_reading``), and the loop that reads its frames.

    Writing. The broker calls ``write`` synchronously from its flush, once per connection per
    event-loop pass, but aiohttp sends through a coroutine. Each connection therefore has one
    writer task for its whole life (not a task per message), fed by a plain list and an Event:
    ``write`` appends the bytes and wakes the task, which sends what has piled up as one binary
    frame (joined up to ``FRAME_TARGET``) per wake-up. Without compression aiohttp's send writes
    to the transport at once and only suspends while the socket's buffer is full, so a reading
    client costs one frame per flush and one loop iteration of latency.

    The list is bounded the way a TCP transport's buffer is: past ``WRITE_HIGH_WATER`` bytes not
    yet taken by the socket (queued or in a send that waits for the socket to drain), the
    connection is told ``pause_writing`` (the broker then queues QoS 1/2 in the session and
    drops QoS 0, counted), and ``resume_writing`` once it is below ``WRITE_LOW_WATER``. Writing
    through aiohttp's public API keeps its framing, closing handshake and TLS in charge, instead
    of writing frames to the transport behind its back.

    Reading. ``pause_reading`` stops calling ``receive()``; aiohttp then stops reading the
    socket once its own queue holds 128 KiB, which is the backpressure TCP's pause_reading gives.

    ``certificate_user`` is the user name a verified client certificate gives (wss:// with
    ``tls_certificate_username``), or None; the broker gets it with the listener's ``policy``.
    """

    __slots__ = (
        "ws",
        "listener",
        "policy",
        "certificate_user",
        "broker",
        "conn",
        "_out",
        "_buffered",
        "_wake",
        "_closing",
        "_close_code",
        "_reading",
        "_write_paused",
    )

    def __init__(
        self,
        ws: web.WebSocketResponse,
        listener: ListenerConfig,
        user: str | None = None,
        policy: ListenerPolicy = OPEN,
    ) -> None:
        self.ws = ws
        self.listener = listener
        self.policy = policy
        self.certificate_user = user
        self.broker: Broker | None = None  # set by serve(); counts the bytes
        self.conn: Connection | None = None
        self._out: list[bytes] = []
        self._buffered = 0  # bytes written to us and not yet taken by the transport
        self._wake = asyncio.Event()
        self._closing = False
        self._close_code: int = WSCloseCode.OK
        self._reading = asyncio.Event()
        self._reading.set()
        self._write_paused = False

    # -- Link -------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._closing or not data:
            return
        self._out.append(data)
        self._buffered += len(data)
        self._wake.set()
        if not self._write_paused and self._buffered > WRITE_HIGH_WATER:
            self._write_paused = True
            if self.conn is not None:
                self.conn.pause_writing()

    def close(self) -> None:
        """Send what is written, then the close frame; the reading loop ends with it."""
        if not self._closing:
            self._closing = True
            self._wake.set()
            self._reading.set()

    def abort(self) -> None:
        self._abort(WSCloseCode.POLICY_VIOLATION)

    def buffered(self) -> int:
        return self._buffered

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    # -- the connection's life --------------------------------------------------------------

    async def serve(self, broker: Broker, peer: str, address: str | None = None) -> None:
        """Read frames until either side closes; the writer task lives as long. ``address``:
        the client's, when a trusted proxy named it (``peer`` is then "address (via proxy)")."""
        self.broker = broker
        conn = self.conn = broker.connect(self, peer, address, self.policy, self.certificate_user)
        writer = asyncio.create_task(self._write_loop())
        ws = self.ws
        try:
            while True:
                if not self._reading.is_set():
                    await self._reading.wait()
                if self._closing:
                    break
                msg = await ws.receive()
                kind = msg.type
                if kind is WSMsgType.BINARY:
                    conn.data_received(msg.data)
                elif kind is WSMsgType.TEXT:
                    log.warning(
                        "connection from %s: WebSocket text frame; MQTT travels in binary "
                        "frames only: closing",
                        peer,
                    )
                    self._abort(WSCloseCode.UNSUPPORTED_DATA)
                    break
                else:  # CLOSE, CLOSING, CLOSED, ERROR: the client went or the link closed
                    if kind is WSMsgType.ERROR:
                        log.info("connection from %s: WebSocket error: %s", peer, msg.data)
                    break
        finally:
            conn.connection_lost()  # nothing if the broker closed it
            self.conn = None  # no reference cycle left for the garbage collector
            if self._closing and not writer.done():
                try:  # let the writer send what is left and the close frame
                    await asyncio.wait_for(asyncio.shield(writer), CLOSE_TIMEOUT + 1)
                except TimeoutError:
                    writer.cancel()
                except asyncio.CancelledError:
                    writer.cancel()
                    raise
            else:
                writer.cancel()

    def _abort(self, code: int) -> None:
        """Close at once with ``code``, dropping unsent output (the client broke the rules)."""
        self._out.clear()
        self._buffered = 0
        self._close_code = code
        self.close()
        if self.conn is not None:
            self.conn.connection_lost()

    async def _write_loop(self) -> None:
        ws = self.ws
        out = self._out
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while out:
                    count = 1
                    size = len(out[0])
                    while count < len(out) and size + len(out[count]) <= FRAME_TARGET:
                        size += len(out[count])
                        count += 1
                    data = out[0] if count == 1 else b"".join(out[:count])
                    del out[:count]
                    await ws.send_bytes(data)
                    self._buffered -= size
                    if self._write_paused and self._buffered <= WRITE_LOW_WATER:
                        self._write_paused = False
                        if self.conn is not None:
                            self.conn.resume_writing()
                if self._closing:
                    await ws.close(code=self._close_code)
                    return
        except ConnectionError:
            pass  # the client went away; the reading loop sees it too
        except Exception:
            log.exception("WebSocket writer failed")
            await ws.close(code=WSCloseCode.INTERNAL_ERROR)
        finally:
            out.clear()
            self._buffered = 0
            self._closing = True
            self._reading.set()  # a paused reading loop must see the end too


def make_app(
    broker: Broker, listener: ListenerConfig, policy: ListenerPolicy = OPEN
) -> web.Application:
    """An aiohttp application with one route: GET ``listener.ws_path``."""
    max_msg_size = max(4 * 1_048_576, broker.options.max_packet_size + 16)
    trusted = trusted_networks(listener.ws_trusted_proxies)

    async def handle(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(
            protocols=SUBPROTOCOLS,
            autoping=True,
            compress=False,
            max_msg_size=max_msg_size,
            timeout=CLOSE_TIMEOUT,
        )
        ready = ws.can_prepare(request)
        if not ready.ok:
            return web.Response(
                status=400, text="MQTT over WebSocket: expected a WebSocket upgrade\n"
            )
        if ready.protocol is None:
            return web.Response(
                status=400, text='MQTT over WebSocket: the subprotocol "mqtt" is required\n'
            )
        await ws.prepare(request)
        request.app[UPGRADED].add(request.protocol)
        transport = request.transport
        peername = transport.get_extra_info("peername") if transport else None
        peer = peer_name(peername)
        address = None
        if trusted and isinstance(peername, tuple):
            address = forwarded_client(
                peername[0], request.headers.getall("X-Forwarded-For", []), trusted
            )
            if address is not None:
                peer = f"{address} (via {peer})"
        user = None
        if listener.tls_certificate_username != "none" and transport is not None:
            cert = transport.get_extra_info("peercert")
            user = certificate_user(cert, listener.tls_certificate_username)
        await WebSocketLink(ws, listener, user, policy).serve(broker, peer, address)
        return ws

    app = web.Application()
    app[UPGRADED] = set()
    app.router.add_get(listener.ws_path, handle)
    return app


def bounded(web_server: web.Server, app: web.Application, timeout: float) -> Any:
    """aiohttp's protocol factory, except that a connection which is not a WebSocket
    ``timeout`` seconds after it was accepted (no request, a request never finished, or only
    refused ones) is closed: until the upgrade the broker does not know it, so neither its
    ``connect_timeout`` nor its connection limits would stop a client holding sockets open."""
    loop = asyncio.get_running_loop()
    upgraded = app[UPGRADED]

    def expire(handler: Any) -> None:
        if handler in upgraded:
            upgraded.discard(handler)
            return
        transport = handler.transport
        if transport is not None and not transport.is_closing():
            peer = peer_name(transport.get_extra_info("peername"))
            log.info("connection from %s: no WebSocket upgrade within %gs; closing", peer, timeout)
            transport.close()

    def factory() -> Any:
        handler = web_server()
        loop.call_later(timeout, expire, handler)
        return handler

    return factory


def forwarded_client(proxy: str, values: list[str], trusted: tuple[IPNetwork, ...]) -> str | None:
    """The client's address by the X-Forwarded-For header(s) ``values`` of a request from
    ``proxy``, or None when the header does not count: ``proxy`` is not trusted, there is no
    header, or it is malformed. Each proxy appends the address it got the request from, so the
    client is the right-most entry that is not itself a trusted proxy (anything left of it may
    have been written by the client). Empty entries are skipped (RFC 9110, section 5.6.1)."""
    peer = ip_of(proxy)
    if not values or peer is None or not within(peer, trusted):
        return None
    chosen = None
    for entry in reversed([e.strip() for value in values for e in value.split(",")]):
        if not entry:
            continue
        address = _entry_ip(entry)
        if address is None:
            log.info("X-Forwarded-For from %s ignored: %r is not an address", proxy, entry)
            return None
        chosen = address
        if not within(address, trusted):
            break
    return None if chosen is None else str(chosen)


def _entry_ip(entry: str) -> IPAddress | None:
    """An X-Forwarded-For entry: "203.0.113.7", "2001:db8::1", or with a port as some proxies
    write it, "203.0.113.7:4711" or "[2001:db8::1]:4711"."""
    if entry.startswith("["):
        inside, bracket, port = entry[1:].partition("]")
        if not bracket or (port and not (port[0] == ":" and port[1:].isdigit())):
            return None
        entry = inside
    elif entry.count(":") == 1:
        entry, _, port = entry.partition(":")
        if not port.isdigit():
            return None
    return ip_of(entry)

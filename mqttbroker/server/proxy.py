"""The PROXY protocol (HAProxy's, versions 1 and 2) on MQTT listeners behind a TCP load balancer.

A load balancer that forwards TCP (HAProxy in ``mode tcp`` with ``send-proxy`` or
``send-proxy-v2``, AWS Network Load Balancer, Traefik, nginx ``stream`` with ``proxy_protocol
on``) hides the client's address: every connection comes from the balancer. With the PROXY
protocol it first sends one header naming the client, then the client's bytes. A listener with
``proxy_protocol`` set to the balancers' addresses or networks:

- accepts connections only from those addresses (anyone else could name any client);
- requires the header on every connection, version 1 (text) or 2 (binary), told apart by their
  first bytes, as the protocol's specification allows; nothing is guessed: a connection that
  does not start with a valid header is closed, and one that sends none within
  ``connect_timeout`` too (one that ends before its header is complete, as a balancer's TCP
  health check does, goes unlogged);
- then treats the connection as the named client's: that address is logged ("203.0.113.7:4711
  (via 10.0.0.5:40112)") and counted against ``max_connections_per_address``. A version 2
  LOCAL header (the balancer's own health check), a version 1 ``UNKNOWN`` and a version 2 header
  without an IP address keep the socket's address, as the specification says: they count as the
  balancer.

On a TLS listener the header comes first, in clear, and the client's TLS handshake follows on the
same connection: the balancer passes TLS through (HAProxy ``mode tcp``, an NLB TCP listener), so
the broker still terminates it and client certificates (mutual TLS) still work. That is why the
header is read here, off the raw socket and not one byte beyond it, before the loop makes a
transport of the socket; asyncio's ``create_server`` would have begun TLS at once. WebSocket
listeners read X-Forwarded-For instead (``ws_trusted_proxies``).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from ..config import IPNetwork
from .tcp import peer_name
from .tlslayer import TLSLayer

log = logging.getLogger("mqttbroker.proxy")

ACCEPT_RETRY = 1.0  # seconds before accepting again after it failed (out of descriptors)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
V1_MAX = 107  # the longest version 1 header, CRLF included
V2_FIXED = 16  # signature, version and command, family, length
# Byte 14 of a version 2 PROXY header: UNSPEC, or TCP over IPv4, IPv6 or a Unix socket. The
# datagram ones (0x12, 0x22, 0x32) are valid but not for MQTT, which runs over streams.
V2_FAMILIES = (0x00, 0x11, 0x21, 0x31)


def ip_of(text: str) -> IPAddress | None:
    """An address, an IPv4-mapped IPv6 one (a dual-stack socket's) as the IPv4 address it is."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def within(ip: IPAddress, networks: tuple[IPNetwork, ...]) -> bool:
    return any(ip in network for network in networks)


class ProxyHeaderError(ValueError):
    """The connection does not start with a valid PROXY protocol header."""


class Header(NamedTuple):
    size: int  # bytes of the header: the client's own bytes start here
    client: tuple[str, int] | None  # (address, port), None: use the socket's (LOCAL, UNKNOWN)


def read_header(data: bytes) -> Header | None:
    """The PROXY header at the start of ``data``, or None while it may still be incomplete.
    Raises :class:`ProxyHeaderError` as soon as ``data`` cannot start with a valid one."""
    if data[:12] == V2_SIGNATURE[: len(data)]:
        return _read_v2(data) if len(data) >= 12 else None
    if data[:6] == V1_PREFIX[: len(data)]:
        return _read_v1(data) if len(data) >= 6 else None
    raise ProxyHeaderError("no PROXY protocol header")


def _read_v1(data: bytes) -> Header | None:
    end = data.find(b"\r\n", 0, V1_MAX)
    if end < 0:
        if len(data) >= V1_MAX:
            raise ProxyHeaderError(f"version 1 header longer than {V1_MAX} bytes")
        return None
    try:
        words = data[:end].decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise ProxyHeaderError("version 1 header is not ASCII") from None
    size = end + 2
    if len(words) >= 2 and words[1] == "UNKNOWN":
        return Header(size, None)  # the rest of the line is to be ignored
    if len(words) != 6 or words[1] not in ("TCP4", "TCP6"):
        raise ProxyHeaderError(f"malformed version 1 header: {data[:end]!r}")
    _, family, source, _, source_port, destination_port = words
    ip = ip_of(source) if _is_address(source, family) else None
    if ip is None or not (_is_port(source_port) and _is_port(destination_port)):
        raise ProxyHeaderError(f"malformed version 1 header: {data[:end]!r}")
    if not _is_address(words[3], family):
        raise ProxyHeaderError(f"malformed version 1 header: {data[:end]!r}")
    return Header(size, (str(ip), int(source_port)))


def _is_address(text: str, family: str) -> bool:
    if "%" in text:  # a scoped IPv6 address ("fe80::1%eth0") names no client elsewhere
        return False
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    return ip.version == (4 if family == "TCP4" else 6)


def _is_port(text: str) -> bool:
    # Decimal, no sign, no leading zero (the specification's form), 0 to 65535.
    return (
        text.isdigit() and text.isascii() and (text == "0" or text[0] != "0") and int(text) < 65536
    )


def _read_v2(data: bytes) -> Header | None:
    if len(data) < V2_FIXED:
        return None
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != 2:
        raise ProxyHeaderError(f"version 2 signature with version {version}")
    if command not in (0, 1):
        raise ProxyHeaderError(f"version 2 header with unknown command {command}")
    size = V2_FIXED + int.from_bytes(data[14:16], "big")
    if len(data) < size:
        return None
    if command == 0:  # LOCAL: the balancer's own connection, e.g. a health check
        return Header(size, None)
    family = data[13]
    if family not in V2_FAMILIES:  # every other value must be refused (section 2.2)
        raise ProxyHeaderError(f"version 2 header with address family and protocol 0x{family:02X}")
    body = data[V2_FIXED:size]
    if family == 0x11:  # TCP over IPv4: source, destination, source port, destination port
        if len(body) < 12:
            raise ProxyHeaderError("version 2 IPv4 addresses cut short")
        ip: IPAddress = ipaddress.IPv4Address(body[0:4])
        port = int.from_bytes(body[8:10], "big")
    elif family == 0x21:  # TCP over IPv6
        if len(body) < 36:
            raise ProxyHeaderError("version 2 IPv6 addresses cut short")
        ip = ipaddress.IPv6Address(body[0:16])
        port = int.from_bytes(body[32:34], "big")
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    elif family == 0x31:  # a Unix stream socket: no address to give
        if len(body) < 216:
            raise ProxyHeaderError("version 2 Unix addresses cut short")
        return Header(size, None)
    else:  # UNSPEC: the balancer does not know; the socket's own address
        return Header(size, None)
    return Header(size, (str(ip), port))  # what follows the addresses (TLVs) is not needed


async def receive_header(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> Header:
    """Read the PROXY header off the non-blocking ``sock`` and not one byte more: the client's
    bytes (a CONNECT, or a TLS ClientHello) stay in the socket for the transport that follows.
    Each wake-up peeks at what has arrived and consumes only what is surely header (all of it
    while the header is incomplete), so the socket never stays readable for nothing."""
    got = b""
    while True:
        await _readable(loop, sock)
        try:
            peeked = sock.recv(V1_MAX + 65536, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            continue
        if not peeked:
            raise ConnectionResetError("closed before the end of the PROXY protocol header")
        header = read_header(got + peeked)
        take = len(peeked) if header is None else header.size - len(got)
        if take:
            got += sock.recv(take)  # already there, so all of it
        if header is not None:
            return header


def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> asyncio.Future[None]:
    fd = sock.fileno()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    ready.add_done_callback(lambda _: loop.remove_reader(fd))  # cancelled too
    return ready


@dataclass(eq=False, repr=False)
class ProxyAcceptor:
    """A listener behind PROXY-protocol balancers, in place of ``loop.create_server``: it accepts
    each socket itself, admits only the balancers' addresses, reads the header within
    ``connect_timeout``, and only then hands the socket to the loop
    (``connect_accepted_socket``), with the listener's TLS when it has one, for a protocol that
    knows the client by the header. It has what the Server needs of an asyncio server:
    ``sockets``, ``close()`` and ``wait_closed()``.

    Accepting is a reader callback on each listening socket, as in asyncio's own servers, so
    that closing it leaves no accepted socket behind in a cancelled coroutine; every socket not
    yet handed to the loop is in ``_held`` and closed with its admitting task, however that
    task ends (cancelled before its first step included)."""

    loop: asyncio.AbstractEventLoop
    sockets: list[socket.socket]
    trusted: tuple[IPNetwork, ...]
    factory: Callable[[str, str | None], asyncio.BaseProtocol]
    context: ssl.SSLContext | None
    timeout: float
    # connections closed for a missing, malformed or untrusted header
    refused: int = field(default=0, init=False)
    accept_errors: int = field(default=0, init=False)
    _held: set[socket.socket] = field(default_factory=set, init=False)
    _admitting: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    _closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        for listening in self.sockets:
            self.loop.add_reader(listening.fileno(), self._accept, listening)

    def close(self) -> None:
        """Stop accepting, at once; connections still being admitted are dropped."""
        if self._closed:
            return
        self._closed = True
        for listening in self.sockets:
            self.loop.remove_reader(listening.fileno())
            listening.close()
        for task in self._admitting:
            task.cancel()  # each closes its socket as it ends

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._admitting, return_exceptions=True)

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(100):  # then let the loop serve the others
            try:
                sock, peer = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors, say: pause, as asyncio does
                self.accept_errors += 1
                log_accept_failure(listening, exc, self.accept_errors, ACCEPT_RETRY)
                self.loop.remove_reader(listening.fileno())
                self.loop.call_later(ACCEPT_RETRY, self._resume, listening)
                return
            self._held.add(sock)
            task = self.loop.create_task(self._admit(sock, peer))
            self._admitting.add(task)
            task.add_done_callback(functools.partial(self._settle, sock))

    def _resume(self, listening: socket.socket) -> None:
        if not self._closed:
            self.loop.add_reader(listening.fileno(), self._accept, listening)

    def _settle(self, sock: socket.socket, task: asyncio.Task[None]) -> None:
        self._admitting.discard(task)
        if sock in self._held:  # not handed to the loop: refused, gone, or cancelled
            self._held.discard(sock)
            sock.close()

    async def _admit(self, sock: socket.socket, peer: object) -> None:
        balancer = peer_name(peer)
        ip = ip_of(str(peer[0])) if isinstance(peer, tuple) else None
        if ip is None or not within(ip, self.trusted):
            self._refuse(balancer, "not one of this listener's proxy_protocol addresses")
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            header = await asyncio.wait_for(receive_header(self.loop, sock), self.timeout)
        except ProxyHeaderError as exc:
            self._refuse(balancer, str(exc))
            return
        except TimeoutError:
            self._refuse(balancer, "no PROXY protocol header within connect_timeout")
            return
        except OSError:
            return  # ended before its header was complete: a balancer's TCP health check, say
        if header.client is None:  # LOCAL or UNKNOWN: the socket's own address
            name, address = balancer, None
        else:
            name = f"{header.client[0]}:{header.client[1]} (via {balancer})"
            address = header.client[0]
        self._held.discard(sock)  # the loop's now, closed with its transport
        context = self.context
        if context is None:
            factory = functools.partial(self.factory, name, address)
        else:  # TLS over the plain transport, after the header (tlslayer.py)
            factory = functools.partial(self._tls, context, name, address)
        try:
            await self.loop.connect_accepted_socket(factory, sock)
        except OSError as exc:
            log.debug("connection from %s failed: %s", name, exc)

    def _tls(self, context: ssl.SSLContext, name: str, address: str | None) -> asyncio.BaseProtocol:
        app = self.factory(name, address)
        return cast(asyncio.BaseProtocol, TLSLayer(context, self.timeout, app))

    def _refuse(self, balancer: str, why: str) -> None:
        self.refused += 1
        log.log(
            logging.WARNING if self.refused & (self.refused - 1) == 0 else logging.DEBUG,
            "connection from %s closed: %s (%d closed so far)",
            balancer,
            why,
            self.refused,
        )


def log_accept_failure(listening: socket.socket, exc: OSError, failures: int, retry: float) -> None:
    """A listener stopped accepting for ``retry`` seconds (out of descriptors, say): logged at
    its 1st, 2nd, 4th... failure (``failures`` so far), so that a long shortage cannot flood the
    log. Both listeners that accept for themselves (this one and streams.py) say it so."""
    if failures & (failures - 1) == 0:
        logging.getLogger("mqttbroker").warning(
            "accept on %s failed: %s; retrying in %g s (%d failures so far)",
            peer_name(listening.getsockname()),
            exc,
            retry,
            failures,
        )


def bind(host: str, port: int, reuse_port: bool, backlog: int) -> list[socket.socket]:
    """Listening sockets for ``host``:``port``, one per address it resolves to, as
    ``loop.create_server`` binds them (SO_REUSEADDR, and SO_REUSEPORT with ``reuse_port``; IPv6
    sockets IPv6 only), each holding up to ``backlog`` connections not yet accepted."""
    sockets: list[socket.socket] = []
    try:
        seen = set()
        for family, kind, proto, _, address in socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            if (family, address) in seen:
                continue
            seen.add((family, address))
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:  # no such family here (IPv6 off, say): as create_server does
                continue
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(f"cannot make a listening socket for {host!r} port {port}")
    return sockets

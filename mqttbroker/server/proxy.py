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
  ``connect_timeout`` too;
- then treats the connection as the named client's: that address is logged ("203.0.113.7:4711
  (via 10.0.0.5:40112)") and counted against ``max_connections_per_address``. A version 2
  LOCAL header (the balancer's own health check) and a version 1 ``UNKNOWN`` keep the socket's
  address, as the specification says.

TLS is not combined with it here: the balancer terminates TLS (as an NLB TLS listener or HAProxy
``ssl`` bind does) and forwards plain MQTT with the header. A configuration with both is refused
(config.py). WebSocket listeners read X-Forwarded-For instead (``ws_trusted_proxies``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import NamedTuple, cast

from ..broker.core import Broker
from ..config import IPNetwork, ListenerConfig
from .tcp import WRITE_HIGH_WATER, MQTTProtocol, peer_name

log = logging.getLogger("mqttbroker.proxy")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
V1_MAX = 107  # the longest version 1 header, CRLF included
V2_FIXED = 16  # signature, version and command, family, length


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
    family, transport = data[13] >> 4, data[13] & 0x0F
    if transport not in (0, 1):  # UNSPEC or STREAM; MQTT does not run over datagrams
        raise ProxyHeaderError(f"version 2 header for transport {transport}, not a stream")
    body = data[V2_FIXED:size]
    if family == 1:  # AF_INET: source, destination, source port, destination port
        if len(body) < 12:
            raise ProxyHeaderError("version 2 IPv4 addresses cut short")
        ip: IPAddress = ipaddress.IPv4Address(body[0:4])
        port = int.from_bytes(body[8:10], "big")
    elif family == 2:  # AF_INET6
        if len(body) < 36:
            raise ProxyHeaderError("version 2 IPv6 addresses cut short")
        ip = ipaddress.IPv6Address(body[0:16])
        port = int.from_bytes(body[32:34], "big")
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    elif family in (0, 3):  # UNSPEC, or a Unix socket: no address to give
        return Header(size, None)
    else:
        raise ProxyHeaderError(f"version 2 header with unknown address family {family}")
    return Header(size, (str(ip), port))  # what follows the addresses (TLVs) is not needed


class ProxiedMQTTProtocol(MQTTProtocol):
    """An MQTT listener's protocol behind a PROXY-protocol balancer: the broker's Connection is
    made once the header has named the client; until then the bytes are held here."""

    __slots__ = ("trusted", "pending", "timer", "socket_peer")

    refused = 0  # connections closed for a missing, malformed or untrusted header, all listeners

    def __init__(
        self, broker: Broker, listener: ListenerConfig, trusted: tuple[IPNetwork, ...]
    ) -> None:
        super().__init__(broker, listener)
        self.trusted = trusted
        self.pending = b""
        self.timer: asyncio.TimerHandle | None = None
        self.socket_peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        peername = transport.get_extra_info("peername")
        self.socket_peer = peer_name(peername)
        ip = ip_of(str(peername[0])) if isinstance(peername, tuple) else None
        if ip is None or not within(ip, self.trusted):
            self._refuse("not one of this listener's proxy_protocol addresses", loud=True)
            return
        self.timer = asyncio.get_running_loop().call_later(
            self.broker.options.connect_timeout, self._too_slow
        )

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is not None:
            conn.data_received(data)
            return
        if self.transport is None or self.transport.is_closing():
            return
        pending = self.pending + data if self.pending else data
        try:
            header = read_header(pending)
        except ProxyHeaderError as exc:
            self._refuse(str(exc), loud=True)
            return
        if header is None:
            self.pending = pending
            return
        self.pending = b""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if header.client is None:
            peer, address = self.socket_peer, None
        else:
            ip, port = header.client
            peer, address = f"{ip}:{port} (via {self.socket_peer})", ip
        self.conn = conn = self.broker.connect(self, peer, address)
        rest = pending[header.size :]
        if rest:
            conn.data_received(rest)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        super().connection_lost(exc)

    def _too_slow(self) -> None:
        self.timer = None
        if self.conn is None:
            # Nothing at all is what a balancer's TCP health check sends: not worth a warning.
            self._refuse("no PROXY protocol header within connect_timeout", loud=bool(self.pending))

    def _refuse(self, why: str, loud: bool) -> None:
        cls = ProxiedMQTTProtocol
        cls.refused += 1
        first = cls.refused & (cls.refused - 1) == 0  # 1st, 2nd, 4th, 8th...
        log.log(
            logging.WARNING if loud and first else logging.DEBUG,
            "connection from %s closed: %s (%d closed so far)",
            self.socket_peer,
            why,
            cls.refused,
        )
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.abort()

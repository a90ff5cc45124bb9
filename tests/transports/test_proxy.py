"""``proxy_protocol``: an MQTT listener behind a TCP load balancer that sends the PROXY protocol
header (HAProxy's versions 1 and 2).

``read_header`` on its own (both versions, incomplete and malformed headers, LOCAL and UNKNOWN,
TLVs), then a real Server whose listener trusts "a balancer" on 127.0.0.1: clients named by the
header are logged and counted as themselves (``max_connections_per_address = 1`` refuses a
second from the same client address), the header and the CONNECT may arrive in one segment or
byte by byte, a LOCAL header keeps the socket's address, a bad header or none closes the
connection without harming the others, and a listener trusting another network refuses
127.0.0.1 outright. On a TLS listener the header comes in clear before the handshake, and a
client certificate still names the user (mutual TLS through a balancer that passes TLS through).
The configuration errors name the key."""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import socket
import ssl
import struct
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.certs import Certificates, client_context
from support.clients import CONNACK_OK, MQTT_311, PahoClient, connect_packet, unique
from support.listeners import memory_config, serving

from mqttbroker.config import ConfigError, ListenerConfig, load, trusted_networks
from mqttbroker.server.app import Server
from mqttbroker.server.proxy import (
    V2_SIGNATURE,
    Header,
    ProxyAcceptor,
    ProxyHeaderError,
    bind,
    read_header,
)

GUARD = 10.0  # seconds: a failure guard, never a measured time


def v2(
    command: int = 1,
    family: int = 0x11,
    source: str = "203.0.113.7",
    port: int = 4711,
    tlvs: bytes = b"",
) -> bytes:
    """A version 2 header; ``family`` 0x11 TCP over IPv4, 0x21 over IPv6."""
    ip = ipaddress.ip_address(source)
    if ip.version == 4:
        addresses = ip.packed + bytes([10, 0, 0, 5]) + struct.pack("!HH", port, 1883)
    else:
        addresses = ip.packed + ipaddress.IPv6Address("2001:db8::5").packed
        addresses += struct.pack("!HH", port, 1883)
    if family == 0x00:
        addresses = b""
    elif family == 0x31:  # two Unix socket paths, 108 bytes each
        addresses = b"/run/balancer.sock".ljust(108, b"\0") + b"/run/broker.sock".ljust(108, b"\0")
    body = addresses + tlvs
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack("!H", len(body)) + body


V1 = b"PROXY TCP4 203.0.113.7 10.0.0.5 4711 1883\r\n"


@pytest.mark.parametrize(
    ("data", "header"),
    [
        (V1, Header(len(V1), ("203.0.113.7", 4711))),
        (V1 + b"\x10\x0c", Header(len(V1), ("203.0.113.7", 4711))),  # the client's bytes follow
        (
            b"PROXY TCP6 2001:db9::1 2001:db8::5 65535 1883\r\n",
            Header(47, ("2001:db9::1", 65535)),
        ),
        (
            b"PROXY TCP6 ::ffff:203.0.113.7 ::ffff:10.0.0.5 0 1883\r\n",
            Header(54, ("203.0.113.7", 0)),
        ),
        (b"PROXY UNKNOWN\r\n", Header(15, None)),
        (b"PROXY UNKNOWN ffff:f::1 ffff:f::2 1 2\r\n", Header(39, None)),
        (v2(), Header(28, ("203.0.113.7", 4711))),
        (v2(family=0x21, source="2001:db9::1", port=1), Header(52, ("2001:db9::1", 1))),
        (v2(family=0x21, source="::ffff:203.0.113.7"), Header(52, ("203.0.113.7", 4711))),
        (v2(tlvs=b"\x04\x00\x01\x00"), Header(32, ("203.0.113.7", 4711))),  # a TLV, skipped
        (v2(command=0), Header(28, None)),  # LOCAL: the balancer's own health check
        (v2(family=0x00), Header(16, None)),  # UNSPEC
        (v2(family=0x31), Header(16 + 216, None)),  # a Unix socket: no address to give
        (v2(command=0, family=0x12), Header(28, None)),  # LOCAL: the family is not looked at
    ],
)
def test_read_header(data: bytes, header: Header) -> None:
    assert read_header(data) == header


@pytest.mark.parametrize(
    "data",
    [b"P", b"PROXY", b"PROXY TCP4 203.0.113.7", V1[:-1], b"\r\n\r\n", v2()[:12], v2()[:27]],
)
def test_read_header_waits_for_the_rest(data: bytes) -> None:
    assert read_header(data) is None


@pytest.mark.parametrize(
    "data",
    [
        b"\x10\x0c\x00\x04MQTT",  # a client talking MQTT directly
        b"GET / HTTP/1.1\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.5 4711\r\n",  # a port missing
        b"PROXY TCP4 2001:db9::1 10.0.0.5 4711 1883\r\n",  # an IPv6 address in TCP4
        b"PROXY TCP6 203.0.113.7 2001:db8::5 4711 1883\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.5 65536 1883\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.5 04711 1883\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.5 -1 1883\r\n",
        b"PROXY TCP4 203.0.113.7  10.0.0.5 4711 1883\r\n",
        b"PROXY UDP4 203.0.113.7 10.0.0.5 4711 1883\r\n",
        b"PROXY TCP4 203.0.113.\xff 10.0.0.5 4711 1883\r\n",
        b"PROXY " + b"9" * 120,  # no CRLF within 107 bytes
        V2_SIGNATURE + b"\x11\x11\x00\x0c" + bytes(12),  # version 1 in a version 2 header
        V2_SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12),  # command 2
        V2_SIGNATURE + b"\x21\x12\x00\x0c" + bytes(12),  # datagrams
        V2_SIGNATURE + b"\x21\x22\x00\x24" + bytes(36),
        V2_SIGNATURE + b"\x21\x41\x00\x0c" + bytes(12),  # family 4
        V2_SIGNATURE + b"\x21\x10\x00\x0c" + bytes(12),  # values section 2.2 does not list
        V2_SIGNATURE + b"\x21\x01\x00\x0c" + bytes(12),
        V2_SIGNATURE + b"\x21\x20\x00\x24" + bytes(36),
        V2_SIGNATURE + b"\x21\x31\x00\x10" + bytes(16),  # Unix addresses cut short
        b"PROXY TCP6 fe80::1%eth0 2001:db8::5 4711 1883\r\n",  # a scoped address
        V2_SIGNATURE + b"\x21\x11\x00\x04" + bytes(4),  # IPv4 addresses cut short
        V2_SIGNATURE + b"\x21\x21\x00\x0c" + bytes(12),  # IPv6 addresses cut short
    ],
)
def test_read_header_refuses(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        read_header(data)


async def _exchange(port: int, chunks: list[bytes], pause: float = 0.0) -> bytes | None:
    """Send ``chunks`` (one write each) and return the first 4 bytes answered (a 3.1.1 CONNACK),
    or None when the broker closes the connection first."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)
        try:
            return await asyncio.wait_for(reader.readexactly(4), GUARD)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
    finally:
        writer.close()


def test_the_header_names_the_client_and_nothing_else_gets_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = memory_config(
        tmp_path,
        ListenerConfig(port=0, proxy_protocol="127.0.0.1", allow_anonymous=True),
        ListenerConfig(port=0, proxy_protocol="10.0.0.0/8", allow_anonymous=True),
        ListenerConfig(port=0, proxy_protocol="127.0.0.0/8"),  # anonymous not allowed
    )
    config.broker.max_connections_per_address = 1
    config.broker.connect_timeout = 1

    async def scenario() -> dict[str, Any]:
        server, (behind, elsewhere, guarded) = await serving(config)
        seen: dict[str, Any] = {}
        held: list[asyncio.StreamWriter] = []
        try:
            # Each accepted client keeps its connection, so that the per-address limit counts it.
            async def keep(name: str, port: int, header: bytes, split: bool = False) -> None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                held.append(writer)
                data = header + connect_packet(unique(name), MQTT_311)
                for piece in [data[i : i + 1] for i in range(len(data))] if split else [data]:
                    writer.write(piece)
                    await writer.drain()
                try:
                    seen[name] = await asyncio.wait_for(reader.readexactly(4), GUARD)
                except (asyncio.IncompleteReadError, ConnectionError):
                    seen[name] = None

            await keep("v1", behind, V1)
            await keep("v2", behind, v2(source="198.51.100.9", port=5000), split=True)
            await keep("again", behind, v2(source="203.0.113.7", port=4712))
            await keep("local", behind, v2(command=0))  # the balancer's own: 127.0.0.1
            await keep("local-again", behind, b"PROXY UNKNOWN\r\n")  # 127.0.0.1 once more
            seen["peers"] = sorted(conn.peer for conn in server.broker.connections)
            seen["garbage"] = await _exchange(behind, [b"\x10\x0c\x00\x04MQTT\x04\x02"])
            seen["half"] = await _exchange(behind, [V1[:20]])  # then nothing: timed out
            seen["silent"] = await _exchange(behind, [])
            # A balancer's TCP health check: connects, and closes without a byte. Not logged.
            _, probe = await asyncio.open_connection("127.0.0.1", behind)
            probe.close()
            await probe.wait_closed()
            seen["untrusted"] = await _exchange(
                elsewhere, [V1 + connect_packet(unique("u"), MQTT_311)]
            )
            seen["anonymous"] = await _exchange(
                guarded, [v2(source="192.0.2.3") + connect_packet(unique("a"), MQTT_311)]
            )
            # The first clients were not harmed by any of that.
            seen["still"] = sorted(conn.peer for conn in server.broker.connections)
        finally:
            for writer in held:
                writer.close()
            await server.stop()
        return seen

    with caplog.at_level(logging.DEBUG, logger="mqttbroker"):
        seen = asyncio.run(scenario())
    assert seen["v1"] == CONNACK_OK and seen["v2"] == CONNACK_OK and seen["local"] == CONNACK_OK
    assert seen["again"] is None  # 203.0.113.7 again: over max_connections_per_address
    assert seen["local-again"] is None  # 127.0.0.1 again
    proxied = [p for p in seen["peers"] if " (via 127.0.0.1:" in p]
    assert sorted(p.partition(" ")[0] for p in proxied) == ["198.51.100.9:5000", "203.0.113.7:4711"]
    assert "max_connections_per_address (1) reached for 203.0.113.7" in caplog.text
    assert "max_connections_per_address (1) reached for 127.0.0.1" in caplog.text
    assert seen["garbage"] is None and seen["half"] is None and seen["silent"] is None
    assert seen["untrusted"] is None
    assert seen["anonymous"] == b"\x20\x02\x00\x05"  # a proxied loopback listener is not local
    assert seen["still"] == seen["peers"]
    # Each listener counts its own refusals: the first of each is a warning.
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("closed: no PROXY protocol header (1 closed so far)" in m for m in warnings)
    assert any("not one of this listener's proxy_protocol addresses" in m for m in warnings)
    logged = [r.getMessage() for r in caplog.records]
    assert any("closed: no PROXY protocol header within connect_timeout" in m for m in logged)
    # One line for each connection closed: garbage, half, silent, untrusted; not the probe.
    closed = [
        r for r in caplog.records if r.name == "mqttbroker.proxy" and " closed: " in r.message
    ]
    assert len(closed) == 4, [r.getMessage() for r in closed]


def test_paho_through_a_balancer(tmp_path: Path) -> None:
    """paho-mqtt (MQTT 5) publishes and subscribes through a stand-in balancer that sends a
    version 2 header, then relays both ways."""
    config = memory_config(
        tmp_path,
        ListenerConfig(port=0, proxy_protocol="127.0.0.1", allow_anonymous=True),
    )

    async def relay(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, header: bytes | None = None
    ) -> None:
        try:
            if header is not None:
                writer.write(header)
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def scenario() -> tuple[list[Any], list[str]]:
        server = Server(config)
        await server.start()
        port = server.listeners[0].addresses[0][1]
        clients = 0

        async def balance(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal clients
            clients += 1
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
            header = v2(source=f"203.0.113.{clients}", port=40000 + clients)
            await asyncio.gather(
                relay(reader, upstream_writer, header), relay(upstream_reader, writer)
            )

        balancer = await asyncio.start_server(balance, "127.0.0.1", 0)
        front = balancer.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        sub, pub = PahoClient("127.0.0.1", front), PahoClient("127.0.0.1", front)
        try:  # the clients wait for the broker's answers: in threads, off the broker's loop
            await loop.run_in_executor(None, sub.connect)
            await loop.run_in_executor(None, sub.subscribe, "proxied/#", 1)
            await loop.run_in_executor(None, pub.connect)
            await loop.run_in_executor(
                None, pub.publish, "proxied/hello", b"through the balancer", 1
            )
            got = await loop.run_in_executor(None, sub.wait_messages, 1)
            received = [(m.topic, m.payload) for m in got]
            peers = sorted(conn.peer for conn in server.broker.connections)
        finally:
            for client in (sub, pub):
                await loop.run_in_executor(None, client.close)
            balancer.close()
            await server.stop()
        return received, peers

    received, peers = asyncio.run(scenario())
    assert received == [("proxied/hello", b"through the balancer")]
    assert [p.partition(" ")[0] for p in peers] == ["203.0.113.1:40001", "203.0.113.2:40002"]


@pytest.mark.parametrize(
    ("listener", "message"),
    [
        (
            'protocol = "ws"\nproxy_protocol = "127.0.0.1"',
            'proxy_protocol: needs protocol = "mqtt"',
        ),
        ('proxy_protocol = "10.0.0.0/33"', "proxy_protocol: not an IP address or network"),
        ('proxy_protocol = ","', "proxy_protocol: no address"),
    ],
)
def test_configuration_errors_name_the_key_and_file(
    tmp_path: Path, listener: str, message: str
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(f"[[listener]]\nport = 1883\n{listener}\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(path) in str(info.value) and "listener[0]." + message in str(info.value)


def test_mutual_tls_after_the_header(
    tmp_path: Path, certs: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    """The balancer passes TLS through: header in clear, then the client's handshake, on one
    connection. The broker terminates TLS, the client certificate names the user, the header
    names the client; a client without a certificate is refused in the handshake. Stopping
    the broker closes the connection whose client has gone already without an error."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    config = memory_config(
        tmp_path,
        ListenerConfig(
            port=0,
            proxy_protocol="127.0.0.1",
            allow_anonymous=True,
            tls_cert_file=str(certs.server_cert),
            tls_key_file=str(certs.server_key),
            tls_ca_file=str(certs.ca),
            tls_require_certificate=True,
            tls_certificate_username="cn",
        ),
    )

    def through_balancer(
        port: int, header: bytes, with_cert: bool, held: list[socket.socket] | None = None
    ) -> bytes | Exception:
        """The header and the ClientHello in one segment, as a balancer relaying a client's
        first bytes sends them: the broker must read the header and not a byte more.
        ``held``: the socket is left open there (the connection is still the broker's)."""
        tls = client_context(certs, with_cert=with_cert).wrap_bio(
            incoming := ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname="localhost"
        )
        sock = socket.create_connection(("127.0.0.1", port), timeout=GUARD)

        def pump(step: Callable[[], Any]) -> Any:
            while True:
                try:
                    result = step()
                except ssl.SSLWantReadError:
                    if pending := outgoing.read():
                        sock.sendall(pending)
                    data = sock.recv(65536)
                    if not data:
                        raise ConnectionResetError("closed by the broker") from None
                    incoming.write(data)
                else:
                    if pending := outgoing.read():
                        sock.sendall(pending)
                    return result

        try:
            try:
                tls.do_handshake()
            except ssl.SSLWantReadError:
                pass
            sock.sendall(header + outgoing.read())  # one write: header, then ClientHello
            pump(tls.do_handshake)
            tls.write(connect_packet(unique("mtls"), MQTT_311))
            return bytes(pump(lambda: tls.read(4)))
        except (ssl.SSLError, OSError) as exc:
            return exc
        finally:
            if held is None:
                sock.close()
            else:
                held.append(sock)

    async def scenario() -> tuple[Any, Any, list[tuple[str, str | None]]]:
        server = Server(config)
        await server.start()
        port = server.listeners[0].addresses[0][1]
        loop = asyncio.get_running_loop()
        held: list[socket.socket] = []  # open until its connection has been looked at
        try:
            accepted = await loop.run_in_executor(
                None, through_balancer, port, v2(source="203.0.113.7", port=4711), True, held
            )
            users = [(c.peer, c.username) for c in server.broker.connections]
            refused = await loop.run_in_executor(None, through_balancer, port, V1, False)
        finally:
            for sock in held:
                sock.close()
            await server.stop()
        return accepted, refused, users

    accepted, refused, users = asyncio.run(scenario())
    assert accepted == CONNACK_OK
    assert [(peer.partition(" ")[0], user) for peer, user in users] == [
        ("203.0.113.7:4711", "alice")
    ]
    assert isinstance(refused, Exception) or refused == b"", refused
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_closing_the_listener_closes_every_socket_it_accepted(loop: str) -> None:
    """Connections still waiting for their header, or not yet looked at, when the listener
    closes are closed with it, on both event loops: none is left for the garbage collector
    ("unclosed socket" ResourceWarning)."""

    async def scenario() -> int:
        closed = 0
        for cycle in range(30):
            sockets = bind("127.0.0.1", 0, False, 16)
            port = sockets[0].getsockname()[1]
            acceptor = ProxyAcceptor(
                asyncio.get_running_loop(),
                sockets,
                trusted_networks("127.0.0.1"),
                lambda name, address: asyncio.Protocol(),
                None,
                GUARD,
            )
            clients = []
            for _ in range(10):
                client = socket.socket()
                client.setblocking(False)
                try:
                    client.connect(("127.0.0.1", port))
                except BlockingIOError:
                    pass
                clients.append(client)
            for _ in range(cycle % 4):  # close at different points of the admissions
                await asyncio.sleep(0)
            acceptor.close()
            await acceptor.wait_closed()
            for client in clients:
                client.close()
            closed += 1
        return closed

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        if loop == "uvloop":
            import uvloop  # the [fast] extra, which the test command installs

            assert uvloop.run(scenario()) == 30
        else:
            assert asyncio.run(scenario()) == 30
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert unclosed == []

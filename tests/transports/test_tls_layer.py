"""TLS over a plain transport (server/tlslayer.py): TLS listeners on the broker's own transport,
what the MQTT protocol above the layer sees (the connection only after the handshake, the
client's close_notify as its EOF), the handshake timeout, and close() as a close_notify."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from support.certs import Certificates, client_context
from support.clients import CONNACK_OK, MQTT_311, connect_packet, unique
from support.listeners import memory_config

from mqttbroker.config import ListenerConfig
from mqttbroker.security.tls import server_context
from mqttbroker.server import streams
from mqttbroker.server.app import Server
from mqttbroker.server.tlslayer import TLSLayer

T = TypeVar("T")

GUARD = 10.0  # seconds: a failure guard, never a measured time


def _context(certs: Certificates) -> ssl.SSLContext:
    listener = ListenerConfig(
        tls_cert_file=str(certs.server_cert), tls_key_file=str(certs.server_key)
    )
    context = server_context(listener, "test")
    assert context is not None
    return context


class App:
    """The protocol above the layer, recording what it is told."""

    def __init__(self, close_on_data: bool = False) -> None:
        self.events: list[Any] = []
        self.transport: Any = None
        self.close_on_data = close_on_data
        self.lost = asyncio.Event()
        self.eof = asyncio.Event()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.events.append(("made", type(transport.get_extra_info("ssl_object")).__name__))

    def data_received(self, data: bytes) -> None:
        self.events.append(("data", data))
        if self.close_on_data:
            self.transport.close()
        else:
            self.transport.write(data.upper())

    def eof_received(self) -> bool:
        self.events.append("eof")
        self.eof.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost.set()

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


async def _serve(context: ssl.SSLContext, app: App, timeout: float = GUARD) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: TLSLayer(context, timeout, app), "127.0.0.1", 0)


def _port(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


def _run_client(
    certs: Certificates,
    client: Callable[[int], T],
    app: App | None = None,
    timeout: float = GUARD,
    until_lost: bool = False,
) -> tuple[list[Any], T]:
    """``client(port)`` run on a thread against a server of the layer (handshake ``timeout``)
    and, with ``until_lost``, until ``app`` has heard the connection end: the app's events and
    what the client returned."""

    async def scenario() -> tuple[list[Any], T]:
        served = app or App()
        server = await _serve(_context(certs), served, timeout)
        try:
            got = await asyncio.to_thread(client, _port(server))
            if until_lost:
                await asyncio.wait_for(served.lost.wait(), GUARD)
        finally:
            server.close()
        return served.events, got

    return asyncio.run(scenario())


@pytest.mark.parametrize("built", [pytest.param(True, marks=pytest.mark.needs_compiled), False])
def test_tls_listeners_run_the_layer_on_the_own_transport_when_built(
    tmp_path: Path, certs: Certificates, monkeypatch: pytest.MonkeyPatch, built: bool
) -> None:
    if not built:
        monkeypatch.setattr(streams, "available", lambda: False)
    tls = ListenerConfig(
        host="127.0.0.1",
        port=0,
        tls_cert_file=str(certs.server_cert),
        tls_key_file=str(certs.server_key),
    )
    config = memory_config(
        tmp_path,
        tls,
    )

    async def scenario() -> tuple[bytes, str, str, str]:
        server = Server(config)
        await server.start()
        try:
            port = server.addresses[0][1]
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_context(certs), server_hostname="localhost"
            )
            writer.write(connect_packet(unique("tlslayer"), MQTT_311))
            answer = await asyncio.wait_for(reader.readexactly(4), GUARD)
            (conn,) = server.broker.connections
            layer = conn.link.transport  # type: ignore[attr-defined]
            kinds = type(layer).__name__, type(layer.transport).__name__
            writer.close()
        finally:
            await server.stop()
        return answer, *kinds, type(server.listeners[0].server).__name__

    answer, layer, transport, listener = asyncio.run(scenario())
    assert answer == CONNACK_OK
    assert layer == "TLSLayer"
    if built:
        assert (transport, listener) == ("Stream", "StreamServer")
    else:
        assert transport != "Stream" and listener == "Server"


def test_the_app_has_the_connection_after_the_handshake_and_the_close_notify_as_eof(
    certs: Certificates,
) -> None:
    async def scenario() -> tuple[list[Any], bytes]:
        app = App()
        server = await _serve(_context(certs), app)
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", _port(server), ssl=client_context(certs), server_hostname="localhost"
            )
            writer.write(b"hello")
            echoed = await asyncio.wait_for(reader.readexactly(5), GUARD)
            writer.close()  # a close_notify, then the FIN
            await asyncio.wait_for(app.lost.wait(), GUARD)
        finally:
            server.close()
        return app.events, echoed

    events, echoed = asyncio.run(scenario())
    assert echoed == b"HELLO"
    assert events[:2] == [("made", "SSLObject"), ("data", b"hello")]
    assert events[2:] == ["eof", "lost"]


def test_close_sends_a_close_notify_and_the_app_hears_of_the_end_when_the_client_closes(
    certs: Certificates,
) -> None:
    def client(port: int) -> tuple[bytes, bool]:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            tls = client_context(certs).wrap_socket(raw, server_hostname="localhost")
            tls.sendall(b"bye")
            got = tls.recv(100)  # b"": the server's close_notify
            tls.unwrap()  # our close_notify back: a clean TLS shutdown (or an error raised)
            return got, True

    events, (got, clean) = _run_client(certs, client, App(close_on_data=True), until_lost=True)
    assert (got, clean) == (b"", True)
    assert events[0] == ("made", "SSLObject")
    assert events[-1] == "lost"
    assert "eof" not in events  # closing already: the client's close_notify is not news


def test_a_failed_handshake_never_reaches_the_app(certs: Certificates) -> None:
    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            raw.sendall(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04abcd")  # MQTT, not TLS
            got = b""
            while chunk := raw.recv(100):
                got += chunk
            return got

    events, got = _run_client(certs, client)
    assert events == []
    assert got == b"" or got[:1] == b"\x15"  # closed (after an alert, if one was sent)


def test_a_client_that_does_not_finish_its_handshake_is_cut_off_after_the_timeout(
    certs: Certificates,
) -> None:
    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            try:
                return raw.recv(100)  # nothing sent: b"" (or a reset) once the layer gives up
            except ConnectionResetError:
                return b""

    events, got = _run_client(certs, client, timeout=0.2)
    assert (events, got) == ([], b"")


def _records_before_the_echo(sock: socket.socket, tls: ssl.SSLObject, into: ssl.MemoryBIO) -> int:
    """Feeds the server's records to ``tls`` one at a time until one holds the echo; returns
    how many came before it holding no data (in TLS 1.3: the session tickets)."""
    buffered, before = b"", 0
    while True:
        while len(buffered) < 5 or len(buffered) < 5 + int.from_bytes(buffered[3:5], "big"):
            chunk = sock.recv(65536)
            assert chunk, "the server closed before echoing"
            buffered += chunk
        size = 5 + int.from_bytes(buffered[3:5], "big")
        into.write(buffered[:size])
        buffered = buffered[size:]
        try:
            data = tls.read(100)
        except ssl.SSLWantReadError:
            before += 1
            continue
        assert data == b"HELLO"
        return before


def test_one_tls13_session_ticket_per_handshake_and_it_resumes(certs: Certificates) -> None:
    """The handshake's last flight carries one session ticket (not OpenSSL's two), and a client
    offering it is resumed."""
    context = client_context(certs, maximum=ssl.TLSVersion.TLSv1_3)
    context.minimum_version = ssl.TLSVersion.TLSv1_3

    def client(port: int, session: ssl.SSLSession | None) -> tuple[int, ssl.SSLSession, bool]:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost", session=session)
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as sock:
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    sock.sendall(outgoing.read())
                    data = sock.recv(65536)
                    assert data, "the server closed during the handshake"
                    incoming.write(data)
            tls.write(b"hello")
            sock.sendall(outgoing.read())  # the client's Finished and the data
            tickets = _records_before_the_echo(sock, tls, incoming)
            assert tls.session is not None
            return tickets, tls.session, tls.session_reused

    async def scenario() -> tuple[int, bool, int, bool]:
        server = await _serve(_context(certs), App())
        try:
            tickets, session, reused = await asyncio.to_thread(client, _port(server), None)
            again, _, resumed = await asyncio.to_thread(client, _port(server), session)
        finally:
            server.close()
        return tickets, reused, again, resumed

    tickets, reused, again, resumed = asyncio.run(scenario())
    assert (tickets, reused) == (1, False)
    assert (again, resumed) == (1, True)

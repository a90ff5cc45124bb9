"""TLS on a plain socket, in its two forms: the Python layer (server/tlslayer.py: an SSLObject
over memory BIOs, on any transport) and OpenSSL on the socket in the C transport (_streams.c,
TLS listeners of the compiled form). For both: what the protocol above sees (the connection only
after the handshake, the client's close_notify as its EOF), the handshake timeout, close() as a
close_notify, one TLS 1.3 session ticket and resumption. For the C one also: the listener uses
it, the client certificate as ``getpeercert()`` gives it, a failed handshake among good ones,
large writes through a full socket, a client that stops reading, and reading paused while
OpenSSL holds records."""

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
from mqttbroker.server.proxy import bind
from mqttbroker.server.tlslayer import TLSLayer

T = TypeVar("T")

GUARD = 10.0  # seconds: a failure guard, never a measured time


LAYERS = ["python", pytest.param("c", marks=pytest.mark.needs_compiled)]


@pytest.fixture(params=LAYERS)
def layer(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _context(certs: Certificates, mutual: bool = False) -> ssl.SSLContext:
    listener = ListenerConfig(
        tls_cert_file=str(certs.server_cert),
        tls_key_file=str(certs.server_key),
        tls_ca_file=str(certs.ca) if mutual else "",
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
        cipher = transport.get_extra_info("cipher")
        self.events.append(("made", cipher[1] if cipher else None))

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


async def _serve(
    context: ssl.SSLContext, app: Any, timeout: float = GUARD, layer: str = "python"
) -> Any:
    """A server of ``layer`` for ``app`` (an App, or a factory of them) on 127.0.0.1."""
    loop = asyncio.get_running_loop()
    factory = app if callable(app) else lambda: app
    if layer == "python":
        return await loop.create_server(
            lambda: TLSLayer(context, timeout, factory()), "127.0.0.1", 0
        )
    assert streams.native_tls(context) is None
    return streams.StreamServer(
        loop,
        bind("127.0.0.1", 0, False, 100),
        factory,
        defer_accept=0,  # a silent client is accepted at once (the handshake timeout test)
        tls=context,
        handshake_timeout=timeout,
    )


def _port(server: Any) -> int:
    return int(server.sockets[0].getsockname()[1])


def _run_client(
    certs: Certificates,
    client: Callable[[int], T],
    app: App | None = None,
    timeout: float = GUARD,
    until_lost: bool = False,
    layer: str = "python",
) -> tuple[list[Any], T]:
    """``client(port)`` run on a thread against a server of ``layer`` (handshake ``timeout``)
    and, with ``until_lost``, until ``app`` has heard the connection end: the app's events and
    what the client returned."""

    async def scenario() -> tuple[list[Any], T]:
        served = app or App()
        server = await _serve(_context(certs), served, timeout, layer)
        try:
            got = await asyncio.to_thread(client, _port(server))
            if until_lost:
                await asyncio.wait_for(served.lost.wait(), GUARD)
        finally:
            server.close()
        return served.events, got

    return asyncio.run(scenario())


def _tls_listener(certs: Certificates) -> ListenerConfig:
    return ListenerConfig(
        host="127.0.0.1",
        port=0,
        tls_cert_file=str(certs.server_cert),
        tls_key_file=str(certs.server_key),
    )


def _served_over_tls(config: Any, certs: Certificates, name: str) -> tuple[bytes, Any, str]:
    """A broker of ``config`` started, an MQTT client connected over TLS: the CONNACK's
    bytes, the transport of the broker's connection, and the listener's server type."""

    async def scenario() -> tuple[bytes, Any, str]:
        server = Server(config)
        await server.start()
        try:
            port = server.addresses[0][1]
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_context(certs), server_hostname="localhost"
            )
            writer.write(connect_packet(unique(name), MQTT_311))
            answer = await asyncio.wait_for(reader.readexactly(4), GUARD)
            (conn,) = server.broker.connections
            transport = conn.link.transport  # type: ignore[attr-defined]
            writer.close()
        finally:
            await server.stop()
        return answer, transport, type(server.listeners[0].server).__name__

    return asyncio.run(scenario())


@pytest.mark.parametrize("built", [pytest.param(True, marks=pytest.mark.needs_compiled), False])
def test_tls_listeners_run_tls_in_the_c_transport_when_built(
    tmp_path: Path, certs: Certificates, monkeypatch: pytest.MonkeyPatch, built: bool
) -> None:
    if not built:
        monkeypatch.setattr(streams, "available", lambda: False)
    config = memory_config(tmp_path, _tls_listener(certs))
    answer, transport, listener = _served_over_tls(config, certs, "tlslayer")
    below = type(getattr(transport, "transport", None)).__name__
    assert answer == CONNACK_OK
    if built:
        assert (type(transport).__name__, listener) == ("TLSStream", "StreamServer")
    else:
        assert type(transport).__name__ == "TLSLayer" and below != "Stream"
        assert listener == "Server"


@pytest.mark.needs_compiled
def test_a_context_the_c_transport_cannot_take_runs_the_python_layer_and_says_so(
    tmp_path: Path, certs: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    """A context with a callback CPython calls with its own socket objects (here an SNI
    callback): the listener runs the Python layer on the own transport, and logs why."""
    config = memory_config(tmp_path, _tls_listener(certs))
    made = server_context

    def with_sni(listener: ListenerConfig, where: str) -> ssl.SSLContext | None:
        context = made(listener, where)
        assert context is not None
        context.sni_callback = lambda *args: None
        return context

    with pytest.MonkeyPatch.context() as patch:
        from mqttbroker.server import listeners

        patch.setattr(listeners, "server_context", with_sni)
        with caplog.at_level("INFO", logger="mqttbroker"):
            answer, transport, _ = _served_over_tls(config, certs, "sni")
    assert answer == CONNACK_OK
    assert (type(transport).__name__, type(transport.transport).__name__) == (
        "TLSLayer",
        "Stream",
    )
    assert "TLS in the Python layer, not in the C transport: the context has an SNI" in caplog.text


def test_the_app_has_the_connection_after_the_handshake_and_the_close_notify_as_eof(
    certs: Certificates, layer: str
) -> None:
    async def scenario() -> tuple[list[Any], bytes]:
        app = App()
        server = await _serve(_context(certs), app, layer=layer)
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
    assert events[:2] == [("made", "TLSv1.3"), ("data", b"hello")]
    assert events[2:] == ["eof", "lost"]


def test_close_sends_a_close_notify_and_the_app_hears_of_the_end_when_the_client_closes(
    certs: Certificates, layer: str
) -> None:
    def client(port: int) -> tuple[bytes, bool]:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            tls = client_context(certs).wrap_socket(raw, server_hostname="localhost")
            tls.sendall(b"bye")
            got = tls.recv(100)  # b"": the server's close_notify
            tls.unwrap()  # our close_notify back: a clean TLS shutdown (or an error raised)
            return got, True

    events, (got, clean) = _run_client(
        certs, client, App(close_on_data=True), until_lost=True, layer=layer
    )
    assert (got, clean) == (b"", True)
    assert events[0] == ("made", "TLSv1.3")
    assert events[-1] == "lost"
    assert "eof" not in events  # closing already: the client's close_notify is not news


def test_a_failed_handshake_never_reaches_the_app(certs: Certificates, layer: str) -> None:
    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            raw.sendall(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04abcd")  # MQTT, not TLS
            got = b""
            while chunk := raw.recv(100):
                got += chunk
            return got

    events, got = _run_client(certs, client, layer=layer)
    assert events == []
    assert got == b"" or got[:1] == b"\x15"  # closed (after an alert, if one was sent)


def test_a_client_that_does_not_finish_its_handshake_is_cut_off_after_the_timeout(
    certs: Certificates, layer: str
) -> None:
    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            try:
                return raw.recv(100)  # nothing sent: b"" (or a reset) once the layer gives up
            except ConnectionResetError:
                return b""

    events, got = _run_client(certs, client, timeout=0.2, layer=layer)
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


def test_one_tls13_session_ticket_per_handshake_and_it_resumes(
    certs: Certificates, layer: str
) -> None:
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
        server = await _serve(_context(certs), App(), layer=layer)
        try:
            tickets, session, reused = await asyncio.to_thread(client, _port(server), None)
            again, _, resumed = await asyncio.to_thread(client, _port(server), session)
        finally:
            server.close()
        return tickets, reused, again, resumed

    tickets, reused, again, resumed = asyncio.run(scenario())
    assert (tickets, reused) == (1, False)
    assert (again, resumed) == (1, True)


def test_tls12_sessions_resume(certs: Certificates, layer: str) -> None:
    """A TLS 1.2 client offering the session of its previous connection is resumed (the
    context's session cache, shared by the connections of a listener)."""
    context = client_context(certs, maximum=ssl.TLSVersion.TLSv1_2)

    def client(port: int, session: ssl.SSLSession | None) -> tuple[ssl.SSLSession, bool, bytes]:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            tls = context.wrap_socket(raw, server_hostname="localhost", session=session)
            tls.sendall(b"hello")
            echoed = tls.recv(100)
            assert tls.session is not None
            return tls.session, tls.session_reused, echoed

    async def scenario() -> tuple[bool, bytes, bool, bytes]:
        server = await _serve(_context(certs), App, layer=layer)
        try:
            session, reused, first = await asyncio.to_thread(client, _port(server), None)
            _, resumed, second = await asyncio.to_thread(client, _port(server), session)
        finally:
            server.close()
        return reused, first, resumed, second

    assert asyncio.run(scenario()) == (False, b"HELLO", True, b"HELLO")


# -- TLS in the C transport -------------------------------------------------------------------


def _rich_client_cert(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a client certificate of it with a subject of several RDNs (one of two
    attributes) and a subjectAltName of every kind getpeercert() names: (CA, cert, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID, ObjectIdentifier

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rich CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    subject = x509.Name(
        [
            x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COUNTRY_NAME, "DE")]),
            x509.RelativeDistinguishedName(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Gerät GmbH"),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "fleet"),
                ]
            ),
            x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COMMON_NAME, "dev-7")]),
        ]
    )
    names = [
        x509.DNSName("dev-7.example.test"),
        x509.RFC822Name("dev-7@example.test"),
        x509.UniformResourceIdentifier("urn:dev:7"),
        x509.IPAddress(ipaddress.ip_address("192.0.2.7")),
        x509.IPAddress(ipaddress.ip_address("2001:db8::7")),
        x509.RegisteredID(ObjectIdentifier("1.2.3.4")),
        x509.DirectoryName(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dir")])),
        x509.OtherName(ObjectIdentifier("1.2.3.5"), b"\x0c\x03abc"),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(0x1234ABCD)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "rich-ca.pem", folder / "rich.pem", folder / "rich.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@pytest.mark.needs_compiled
def test_the_client_certificate_is_what_getpeercert_gives(
    tmp_path: Path, certs: Certificates
) -> None:
    """get_extra_info("peercert") of the C transport equals the Python layer's (ssl's own
    getpeercert()) for a certificate with every kind of name, and is None without one; so
    tls_certificate_username reads the same names from both."""
    ca, cert, key = _rich_client_cert(tmp_path)
    listener = ListenerConfig(
        tls_cert_file=str(certs.server_cert),
        tls_key_file=str(certs.server_key),
        tls_ca_file=str(ca),
    )
    context = server_context(listener, "test")
    assert context is not None

    class Peer(App):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.events.append(("peercert", transport.get_extra_info("peercert")))

    def client(port: int, with_cert: bool) -> bytes:
        own = client_context(certs)
        if with_cert:
            own.load_cert_chain(str(cert), str(key))
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            tls = own.wrap_socket(raw, server_hostname="localhost")
            tls.sendall(b"hi")
            return tls.recv(100)

    async def seen(layer: str, with_cert: bool) -> Any:
        app = Peer()
        server = await _serve(context, app, layer=layer)
        try:
            assert await asyncio.to_thread(client, _port(server), with_cert) == b"HI"
        finally:
            server.close()
        return dict(event for event in app.events if event[0] == "peercert")["peercert"]

    async def scenario() -> tuple[Any, Any, Any]:
        return await seen("python", True), await seen("c", True), await seen("c", False)

    python, c, without = asyncio.run(scenario())
    assert python["subjectAltName"][0] == ("DNS", "dev-7.example.test")  # the reference's own
    assert c == python
    assert without is None


@pytest.mark.needs_compiled
def test_failed_handshakes_close_their_sockets_and_the_others_are_served(
    certs: Certificates,
) -> None:
    """Plain MQTT, a client gone in the middle of its handshake and a client that refuses the
    server's certificate, among good clients: each bad one is closed and its protocol hears
    nothing; the good ones are echoed; no connection is left."""
    apps: list[App] = []

    def made() -> App:
        apps.append(App())
        return apps[-1]

    def plain(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            raw.sendall(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04abcd")
            got = b""
            while chunk := raw.recv(100):
                got += chunk
            return got[:1]

    def gone(port: int) -> bytes:
        hello_only = client_context(certs)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = hello_only.wrap_bio(incoming, outgoing, server_hostname="localhost")
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            raw.sendall(outgoing.read())  # the ClientHello, then the client is gone
        return b""

    def distrustful(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            with pytest.raises(ssl.SSLCertVerificationError):
                ssl.create_default_context().wrap_socket(raw, server_hostname="localhost")
        return b""

    def good(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            tls = client_context(certs).wrap_socket(raw, server_hostname="localhost")
            tls.sendall(b"ok")
            return tls.recv(100)

    async def scenario() -> tuple[list[bytes], int]:
        server = await _serve(_context(certs), made, layer="c")
        port = _port(server)
        try:
            got = []
            for client in (good, plain, gone, good, distrustful, good):
                got.append(await asyncio.to_thread(client, port))
            for _ in range(int(GUARD / 0.01)):  # a guard: until the server let all go
                if server.poller.streams == 0:
                    break
                await asyncio.sleep(0.01)
            return got, server.poller.streams
        finally:
            server.close()

    got, left = asyncio.run(scenario())
    assert got[0] == got[3] == got[5] == b"OK"
    assert got[1] in (b"", b"\x15")  # closed (after an alert, if one was sent)
    assert left == 0
    assert [app.events[:1] for app in apps] == [
        [("made", "TLSv1.3")],
        [],
        [],
        [("made", "TLSv1.3")],
        [],
        [("made", "TLSv1.3")],
    ]


class Writer(App):
    """Writes ``chunks`` when the client says "go"; records pause_writing and resume_writing."""

    def __init__(self, chunks: list[Any]) -> None:
        super().__init__()
        self.chunks = chunks
        self.buffered: list[int] = []

    def data_received(self, data: bytes) -> None:
        self.events.append(("data", data))
        for chunk in self.chunks:
            self.transport.write(chunk)
        self.buffered.append(self.transport.get_write_buffer_size())

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")


@pytest.mark.needs_compiled
def test_large_writes_through_a_full_socket_arrive_whole_and_in_order(
    certs: Certificates,
) -> None:
    """12 MiB in writes of many sizes (shared bytes objects kept by reference, copies,
    bytearrays) to a client that reads only after a while: what the socket does not take waits
    in the queue, records taken in part are finished, pause_writing and resume_writing come,
    and every byte arrives in order."""
    import hashlib
    import os

    shared = os.urandom(1 << 20)
    chunks: list[Any] = []
    for i in range(48):
        size = (1, 100, 5000, 16384, 70000, 300000)[i % 6]
        piece = shared[i * 1000 : i * 1000 + size]
        chunks.append(bytearray(piece) if i % 4 == 3 else piece)
    chunks += [shared] * 8
    total = sum(len(chunk) for chunk in chunks)
    expected = hashlib.sha256(b"".join(bytes(chunk) for chunk in chunks)).hexdigest()
    app = Writer(chunks)

    def client(port: int) -> tuple[int, str]:
        import time

        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            tls = client_context(certs).wrap_socket(raw, server_hostname="localhost")
            tls.sendall(b"go")
            time.sleep(0.3)  # the server fills its socket meanwhile
            digest, got = hashlib.sha256(), 0
            while got < total:
                chunk = tls.recv(1 << 20)
                assert chunk, "closed early"
                digest.update(chunk)
                got += len(chunk)
            return got, digest.hexdigest()

    _, (got, digest) = _run_client(certs, client, app, layer="c")
    assert (got, digest) == (total, expected)
    assert app.buffered[0] > 64 * 1024  # the socket did not take it all at once
    assert app.events[2:4] == ["pause", "resume"]  # after ("made", ...), ("data", b"go")


@pytest.mark.needs_compiled
def test_a_client_that_stops_reading_holds_only_its_own_connection(certs: Certificates) -> None:
    """A client that never reads: the writes wait in its queue (pause_writing) until the
    protocol aborts it; the connection then goes, and another client is served meanwhile."""
    block = b"x" * 65536
    stuck = Writer([block] * 256)  # 16 MiB: more than the two sockets' buffers hold

    def silent(port: int) -> socket.socket:
        raw = socket.create_connection(("127.0.0.1", port), timeout=GUARD)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        tls = client_context(certs).wrap_socket(raw, server_hostname="localhost")
        tls.sendall(b"go")
        return tls  # never read

    def good(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            tls = client_context(certs).wrap_socket(raw, server_hostname="localhost")
            tls.sendall(b"ok")
            return tls.recv(100)

    async def scenario() -> tuple[list[int], bytes, list[Any], int]:
        apps = iter([stuck, App()])
        server = await _serve(_context(certs), lambda: next(apps), layer="c")
        port = _port(server)
        try:
            kept = await asyncio.to_thread(silent, port)
            for _ in range(int(GUARD / 0.01)):  # a guard: until the writes were made
                if stuck.buffered:
                    break
                await asyncio.sleep(0.01)
            echoed = await asyncio.to_thread(good, port)
            stuck.transport.abort()
            await asyncio.wait_for(stuck.lost.wait(), GUARD)
            kept.close()
            for _ in range(int(GUARD / 0.01)):
                if server.poller.streams == 0:
                    break
                await asyncio.sleep(0.01)
            return stuck.buffered, echoed, stuck.events, server.poller.streams
        finally:
            server.close()

    buffered, echoed, events, left = asyncio.run(scenario())
    assert buffered[0] > 8 * 1024 * 1024  # most of the 16 MiB waits in the queue
    assert echoed == b"OK"
    assert "pause" in events and "resume" not in events and events[-1] == "lost"
    assert left == 0


@pytest.mark.needs_compiled
def test_reading_paused_while_openssl_holds_records_goes_on_when_resumed(
    certs: Certificates,
) -> None:
    """263 records of 1,000 bytes, all arrived before the server reads: the first read fills
    the 256 KiB read buffer and leaves the rest of a record decrypted in the SSL object, the
    socket empty. No epoll event will come for it: resume_reading has it read all the same."""
    import threading

    total = 263 * 1000
    all_read = threading.Event()

    class Slow(App):
        def __init__(self) -> None:
            super().__init__()
            self.got = 0
            self.done = asyncio.Event()
            self.sizes: list[int] = []

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            transport.pause_reading()  # until the client has sent all

        def data_received(self, data: bytes) -> None:
            self.sizes.append(len(data))
            self.got += len(data)
            if self.got >= total:
                self.done.set()
                all_read.set()
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(0.02, self.transport.resume_reading)

    app = Slow()

    def client(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=GUARD) as raw:
            tls = client_context(certs).wrap_socket(raw, server_hostname="localhost")
            for i in range(263):
                tls.sendall(bytes([i % 256]) * 1000)
            import time

            time.sleep(0.2)  # all of it in the server's socket
            running["loop"].call_soon_threadsafe(app.transport.resume_reading)
            # Open until the server has read it all: its FIN would wake the server's reading.
            all_read.wait(GUARD)

    async def scenario() -> list[int]:
        running["loop"] = asyncio.get_running_loop()
        server = await _serve(_context(certs), app, layer="c")
        try:
            thread = asyncio.create_task(asyncio.to_thread(client, _port(server)))
            await asyncio.wait_for(app.done.wait(), GUARD)
            await thread
        finally:
            server.close()
        return app.sizes

    running: dict[str, asyncio.AbstractEventLoop] = {}
    sizes = asyncio.run(scenario())
    assert sum(sizes) == total
    assert sizes[0] == 256 * 1024  # the read that left bytes in the SSL object


@pytest.mark.needs_compiled
def test_a_c_transport_built_without_openssl_runs_tls_listeners_in_python(
    tmp_path: Path, certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    """setup.py builds _streams.c without OpenSSL's headers when they are missing: that build
    has no TLS of its own, says why, and a TLS listener runs the Python layer on it."""
    import importlib.machinery
    import importlib.util
    import subprocess
    import sysconfig

    import mqttbroker.server as package

    source = Path(package.__file__).parent / "_streams.c"
    built = tmp_path / "_streams.so"
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", f"-I{include}", str(source), "-o", str(built)],
        check=True,
    )
    name = "mqttbroker.server._streams"
    loader = importlib.machinery.ExtensionFileLoader(name, str(built))
    spec = importlib.util.spec_from_file_location(name, str(built), loader=loader)
    assert spec is not None
    without = importlib.util.module_from_spec(spec)
    loader.exec_module(without)
    assert without.TLS == 0 and not hasattr(without, "TLSStream")
    monkeypatch.setattr(streams, "_streams", without)
    assert streams.native_tls(_context(certs)) == (
        "the C transport was built without OpenSSL's headers"
    )
    tls = ListenerConfig(
        host="127.0.0.1",
        port=0,
        tls_cert_file=str(certs.server_cert),
        tls_key_file=str(certs.server_key),
    )

    async def scenario() -> tuple[bytes, str, bool]:
        server = Server(memory_config(tmp_path, tls))
        await server.start()
        try:
            port = server.addresses[0][1]
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_context(certs), server_hostname="localhost"
            )
            writer.write(connect_packet(unique("nossl"), MQTT_311))
            answer = await asyncio.wait_for(reader.readexactly(4), GUARD)
            (conn,) = server.broker.connections
            transport = conn.link.transport  # type: ignore[attr-defined]
            kinds = type(transport).__name__, type(transport.transport) is without.Stream
            writer.close()
        finally:
            await server.stop()
        return answer, *kinds

    answer, transport, below = asyncio.run(scenario())
    assert answer == CONNACK_OK
    assert (transport, below) == ("TLSLayer", True)

"""The Links in process: the WebSocket link's writer (one task per connection, output joined
into frames, pause_writing past the high-water mark and resume_writing once drained, the close
frame after the last bytes), its reading loop (paused reading stops receiving; a text frame
aborts), and ``certificate_user`` on TLS and WebSocket+TLS links with a real Server."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType
from support.certs import Certificates, client_context
from support.clients import CONNACK_OK, MQTT_311, connect_packet, unique
from support.listeners import memory_config, serving

from mqttbroker.broker.stats import BrokerStats
from mqttbroker.config import ListenerConfig
from mqttbroker.server.tcp import WRITE_HIGH_WATER, MQTTProtocol
from mqttbroker.server.websocket import FRAME_TARGET, WebSocketLink

GUARD = 10.0  # seconds: a failure guard, never a measured time


class FakeWebSocket:
    """What WebSocketLink uses of aiohttp's WebSocketResponse. ``gate`` holds sends, like a
    socket whose buffer is full."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.incoming: asyncio.Queue[aiohttp.WSMessage] = asyncio.Queue()
        self.close_code: int | None = None
        self.closed = False
        self.receiving = False

    async def send_bytes(self, data: bytes) -> None:
        await self.gate.wait()
        self.frames.append(bytes(data))

    async def close(self, *, code: int = 1000) -> bool:
        self.close_code = code
        self.closed = True
        if self.receiving:  # as aiohttp does: a pending receive() gets CLOSING
            self.incoming.put_nowait(aiohttp.WSMessage(WSMsgType.CLOSING, None, None))
        return True

    async def receive(self) -> aiohttp.WSMessage:
        self.receiving = True
        try:
            if self.closed:
                return aiohttp.WSMessage(WSMsgType.CLOSED, None, None)
            return await self.incoming.get()
        finally:
            self.receiving = False


class FakeConnection:
    def __init__(self, on_data: Callable[[bytes], None] | None = None) -> None:
        self.events: list[str] = []
        self.received: list[bytes] = []
        self.on_data = on_data

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def data_received(self, data: bytes) -> None:
        self.received.append(data)
        if self.on_data is not None:
            self.on_data(data)

    def connection_lost(self) -> None:
        self.events.append("lost")


class FakeBroker:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn
        self.stats = BrokerStats()  # the link must leave the byte counts to the connection

    def connect(
        self,
        link: Any,
        peer: str,
        address: str | None = None,
        policy: Any = None,
        certificate_user: str | None = None,
    ) -> FakeConnection:
        return self.conn


async def until(condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0)

    await asyncio.wait_for(poll(), GUARD)


async def start(
    conn: FakeConnection | None = None,
) -> tuple[FakeConnection, FakeWebSocket, WebSocketLink, asyncio.Task[None]]:
    """A WebSocket link serving ``conn`` (a new fake connection if none), once it is reading
    the socket."""
    conn = conn or FakeConnection()
    ws = FakeWebSocket()
    link = WebSocketLink(ws, ListenerConfig(protocol="ws"))  # type: ignore[arg-type]
    task = asyncio.create_task(link.serve(FakeBroker(conn), "peer"))  # type: ignore[arg-type]
    await until(lambda: ws.receiving)
    return conn, ws, link, task


def test_writer_joins_output_pauses_and_resumes() -> None:
    async def scenario() -> None:
        conn, ws, link, task = await start()
        ws.gate.clear()  # the socket takes nothing for now
        chunk = 100 * 1024
        writes = [bytes([n]) * chunk for n in range(50)]  # 5 MB
        paused_at = None
        for index, data in enumerate(writes):
            link.write(data)
            if paused_at is None and conn.events == ["pause"]:
                paused_at = index
        assert conn.events == ["pause"]
        assert paused_at == WRITE_HIGH_WATER // chunk  # the write that crossed the mark
        ws.gate.set()
        await until(lambda: sum(map(len, ws.frames)) == len(writes) * chunk)
        assert conn.events == ["pause", "resume"]
        assert b"".join(ws.frames) == b"".join(writes)  # in order, nothing lost
        assert all(len(frame) <= FRAME_TARGET for frame in ws.frames)
        assert len(ws.frames) < len(writes)  # joined: several writes per frame
        link.close()
        await asyncio.wait_for(task, GUARD)
        assert ws.close_code == 1000

    asyncio.run(scenario())


def test_close_sends_what_was_written_first() -> None:
    async def scenario() -> None:
        conn, ws, link, task = await start()
        link.write(b"\x20\x02\x00\x00")
        link.write(b"\xe0\x00")
        link.close()
        link.write(b"after close")  # ignored
        await asyncio.wait_for(task, GUARD)
        assert ws.frames == [b"\x20\x02\x00\x00\xe0\x00"]
        # counted once, by the connection (Connection.flush), not again by the link
        assert link.broker is not None and link.broker.stats.bytes_sent == 0
        assert ws.close_code == 1000
        assert conn.events == ["lost"]  # the connection is told (it ignores it once closed)

    asyncio.run(scenario())


def test_paused_reading_stops_receiving() -> None:
    async def scenario() -> None:
        link_box: list[WebSocketLink] = []
        conn = FakeConnection(on_data=lambda data: link_box[0].pause_reading())
        conn, ws, link, task = await start(conn)
        link_box.append(link)
        ws.incoming.put_nowait(aiohttp.WSMessage(WSMsgType.BINARY, b"one", None))
        ws.incoming.put_nowait(aiohttp.WSMessage(WSMsgType.BINARY, b"two", None))
        await until(lambda: conn.received == [b"one"])
        for _ in range(20):
            await asyncio.sleep(0)
        assert conn.received == [b"one"] and ws.incoming.qsize() == 1
        conn.on_data = None
        link.resume_reading()
        await until(lambda: conn.received == [b"one", b"two"])
        # counted once, by the connection (Connection.data_received), not again by the link
        assert link.broker is not None and link.broker.stats.bytes_received == 0
        ws.incoming.put_nowait(aiohttp.WSMessage(WSMsgType.CLOSED, None, None))
        await asyncio.wait_for(task, GUARD)
        assert conn.events == ["lost"]

    asyncio.run(scenario())


def test_text_frame_aborts_and_drops_output() -> None:
    async def scenario() -> None:
        conn, ws, link, task = await start()
        ws.gate.clear()
        link.write(b"pending output")
        ws.incoming.put_nowait(aiohttp.WSMessage(WSMsgType.TEXT, "text", None))
        await until(lambda: "lost" in conn.events)
        ws.gate.set()
        await asyncio.wait_for(task, GUARD)
        assert ws.close_code == 1003
        assert b"".join(ws.frames) in (b"", b"pending output")  # taken before, or dropped
        assert conn.received == []

    asyncio.run(scenario())


# -- certificate_user on real links ----------------------------------------------------------


async def _connect_tcp(port: int, context: ssl.SSLContext | None, client_id: str) -> Any:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="localhost" if context else None
    )
    writer.write(connect_packet(client_id, MQTT_311))
    assert await asyncio.wait_for(reader.readexactly(4), GUARD) == CONNACK_OK
    return writer


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_certificate_user_on_tls_and_websocket_links(
    tmp_path: Path, certs: Certificates, loop: str
) -> None:
    """On both event loops the broker runs on (uvloop's SSL transport is its own)."""
    tls = {"tls_cert_file": str(certs.server_cert), "tls_key_file": str(certs.server_key)}
    mtls = {**tls, "tls_ca_file": str(certs.ca)}
    config = memory_config(
        tmp_path,
        ListenerConfig(port=0, **tls),  # type: ignore[arg-type]
        ListenerConfig(port=0, tls_certificate_username="cn", **mtls),  # type: ignore[arg-type]
        ListenerConfig(port=0, tls_certificate_username="san", **mtls),  # type: ignore[arg-type]
        ListenerConfig(port=0, protocol="ws", tls_certificate_username="cn", **mtls),  # type: ignore[arg-type]
    )

    async def scenario() -> dict[str, tuple[type, str | None]]:
        server, ports = await serving(config)
        with_cert = client_context(certs, with_cert=True)
        without = client_context(certs)
        seen: dict[str, tuple[type, str | None]] = {}
        writers = []
        session = aiohttp.ClientSession()
        try:
            cases = [
                ("tls-with-cert", ports[0], with_cert),
                ("cn-with-cert", ports[1], with_cert),
                ("cn-without-cert", ports[1], without),  # optional: not required here
                ("san-with-cert", ports[2], with_cert),
            ]
            ids = {name: unique(name) for name, _, _ in cases}
            for name, port, context in cases:
                writers.append(await _connect_tcp(port, context, ids[name]))
            ws = await session.ws_connect(
                f"wss://localhost:{ports[3]}/mqtt", protocols=("mqtt",), ssl=with_cert
            )
            ids["wss-cn"] = unique("wss")
            await ws.send_bytes(connect_packet(ids["wss-cn"], MQTT_311))
            answer = await asyncio.wait_for(ws.receive(), GUARD)
            assert answer.type is WSMsgType.BINARY and answer.data == CONNACK_OK
            by_id = {conn.client_id: conn for conn in server.broker.connections}
            for name, client_id in ids.items():
                conn = by_id[client_id]
                seen[name] = (type(conn.link), conn.certificate_user)
            await ws.close()
        finally:
            for writer in writers:
                writer.close()
            await session.close()
            await server.stop()
        return seen

    if loop == "uvloop":
        import uvloop  # the [fast] extra, which the test command installs

        seen = uvloop.run(scenario())
    else:
        seen = asyncio.run(scenario())
    assert seen == {
        "tls-with-cert": (MQTTProtocol, None),  # no tls_certificate_username
        "cn-with-cert": (MQTTProtocol, "alice"),
        "cn-without-cert": (MQTTProtocol, None),
        "san-with-cert": (MQTTProtocol, "alice@example.test"),
        "wss-cn": (WebSocketLink, "alice"),
    }

"""``ws_trusted_proxies``: behind a reverse proxy, the client a WebSocket connection is counted and
logged as is the one the proxy names in X-Forwarded-For, and only a trusted proxy is believed.

``forwarded_client`` on its own (chains, several headers, ports, IPv6, malformed entries), then a
real Server whose WebSocket listeners sit behind "a proxy" on 127.0.0.1: with
``max_connections_per_address = 1`` two clients forwarded from different addresses are both
accepted and a second from the same address is refused, naming it; on a listener that trusts
nobody the header changes nothing."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType
from support.clients import CONNACK_OK, MQTT_311, connect_packet, unique

from mqttbroker.config import Config, ListenerConfig, trusted_networks
from mqttbroker.server.app import Server
from mqttbroker.server.websocket import forwarded_client

GUARD = 10.0  # seconds: a failure guard, never a measured time
TRUSTED = trusted_networks("127.0.0.1, 10.0.0.0/8, 2001:db8::/32")


@pytest.mark.parametrize(
    ("proxy", "headers", "client"),
    [
        ("127.0.0.1", ["203.0.113.7"], "203.0.113.7"),
        ("::ffff:127.0.0.1", ["203.0.113.7"], "203.0.113.7"),  # a dual-stack socket's form
        ("127.0.0.1", ["198.51.100.1, 203.0.113.7"], "203.0.113.7"),  # the client wrote the first
        ("127.0.0.1", ["198.51.100.1, 203.0.113.7, 10.1.2.3"], "203.0.113.7"),  # two proxies
        ("127.0.0.1", ["198.51.100.1", "203.0.113.7, 10.1.2.3"], "203.0.113.7"),  # two headers
        ("127.0.0.1", ["10.9.9.9, 10.1.2.3"], "10.9.9.9"),  # every hop trusted: the first
        ("127.0.0.1", ["203.0.113.7:4711"], "203.0.113.7"),
        ("127.0.0.1", ["[2001:db9::1]:4711"], "2001:db9::1"),
        ("2001:db8::5", ["2001:db9::1"], "2001:db9::1"),
        ("127.0.0.1", ["203.0.113.7,"], "203.0.113.7"),  # empty entries are skipped
        ("127.0.0.1", ["", "203.0.113.7"], "203.0.113.7"),
        ("127.0.0.1", [""], None),
        ("127.0.0.1", ["::ffff:203.0.113.7"], "203.0.113.7"),  # one client, one address
        ("127.0.0.1", ["203.0.113.7, unknown"], None),  # malformed: not believed at all
        ("127.0.0.1", ["[203.0.113.7]junk"], None),
        ("127.0.0.1", ["[2001:db9::1"], None),
        ("127.0.0.1", ["203.0.113.7:http"], None),
        ("127.0.0.1", ["not-an-address"], None),
        ("127.0.0.1", [], None),  # no header
        ("192.0.2.50", ["203.0.113.7"], None),  # not a trusted proxy: its header counts for nothing
    ],
)
def test_forwarded_client(proxy: str, headers: list[str], client: str | None) -> None:
    assert forwarded_client(proxy, headers, TRUSTED) == client


def test_forwarded_client_without_trusted_proxies() -> None:
    assert forwarded_client("127.0.0.1", ["203.0.113.7"], ()) is None


async def _mqtt_over_ws(
    session: aiohttp.ClientSession, port: int, forwarded: str
) -> tuple[aiohttp.ClientWebSocketResponse, bytes | None]:
    """Connect through WebSocket with this X-Forwarded-For; the CONNACK, or None if closed."""
    ws = await session.ws_connect(
        f"ws://127.0.0.1:{port}/mqtt",
        protocols=("mqtt",),
        headers={"X-Forwarded-For": forwarded},
    )
    await ws.send_bytes(connect_packet(unique("proxied"), MQTT_311))
    answer = await asyncio.wait_for(ws.receive(), GUARD)
    if answer.type is WSMsgType.BINARY:
        return ws, answer.data
    assert answer.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED), answer
    return ws, None


def test_limits_and_logs_count_the_forwarded_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = Config(
        listeners=[
            ListenerConfig(
                port=0, protocol="ws", ws_trusted_proxies="127.0.0.1", allow_anonymous=True
            ),
            ListenerConfig(port=0, protocol="ws"),  # trusts nobody
            # Behind a proxy, a loopback listener serves whoever the proxy serves: anonymous
            # clients are refused unless allowed (3.1.1 CONNACK 5, not authorized).
            ListenerConfig(port=0, protocol="ws", ws_trusted_proxies="127.0.0.1"),
        ],
        data_dir=str(tmp_path),
    )
    config.storage.backend = "memory"
    config.broker.max_connections_per_address = 1

    async def scenario() -> dict[str, Any]:
        server = Server(config)
        await server.start()
        behind, plain, guarded = (listener.addresses[0][1] for listener in server.listeners)
        seen: dict[str, Any] = {}
        async with aiohttp.ClientSession() as session:
            sockets = []
            try:
                for name, port, forwarded in [
                    ("first", behind, "203.0.113.7"),
                    ("other", behind, "198.51.100.9, 203.0.113.8"),
                    ("again", behind, "203.0.113.7"),
                    ("plain-first", plain, "192.0.2.1"),
                    ("plain-second", plain, "192.0.2.2"),
                    ("anonymous", guarded, "192.0.2.3"),
                ]:
                    ws, connack = await _mqtt_over_ws(session, port, forwarded)
                    sockets.append(ws)
                    seen[name] = connack
                seen["peers"] = sorted(conn.peer for conn in server.broker.connections)
            finally:
                for ws in sockets:
                    await ws.close()
                await server.stop()
        return seen

    with caplog.at_level(logging.INFO, logger="mqttbroker"):
        seen = asyncio.run(scenario())
    assert seen["first"] == CONNACK_OK and seen["other"] == CONNACK_OK
    assert seen["again"] is None  # the same client address behind the proxy: over the limit
    # Without trusted proxies both come from 127.0.0.1 whatever the header says.
    assert seen["plain-first"] == CONNACK_OK and seen["plain-second"] is None
    assert seen["anonymous"] == b"\x20\x02\x00\x05"
    forwarded = [p for p in seen["peers"] if "(via 127.0.0.1:" in p]
    assert sorted(p.partition(" ")[0] for p in forwarded) == ["203.0.113.7", "203.0.113.8"]
    assert "max_connections_per_address (1) reached for 203.0.113.7" in caplog.text
    assert "max_connections_per_address (1) reached for 127.0.0.1" in caplog.text

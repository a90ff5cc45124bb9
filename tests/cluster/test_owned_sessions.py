"""A node getting back to Redis (``ClusterNode._owned_sessions``, after a lapse or a restart)
writes its sessions there whole; in process, on a real redis-server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.redis_server import RedisServer

from mqttbroker.config.sections import ClusterConfig, Config, StorageConfig
from mqttbroker.server.app import Server

pytestmark = pytest.mark.needs_redis

STATE = {
    "username": None,
    "expiry": 3600,
    "subscriptions": [["t/#", 1, False, False, 0, None]],
    "deliveries": [],
    "releases": [],
    "next_packet_id": 1,
}


def test_a_session_built_again_meanwhile_is_not_written_over(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """While the node asks Redis who owns its sessions, a claim under way builds one of them
    again from another node's answer (the old object ends). The node does not write the old,
    ended session whole over it (no subscriptions: the session would get nothing any more)."""

    async def run() -> None:
        config = Config(
            storage=StorageConfig(backend="memory"),
            cluster=ClusterConfig(redis=redis_server.url, node_id="a"),
            data_dir=str(tmp_path),
        )
        server = Server(config)
        node = server.cluster
        assert node is not None
        await node.connect()
        try:
            node._restore("dev", STATE)  # (here before)
            asking = asyncio.ensure_future(node._owned_sessions())
            await asyncio.sleep(0)  # (its question is on its way to Redis)
            node._restore("dev", STATE)  # the claim's session, from another node
            await asking
            change = node.store.changes["dev"]
            assert change.session is server.broker.sessions["dev"]
            assert "f:t/#" in change.fields
        finally:
            await node.stop()

    asyncio.run(run())

"""The node's Redis client reports a connection that Redis reset under it as redis-py's
ConnectionError (what every caller handles as "Redis is unreachable") on uvloop as on asyncio's
own loop, and a node that meets an unforeseen error while reconnecting goes on trying."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import types
from collections.abc import Coroutine
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from support.redis_server import RedisServer

from mqttbroker.cluster.node import ClusterNode, kept_running
from mqttbroker.cluster.redis_client import redis_client


def _run_on(loop: str, main: Coroutine[Any, Any, None]) -> None:
    if loop == "uvloop":
        import uvloop  # the [fast] extra, which the test command installs

        uvloop.run(main)
    else:
        asyncio.run(main)


@pytest.mark.needs_redis
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_connection_reset_under_the_client_is_a_connection_error(
    loop: str, redis_server: RedisServer
) -> None:
    client = redis_client(redis_server.url, 2.0, 10.0)
    found: list[BaseException | None] = []

    async def scenario() -> None:
        assert redis_server.proc is not None
        connection = await client.connection_pool.get_connection()
        try:
            os.kill(redis_server.proc.pid, signal.SIGSTOP)
            await connection.send_command("PING")  # (unread: Redis is stopped)
            redis_server.proc.kill()  # (closing a socket with unread input resets it)
            redis_server.proc.wait()
            await asyncio.sleep(0.2)  # (the reset is here already: the loop takes it in)
            try:
                await connection.send_command("PING")
            except Exception as exc:  # noqa: BLE001 (which one is what the test checks)
                found.append(exc)
            # and the client goes on: the next command tries to connect again, and says
            # Redis is not there
            with pytest.raises(RedisConnectionError):
                await client.ping()
        finally:
            await client.connection_pool.release(connection)
            await client.aclose()

    _run_on(loop, scenario())
    assert len(found) == 1, "writing on a connection Redis reset did not fail"
    assert isinstance(found[0], RedisConnectionError), repr(found[0])


def test_the_url_chooses_the_connection_and_its_query_options_win() -> None:
    for url, kind in (
        ("redis://127.0.0.1:6379/0", aioredis.Connection),
        ("rediss://127.0.0.1:6379/0", aioredis.SSLConnection),
        ("unix:///run/redis.sock", aioredis.UnixDomainSocketConnection),
    ):
        client = redis_client(url, 2.0, 10.0)
        pool = client.connection_pool
        assert issubclass(pool.connection_class, kind), url
        assert pool.connection_kwargs["socket_timeout"] == 10.0
        assert pool.connection_kwargs["socket_connect_timeout"] == 2.0
    client = redis_client("redis://127.0.0.1:6379/0?socket_timeout=3", 2.0, 10.0)
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 3.0


class _Reconnecting:
    """What ClusterNode._reconnect uses of a node: the event that says Redis was lost, and the
    tries to get it back (here: an unforeseen error, Redis not there yet, then back)."""

    def __init__(self) -> None:
        self._gone = asyncio.Event()
        self.tries = 0
        self.back = asyncio.Event()

    async def _back(self) -> bool:
        self.tries += 1
        if self.tries == 1:
            raise RuntimeError("an error no one foresaw")
        if self.tries == 2:
            return False
        self.back.set()
        return True


def test_a_node_whose_reconnection_failed_unforeseen_goes_on_trying(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = _Reconnecting()

    async def scenario() -> None:
        task = asyncio.create_task(
            kept_running(types.MethodType(ClusterNode._reconnect, node))  # type: ignore[arg-type]
        )
        node._gone.set()
        try:
            await asyncio.wait_for(node.back.wait(), 10)
        finally:
            task.cancel()

    with caplog.at_level(logging.ERROR, logger="mqttbroker.cluster"):
        asyncio.run(scenario())
    assert node.tries == 3
    assert not node._gone.is_set()
    assert [r.getMessage() for r in caplog.records] == [
        "cluster: error in reconnect, started again"
    ]

"""The node's Redis client: redis-py's asyncio client, whose connections report a connection
that closed under them as a connection error on every event loop.

On uvloop, writing to a transport that the peer has already reset raises RuntimeError ("the
handler is closed") where asyncio's own loop raises ConnectionResetError, which redis-py turns
into its ConnectionError. A node that reconnects just as Redis dies meets this (the connection
is accepted, then reset before the first command is written). Every place that talks to Redis
handles ConnectionError as "Redis is unreachable"; an unexpected RuntimeError would instead stop
the task that met it.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, parse_url
from redis.exceptions import ConnectionError as RedisConnectionError

# How uvloop's RuntimeError for a closed transport ends ("unable to perform operation on
# <TCPTransport closed=True ...>; the handler is closed").
CLOSED = "the handler is closed"


class _ClosedIsConnectionError(AbstractConnection):
    """Mixed into the connection class the URL chooses (TCP, TLS or a Unix socket)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except RuntimeError as exc:  # (redis-py has disconnected the connection already)
            if not str(exc).endswith(CLOSED):
                raise  # (a bug, not Redis: kept_running logs it with its traceback)
            raise RedisConnectionError(f"Error while writing to socket. {exc}.") from exc


def redis_client(
    url: str, connect_timeout: float, read_timeout: float, single: bool = False
) -> Any:
    """A client of the Redis at ``url`` (redis://, rediss:// or unix://, with redis-py's query
    options); ``connect_timeout`` and ``read_timeout`` in seconds. Typed Any: redis-py's types
    do not know that responses are bytes here. ``single``: every command on one connection, in
    turn (a new one only once it is lost), not a pool's."""
    # (as redis-py's from_url: the URL's query options win)
    options: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": read_timeout,
        **parse_url(url),
    }
    base: type[AbstractConnection] = options.pop("connection_class", aioredis.Connection)
    options["connection_class"] = type(base.__name__, (_ClosedIsConnectionError, base), {})
    pool = aioredis.ConnectionPool(**options)
    if single:
        client = aioredis.Redis(connection_pool=pool, single_connection_client=True)
        client.auto_close_connection_pool = True
        return client
    return aioredis.Redis.from_pool(pool)

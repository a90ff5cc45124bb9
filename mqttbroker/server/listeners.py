"""Listeners: one per [[listener]] table, each with its own address, protocol and TLS settings.

``start_listener`` binds one and returns a ``Listener`` that the Server stops in two steps:
``close()`` stops accepting (before the broker disconnects its clients), ``wait_closed()`` waits
for the sockets, and for a WebSocket listener gives aiohttp's handlers time to finish their
closing handshakes.

Every listener has an ``MQTTProtocol`` per socket. MQTT over TCP, plain and TLS, is served by the
broker's own transport (``StreamServer``, streams.py; TLS in OpenSSL on its sockets) when it is
built, or else by an asyncio server made by ``loop.create_server`` (TLS through the Python layer,
tlslayer.py); MQTT over WebSocket by one with
aiohttp's low-level ``web.Server`` as the protocol factory (aiohttp is imported only when a
WebSocket listener is configured). Behind
PROXY-protocol balancers (``proxy_protocol``) a ``ProxyAcceptor`` accepts instead and hands each
socket to the loop once its header is read (proxy.py). TLS
handshakes, and the WebSocket upgrade after the accept, must finish within the broker's
``connect_timeout``. A listener that cannot listen (address in use, a host that does not resolve)
is a StartError naming it, its address and the cause.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, cast

from ..broker.core import Broker
from ..broker.policy import OPEN, ListenerPolicy
from ..config import ListenerConfig, trusted_networks
from ..security.tls import server_context
from ..storage import describe
from . import StartError, streams
from .proxy import ProxyAcceptor, bind
from .streams import StreamServer
from .tcp import ListenerContext, MQTTProtocol
from .tlslayer import TLSLayer

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("mqttbroker")


class Listener:
    __slots__ = ("config", "server", "runner", "addresses")

    def __init__(
        self,
        config: ListenerConfig,
        server: asyncio.base_events.Server | ProxyAcceptor | StreamServer,
        runner: web.AppRunner | None = None,
    ) -> None:
        self.config = config
        self.server = server
        self.runner = runner
        self.addresses: list[tuple[str, int]] = [
            (sock.getsockname()[0], sock.getsockname()[1]) for sock in server.sockets
        ]

    def close(self) -> None:
        """Stop accepting connections."""
        self.server.close()

    async def wait_closed(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()  # waits for the handlers (bounded), then cancels them
        await self.server.wait_closed()


def _protocol(shared: ListenerContext, origin: tuple[str, str | None]) -> asyncio.BaseProtocol:
    # MQTTProtocol has every method of asyncio.Protocol but, compiled, not that base class
    return cast(asyncio.BaseProtocol, MQTTProtocol(shared.for_origin(origin)))


def somaxconn() -> int | None:
    """The kernel's cap on any listening socket's backlog (Linux: net.core.somaxconn), or None
    where it cannot be read."""
    try:
        with open("/proc/sys/net/core/somaxconn") as file:
            return int(file.read())
    except (OSError, ValueError):
        return None


async def start_listener(
    broker: Broker,
    listener: ListenerConfig,
    where: str,
    policy: ListenerPolicy = OPEN,
    reuse_port: bool = False,
    gather: float = 0.0,
) -> Listener:
    """Bind ``listener`` and log "listening on HOST:PORT (MQTT over ...)" for each socket.
    ``where`` names it in configuration and start errors (e.g. ``"listener[1]"``); ``policy``
    is what the broker is told about each connection it accepts; ``reuse_port``: share the
    port with other processes (SO_REUSEPORT; ``workers``); ``gather``: seconds, ``gather_us`` of
    the configuration (plain TCP listeners on the own transport, streams.py)."""
    limit = somaxconn()
    if limit is not None and listener.backlog > limit:
        log.warning(
            "%s.backlog = %d is above the kernel's net.core.somaxconn (%d), which caps it: "
            "raise net.core.somaxconn (sysctl) to hold that many connections not yet accepted",
            where,
            listener.backlog,
            limit,
        )
    try:
        return await _start_listener(broker, listener, where, policy, reuse_port, gather)
    except OSError as exc:
        if isinstance(exc, socket.gaierror):
            cause = f"cannot resolve host {listener.host!r}: {exc.strerror}"
        else:
            cause = describe(exc)
        raise StartError(
            f"{where} {listener.host}:{listener.port} ({listener.kind}): cannot listen: {cause}"
        ) from None


def _tls_protocol(
    context: ssl.SSLContext, timeout: float, app: Callable[[], asyncio.BaseProtocol]
) -> asyncio.BaseProtocol:
    return cast(asyncio.BaseProtocol, TLSLayer(context, timeout, app()))


async def _start_listener(
    broker: Broker,
    listener: ListenerConfig,
    where: str,
    policy: ListenerPolicy,
    reuse_port: bool,
    gather: float,
) -> Listener:
    loop = asyncio.get_running_loop()
    context = server_context(listener, where)
    handshake_timeout = broker.options.connect_timeout if context is not None else None
    runner: web.AppRunner | None = None
    native_tls: ssl.SSLContext | None = None  # TLS in the C transport (streams.py)
    factory: Callable[[], asyncio.BaseProtocol]
    shared = ListenerContext(broker, listener, policy)  # (one for all its connections)
    if listener.protocol == "ws":
        from aiohttp import web

        from .websocket import SHUTDOWN_TIMEOUT, bounded, make_app

        app = make_app(broker, listener, policy)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT
        )
        await runner.setup()
        web_server = runner.server
        assert web_server is not None
        factory = bounded(web_server, app, broker.options.connect_timeout)
    elif listener.proxy_protocol:
        acceptor = ProxyAcceptor(
            loop,
            bind(listener.host, listener.port, reuse_port, listener.backlog),
            trusted_networks(listener.proxy_protocol),
            lambda name, address: _protocol(shared, (name, address)),
            context,
            broker.options.connect_timeout,
        )
        result = Listener(listener, acceptor)
        for host, port in result.addresses:
            log.info(
                "listening on %s:%d (%s), PROXY protocol from %s",
                host,
                port,
                listener.kind,
                listener.proxy_protocol,
            )
        return result
    else:
        # a partial, not a lambda: the loop calls it for each connection, straight into C
        factory = cast(
            Callable[[], asyncio.BaseProtocol],
            partial(MQTTProtocol, shared),
        )
        if context is not None:
            why = streams.native_tls(context) if streams.available() else None
            if streams.available() and why is None:  # TLS in the C transport (streams.py)
                native_tls = context
            else:  # TLS over the plain transport (tlslayer.py)
                if why is not None:
                    log.info("%s: TLS in the Python layer, not in the C transport: %s", where, why)
                factory = partial(_tls_protocol, context, broker.options.connect_timeout, factory)
            context = handshake_timeout = None
    server: asyncio.base_events.Server | StreamServer
    if listener.protocol != "ws" and context is None and streams.available():
        passes = broker.scheduler
        hooks = (passes.pass_begin, passes.pass_end) if passes.hook_passes else None
        sockets = bind(listener.host, listener.port, reuse_port, listener.backlog)
        server = StreamServer(
            loop,
            sockets,
            factory,
            hooks=hooks,
            gather=gather,
            tls=native_tls,
            handshake_timeout=broker.options.connect_timeout if native_tls is not None else 0.0,
        )
    else:
        try:
            server = await loop.create_server(
                factory,
                listener.host,
                listener.port,
                ssl=context,
                ssl_handshake_timeout=handshake_timeout,
                reuse_address=True,
                reuse_port=reuse_port or None,
                backlog=listener.backlog,
            )
        except BaseException:
            if runner is not None:
                await runner.cleanup()
            raise
    result = Listener(listener, server, runner)
    for host, port in result.addresses:
        log.info("listening on %s:%d (%s)", host, port, listener.kind)
    return result

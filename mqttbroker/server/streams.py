"""The broker's own TCP transport, for MQTT over TCP listeners, plain and TLS; not WebSocket or
PROXY protocol ones, which stay on the event loop's transports.

An idle connection on an event loop's transport carries the loop's own objects (on uvloop: the
transport object, libuv's handle, the entry in the loop's weak dictionary of transports), more
than a small C broker spends on its whole connection. ``_streams`` (C, Linux) serves the
sockets of a listener on one epoll instance that the loop watches as a single descriptor: each
connection is a 64-byte transport with asyncio's methods and callbacks, so the protocol (tcp.py) is
the same on either. Reading a socket is a ``recv`` and a call of ``data_received`` (repeated while a
read fills the 256 KiB buffer), writing one ``send`` (the rest queued until the socket takes it,
then written with one ``sendmsg`` over the queue), as on uvloop. What is queued is copied into the
stream's buffer when small (under 16 KiB) or mutable (bytearray, memoryview), and kept by reference
when it is a ``bytes`` object someone else holds too (one made for the write alone, a join, is
copied: the allocator reuses its block at once): the one encoding of a large message written to many
clients that do not read (a retained message replayed to 200 subscribers of ``#``, say) is then
shared by all of them, where a copy each would hold up to the high-water mark per client.
``get_write_buffer_size`` counts both, so pause_writing and
resume_writing come as before. The listening sockets defer accepting until a client's first bytes
arrive (TCP_DEFER_ACCEPT), and a new connection is read at once. When one socket is ready after a
quiet spell (100 µs since the last pass), its TCP acknowledgement is held (TCP_QUICKACK off) until
the protocol has handled the read: the kernel would otherwise send it from within recv(), and on
loopback a forwarded message would wait for the peer's handling of that ACK.

A listener's poller calls the broker's ``pass_begin`` and ``pass_end`` (broker/passes.py) around
each of its passes (``hooks``): the pass's output is flushed at its end, without a callback of the
loop.

``gather`` (``gather_us`` of the configuration, 200 µs by default) trades latency for CPU under
load: after a pass that found two or more sockets ready, the poller sleeps (the GIL released)
until ``gather`` seconds after that pass began, and the next pass reads what arrived meanwhile.
Not after a pass that read a socket written to since its previous read: that client may be
waiting for the answer (a PUBACK, a reply) before it sends more, and would only be slowed. Nor
while sockets are found ready at a rate that would bring fewer than 4 in one sleep (over 10 ms):
the sleep is a wake-up of its own, which a sparse fleet's few messages more per pass do not pay
back.
benchmarks/README.md has what it saves and costs.

TLS runs in OpenSSL on the socket itself, in C (as Mosquitto's): each connection's SSL object is
made from the listener's ``ssl.SSLContext`` (security/tls.py: certificates, verification, session
tickets), the handshake runs as the socket is ready, and the protocol has the connection once it
is done, within ``handshake_timeout`` (``connect_timeout``); a failed handshake closes the socket
(logged at debug level). ``get_extra_info("peercert")`` is ``ssl``'s ``getpeercert()`` (a verified
client certificate's name: tls.py). CPython offers no accessor for a context's ``SSL_CTX``:
``native_tls`` says when it cannot be taken (another layout, another OpenSSL, a callback of the
context's that expects CPython's own socket objects), and the listener then runs the Python TLS
layer (tlslayer.py) on this transport, as do builds without OpenSSL's headers.

It is used when the compiled modules are (``mqttbroker.compiled``; ``MQTTBROKER_PURE`` turns
both off) on a loop with ``add_reader`` on descriptors; otherwise the listener is the loop's
``create_server``.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
from collections.abc import Callable

from .. import compiled
from .proxy import ACCEPT_RETRY, log_accept_failure

try:
    from . import _streams
except ImportError as error:  # not built: not Linux, no C compiler, MQTTBROKER_COMPILE=0
    _streams = None  # type: ignore[assignment]
    _import_error = str(error)
else:
    _import_error = ""

# TCP_DEFER_ACCEPT: the kernel hands a connection over once its first bytes (the CONNECT) have
# arrived, so that one wake-up of the broker accepts it and reads them; a client silent for
# about this many seconds is handed over without (and connect_timeout applies from then on).
DEFER_ACCEPT = 1


def available() -> bool:
    """Whether listeners use this transport."""
    return _streams is not None and compiled.mode == "compiled"


def missing() -> str | None:
    """Why the compiled form runs without this transport on Linux, where the install builds the
    two together (a build copied without it, a module that does not load): the import's error.
    None when it is there, when the pure form runs, and where it is not built (not Linux)."""
    if _streams is not None or compiled.mode != "compiled" or not sys.platform.startswith("linux"):
        return None
    return _import_error


def native_tls(context: ssl.SSLContext) -> str | None:
    """Why TLS with ``context`` cannot run in the C transport (None: it can)."""
    if _streams is None or not _streams.TLS:
        return "the C transport was built without OpenSSL's headers"
    # Callbacks CPython installs in the SSL_CTX find their Python socket object through the
    # SSL object, which the C transport's are not.
    if context.sni_callback is not None or context.keylog_filename is not None:
        return "the context has an SNI callback or a key log file"
    if getattr(context, "_msg_callback", None) is not None:
        return "the context has a message callback"
    try:
        _streams.check_context(context)
    except TypeError as exc:
        return str(exc)
    return None


class StreamServer:
    """A plain TCP listener on ``_streams``: it accepts on ``sockets`` (bound, listening, non
    blocking) and calls ``factory()`` for each connection's protocol; ``defer_accept``: seconds
    of TCP_DEFER_ACCEPT (0: none; default DEFER_ACCEPT); ``hooks``: (begin, end), called
    before and after each pass over the sockets ready (PassScheduler.pass_begin and pass_end);
    ``gather``: seconds from the start of a pass with two or more sockets ready to the next
    pass, at least (0: off; see the module's docstring); ``tls``: the listener's SSL context (TLS
    in C: ``native_tls`` must have accepted it) and ``handshake_timeout`` (seconds, 0: none). It has
    what the Server needs of an asyncio server: ``sockets``, ``close()`` and ``wait_closed()``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sockets: list[socket.socket],
        factory: Callable[[], asyncio.BaseProtocol],
        defer_accept: int | None = None,
        hooks: tuple[Callable[[], object], Callable[[], object]] | None = None,
        gather: float = 0.0,
        tls: ssl.SSLContext | None = None,
        handshake_timeout: float = 0.0,
    ) -> None:
        assert _streams is not None
        defer = DEFER_ACCEPT if defer_accept is None else defer_accept
        self.sockets = sockets
        self.accept_errors = 0
        self._closed = False
        self.poller = _streams.Poller(loop, ACCEPT_RETRY, gather, handshake_timeout)
        if hooks is not None:
            self.poller.hooks(*hooks)
        loop.add_reader(self.poller.fileno(), self.poller.poll)
        for listening in sockets:
            if defer:
                listening.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, defer)
            self.poller.listen(listening.fileno(), factory, self._accept_failed, tls)

    def close(self) -> None:
        """Stop accepting, at once. Connections stay until they close; the epoll instance is
        released after the last (or with the loop)."""
        if self._closed:
            return
        self._closed = True
        self.poller.shutdown()
        for listening in self.sockets:
            listening.close()

    async def wait_closed(self) -> None:
        """As uvloop's server: nothing to wait for once closed (connections end on their own)."""

    def _accept_failed(self, fd: int, exc: OSError) -> None:
        """Accepting on ``fd`` failed for want of descriptors or memory, or for an error of the
        listening socket itself (not the pending connection's own): the poller pauses it for
        ACCEPT_RETRY seconds (as asyncio's servers do); logged at the 1st, 2nd, 4th...
        failure."""
        self.accept_errors += 1
        listening = next(sock for sock in self.sockets if sock.fileno() == fd)
        log_accept_failure(listening, exc, self.accept_errors, ACCEPT_RETRY)

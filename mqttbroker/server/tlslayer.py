"""TLS over a plain transport: an ``ssl.SSLObject`` over two memory BIOs, driven by the socket's
reads: for MQTT over TLS listeners behind the PROXY protocol (the header is read first, on the
loop's transport), in the pure form (no C transport), and where the C transport cannot run TLS
itself (built without OpenSSL's headers, or a context it cannot take: streams.native_tls);
otherwise TLS runs in OpenSSL on the socket, in C (_streams.c). Not for WebSocket listeners.

The event loop's own SSL transport (uvloop's or asyncio's) keeps, per connection, more than
OpenSSL itself does: a 256 KiB read buffer, of which the pages read into stay resident, and its
own objects beside the loop's transport (benchmarks/README.md has the figures). Here a ``TLSLayer`` is the protocol of the
socket's transport (the broker's own, streams.py, where it is available, otherwise the loop's)
and the transport of the MQTT protocol (tcp.py) above it, which sees it as it saw the loop's
SSL transport: plain bytes, ``connection_made`` once the handshake is done, the
``peercert`` among the extra info (a verified client certificate's name, tls.py).

What the client sends is written into the incoming BIO and read out of the SSLObject at once;
what the SSLObject has to send (handshake flights, session tickets, alerts, records) is taken
from the outgoing BIO and written to the socket after each step, so TLS 1.3 session tickets
leave with the answer to the client's last handshake flight. The context's checks are all
OpenSSL's (certificate verification, ``tls_require_certificate``): a failed handshake closes the
socket (logged at debug level, as before). A handshake not done within ``timeout`` seconds
(``connect_timeout``) is aborted. Closing sends a close_notify and then the TCP FIN after what
is buffered, and reads (and drops) what the client still sends until it closes too; the MQTT
protocol bounds that wait (tcp.py)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

log = logging.getLogger("mqttbroker.tcp")

# The most plain bytes taken out of the SSLObject per read call (a TLS record holds 16 KiB).
READ_SIZE = 65536


class TLSLayer:
    """The protocol of a socket's plain transport and the transport of ``app`` (an MQTT
    protocol), with TLS between them (server side, ``context``)."""

    __slots__ = (
        "context",
        "app",
        "timeout",
        "transport",
        "sslobj",
        "incoming",
        "outgoing",
        "established",
        "closing",
        "timer",
    )

    def __init__(self, context: ssl.SSLContext, timeout: float, app: Any) -> None:
        self.context = context
        self.app = app
        self.timeout = timeout
        self.transport: Any = None
        self.sslobj: ssl.SSLObject | None = None
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.established = False  # the handshake is done and the app has the connection
        self.closing = False
        self.timer: asyncio.TimerHandle | None = None

    # -- the socket's protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.sslobj = self.context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        if self.timeout > 0:
            self.timer = asyncio.get_running_loop().call_later(self.timeout, self._too_slow)

    def data_received(self, data: bytes) -> None:
        sslobj = self.sslobj
        if sslobj is None:
            return
        self.incoming.write(data)
        if not self.established:
            try:
                sslobj.do_handshake()
            except ssl.SSLWantReadError:
                self._flush()
                return
            except (ssl.SSLError, ValueError) as exc:
                self._failed(exc)
                return
            self.established = True
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            self._flush()  # the last flight and, in TLS 1.3, the session tickets
            self.app.connection_made(self)
            if not self.incoming.pending:
                return  # nothing more (a read would only raise SSLWantReadError)
        self._read(sslobj)

    def _read(self, sslobj: ssl.SSLObject) -> None:
        app = self.app
        try:
            while True:
                chunk = sslobj.read(READ_SIZE)
                if not chunk:  # the client's close_notify
                    self._flush()
                    if not self.closing and not app.eof_received():
                        self.close()
                    return
                if not self.closing:
                    app.data_received(chunk)
                if self.sslobj is None:
                    return
                if not self.incoming.pending and not sslobj.pending():
                    break  # all read: no read that would only raise SSLWantReadError
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as exc:
            log.debug("TLS connection from %s failed: %s", self._peer(), exc)
            self._flush()  # the alert
            self.abort()
            return
        if self.outgoing.pending:  # after a key update, say
            self._flush()

    def eof_received(self) -> bool:
        if self.established and not self.closing:
            self.app.eof_received()
        return False  # the transport closes once what is buffered is written

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.sslobj = None
        self.closing = True
        if self.established:
            self.established = False
            self.app.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.established:
            self.app.pause_writing()

    def resume_writing(self) -> None:
        if self.established:
            self.app.resume_writing()

    def _flush(self) -> None:
        out = self.outgoing
        if out.pending and self.transport is not None:
            self.transport.write(out.read())

    def _failed(self, exc: BaseException) -> None:
        log.debug("TLS handshake with %s failed: %s", self._peer(), exc)
        self._flush()  # the alert that says why
        self.sslobj = None
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.transport.close()

    def _too_slow(self) -> None:
        self.timer = None
        if not self.established and self.transport is not None:
            log.debug("TLS handshake with %s: none within %g s", self._peer(), self.timeout)
            self.sslobj = None
            self.closing = True
            self.transport.abort()

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    # -- the app's transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        sslobj = self.sslobj
        if sslobj is None or self.closing:
            return
        try:
            sslobj.write(data)
        except ssl.SSLError as exc:
            log.debug("TLS connection from %s failed: %s", self._peer(), exc)
            self.abort()
            return
        self.transport.write(self.outgoing.read())

    def writelines(self, chunks: Any) -> None:
        self.write(b"".join(chunks))

    def close(self) -> None:
        """A close_notify, then the FIN after what is buffered; the socket closes when the
        client closes its side (the MQTT protocol aborts it if the client takes too long)."""
        if self.closing:
            return
        self.closing = True
        sslobj = self.sslobj
        if sslobj is not None:
            try:
                sslobj.unwrap()
            except ssl.SSLError:
                pass  # the close_notify is in the outgoing BIO; the client's is not awaited
            self._flush()
        transport = self.transport
        if not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:  # the loop's transport: the client is gone already (ENOTCONN)
            transport.abort()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def is_closing(self) -> bool:
        return self.closing or self.transport.is_closing()

    def can_write_eof(self) -> bool:
        return False  # as the loop's SSL transports: close() is the close_notify

    def write_eof(self) -> None:
        raise NotImplementedError("TLS: close() sends the close_notify")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        sslobj = self.sslobj
        if name == "ssl_object":
            return sslobj
        if name == "sslcontext":
            return self.context
        if name == "peercert":
            return sslobj.getpeercert() if sslobj is not None else default
        if name == "cipher":
            return sslobj.cipher() if sslobj is not None else default
        if name == "compression":
            return sslobj.compression() if sslobj is not None else default
        return self.transport.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return int(self.transport.get_write_buffer_size())

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()

    def is_reading(self) -> bool:
        return bool(self.transport.is_reading())

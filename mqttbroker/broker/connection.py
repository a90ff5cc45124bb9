"""One network connection's state machine: CONNECT -> CONNACK, the QoS flows, SUBSCRIBE,
keep alive, DISCONNECT, and the answer to every malformed or illegal packet.

Sans-I/O. The transport edge calls :meth:`Connection.data_received` with whatever bytes arrived
and :meth:`Connection.connection_lost` when the socket closes; the connection writes through a
:class:`Link` (``write``, ``close``). Output is not written per packet: it is appended to a
per-connection buffer and the broker flushes every buffer once per event-loop pass.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ..protocol import fastpath, grammar
from ..protocol import packets as pk
from ..protocol.errors import MalformedPacket, MQTTError, PacketTooLarge, ProtocolError
from ..protocol.packets import MQTT_5, PacketType
from ..protocol.properties import PropertyId as Prop
from ..protocol.reasons import CONNACK_CODES, DISCONNECT_CODES, ReasonCode, v311_connack_code
from .auth import CONTINUE, SUCCESS, AuthExchange
from .message import Message
from .session import filter_size
from .topics import Subscription, parse_shared, valid_topic_filter, valid_topic_name

if TYPE_CHECKING:
    from .core import Broker
    from .session import Session

log = logging.getLogger("mqttbroker.connection")

# Bytes of retained messages sent for new subscriptions per connection and loop pass.
RETAINED_PER_PASS = 1_048_576
# The per-connection cache of publish rights: at most this many topics, of this many
# characters in all.
ALLOWED_CACHE_TOPICS = 1024
ALLOWED_CACHE_CHARS = 65_536

AWAIT_CONNECT = 0
AUTHENTICATING = 3  # CONNECT received, enhanced authentication under way
CONNECTED = 1
CLOSED = 2

_PUBLISH = PacketType.PUBLISH
_PUBACK = PacketType.PUBACK
_PUBREC = PacketType.PUBREC
_PUBREL = PacketType.PUBREL
_PUBCOMP = PacketType.PUBCOMP
_PINGREQ = PacketType.PINGREQ
_CONNECT = PacketType.CONNECT
_SUBSCRIBE = PacketType.SUBSCRIBE
_UNSUBSCRIBE = PacketType.UNSUBSCRIBE
_DISCONNECT = PacketType.DISCONNECT
_AUTH = PacketType.AUTH
# Login refusals the authenticator logs itself, rate-limited (a flood of them is an attack).
_LOGGED_BY_AUTHENTICATOR = (ReasonCode.CONNECTION_RATE_EXCEEDED, ReasonCode.SERVER_BUSY)


class Link(Protocol):
    """What a connection needs from its transport."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def buffered(self) -> int:
        """Bytes written and not yet taken by the socket."""
        ...

    def abort(self) -> None:
        """Close at once, dropping what is buffered."""
        ...


class Connection:
    __slots__ = (
        "broker",
        "link",
        "peer",
        "state",
        "version",
        "session",
        "client_id",
        "keep_alive",
        "last_received",
        "opened_at",
        "send_quota",
        "max_send_size",
        "problem_info",
        "paused",
        "will",
        "connect_expiry",
        "_aliases",
        "_pending",
        "_pending_len",
        "_need",
        "_out",
        "_marks",
        "_out_base",
        "_free_upto",
        "_writes_seen",
        "assigned_id",
        "alias_maximum",
        "_out_aliases",
        "username",
        "_allowed",
        "_allowed_generation",
        "_allowed_size",
        "address",
        "_tokens",
        "_tokens_at",
        "_auth",
        "_auth_method",
        "_connect",
        "_checking",
        "_claimed",
        "_denials",
        "work",
        "work_pass",
        "input_paused",
        "publishes_sent",
        "_retained",
        "_overflowed",
    )

    def __init__(self, broker: Broker, link: Link, peer: str = "?") -> None:
        self.broker = broker
        self.link = link
        self.peer = peer
        self.state = AWAIT_CONNECT
        self.version = MQTT_5
        self.session: Session | None = None
        self.client_id = ""
        self.keep_alive = 0
        now = broker.clock()
        self.last_received = now
        self.opened_at = now
        self.send_quota = 65535  # the client's Receive Maximum, capped by max_inflight
        self.max_send_size = 268_435_460  # the client's Maximum Packet Size
        self.problem_info = True  # the client's Request Problem Information
        self.paused = False  # the transport asked us to stop writing
        self.will: pk.Will | None = None
        self.connect_expiry = 0
        self._aliases: dict[int, str] = {}
        self._pending: list[bytes] = []  # bytes of an incomplete packet
        self._pending_len = 0
        self._need = 0  # bytes the incomplete packet needs in all, when known
        self._out: list[bytes] = []
        # Output held for the store (see _hold_output): absolute output positions that wait for
        # a commit each, the number of chunks flushed so far, and how far output may go.
        self._marks: list[int] = []  # few at a time: a list is smaller than a deque
        self._out_base = 0
        self._free_upto = 0
        self._writes_seen = 0  # the store's write count when our current input began
        self.assigned_id = False  # the broker chose the client id
        self.alias_maximum = 0  # the client's Topic Alias Maximum
        self._out_aliases: OrderedDict[str, int] | None = None  # topic -> alias, LRU first
        self.username: str | None = None
        self._allowed: dict[str, bool] = {}  # topic -> may publish, for the rules' generation
        self._allowed_generation = -1
        self._allowed_size = 0  # characters of the topics in _allowed
        self.address: str | None = None  # the client's address: per-address limits, logins
        self._tokens = float(broker.options.max_publish_burst)  # publish-rate bucket
        self._tokens_at = now
        self._auth: AuthExchange | None = None  # an enhanced-authentication exchange under way
        self._auth_method: str | None = None
        self._connect: pk.Connect | None = None  # held while authenticating
        self._checking = False  # a password check runs off the event loop
        self._claimed = False  # in a cluster: the client id is this node's now
        self._denials = 0  # PUBLISHes and subscriptions the authorizer refused
        self.work = 0  # packets and deliveries caused by our input in this loop pass
        self.work_pass = -1  # the pass ``work`` counts
        self.input_paused = False  # reading paused until the broker resumes our input
        self.publishes_sent = 0  # PUBLISH packets queued for the client ($SYS: delivered)
        # Retained messages still to send for new subscriptions, sent a share per loop pass
        # while the output drains (see _send_retained).
        self._retained: deque[tuple[Subscription, Iterator[Message]]] | None = None
        self._overflowed = False  # closed for output past max_output_buffer

    def __repr__(self) -> str:
        return f"Connection({self.client_id or self.peer!r})"

    # -- input ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        """Parse the complete packets in ``data`` (plus what was left over) and act on them.

        The work one connection's input causes in one event-loop pass is bounded
        (``input_budget`` packets and deliveries; an event loop may hand over many reads per
        pass): past it, the rest waits, reading from this client pauses, and the broker resumes
        it after the pass's output is flushed. A publisher whose messages fan out widely cannot hold the event
        loop (and everyone's output) for seconds."""
        if self.state == CLOSED:
            return  # MQTT-3.1.4-6: nothing after a refused CONNECT is processed
        if self._checking:  # a password check is under way: keep the bytes for later
            self._pending.append(data)
            self._pending_len += len(data)
            self._need = 0
            return
        if self._pending:
            self._pending.append(data)
            self._pending_len += len(data)
            if self._pending_len < self._need:
                return
            data = b"".join(self._pending)
            self._pending.clear()
            self._pending_len = self._need = 0
        end = len(data)
        pos = 0
        broker = self.broker
        opts = broker.options
        # Packets up to ``small`` bytes need no look at the limits: the CONNECT limit (and the
        # one of AUTH before CONNACK) is checked only past it.
        small = min(opts.max_connect_size, opts.max_packet_size)
        store = broker.store
        writes = self._writes_seen = store.writes
        budget = opts.input_budget
        if self.work_pass != broker.passes:  # the budget is per event-loop pass
            self.work_pass = broker.passes
            self.work = 0
        try:
            while pos < end:
                if self.work >= budget:
                    break
                if self.state == AWAIT_CONNECT and data[pos] >> 4 != _CONNECT:
                    # MQTT-3.1.0-1: not MQTT, or not a CONNECT. There is nothing to acknowledge
                    # and no protocol version to answer in: close at once.
                    log.warning(
                        "connection from %s: first packet is not CONNECT (byte 0x%02X); closing",
                        self.peer,
                        data[pos],
                    )
                    self.close(publish_will=False)
                    return
                header = fastpath.read_fixed_header(data, pos, end)
                if header is None:
                    break
                length, body = header
                if body - pos + length > small:
                    self._check_size(body - pos + length, data[body : min(end, body + 8)])
                stop = body + length
                if stop > end:
                    self._need = stop - pos
                    break
                self._dispatch(data[pos], data, body, stop)
                self.work += 1
                pos = stop
                if self.state == CLOSED:
                    return
                if self._checking:
                    break
            if pos:  # keep alive counts whole packets, not a trickle of bytes (MQTT-3.1.2-22)
                self.last_received = self.broker.clock()
            if store.writes != writes:
                self._hold_output()
        except MQTTError as exc:
            self._fail(exc)
            return
        except Exception:  # a bug of ours: log it, close this client, keep serving the others
            log.exception("client %s: internal error while handling its packet", self._name())
            self._fail(MQTTError("internal error", ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR))
            return
        if pos < end or self._checking:
            rest = data[pos:]
            if rest:
                self._pending.append(rest)
                self._pending_len = len(rest)
            if self._checking:  # the rest waits for the password check's answer
                self._need = 0
                self._pause_input()
                return
            if self.work >= budget:
                self._need = 0  # parse the rest when resumed
                self._pause_input()
                if not self.paused and not self._retained:  # else deferred already, or
                    self.broker.defer(self)  # resume_writing goes on
                return
        if self.input_paused and not self.paused and not self._retained:
            self.input_paused = False
            self.link.resume_reading()

    def _pause_input(self) -> None:
        if not self.input_paused:
            self.input_paused = True
            self.link.pause_reading()

    def resume_input(self) -> None:
        """Go on with what waited for the next loop pass, when the budget ran out (called by
        the broker): retained messages for new subscriptions first, then input left over."""
        if self.state == CLOSED or self.paused:
            return  # resume_writing goes on once the output drained
        if self._retained:
            self._send_retained()
            if self._retained:
                return  # deferred again, or waiting for the output to drain
        if self._pending and self._pending_len >= self._need:  # a whole packet, or unknown
            self.data_received(b"")
        elif self.input_paused:
            self.input_paused = False
            self.link.resume_reading()

    def _check_size(self, size: int, head: bytes) -> None:
        """A packet of ``size`` bytes (``head``: its first bytes after the fixed header) is
        larger than the CONNECT limit: refused (0x95) before authentication, from its fixed
        header, so that nothing big is held or decoded for a client nobody knows yet; after
        it, refused past max_packet_size."""
        opts = self.broker.options
        if self.state != CONNECTED and size > opts.max_connect_size:
            if self.state == AWAIT_CONNECT:
                self._learn_version(head)  # to answer in the client's version
            raise PacketTooLarge(
                f"packet of {size} bytes before authentication exceeds max_connect_size "
                f"({opts.max_connect_size})"
            )
        if size > opts.max_packet_size:
            raise PacketTooLarge(
                f"packet of {size} bytes exceeds the maximum of {opts.max_packet_size}"
            )

    def _dispatch(self, first: int, data: bytes, body: int, stop: int) -> None:
        ptype = first >> 4
        if self.state != CONNECTED:
            if self.state == AWAIT_CONNECT:  # the first byte was checked: this is a CONNECT
                self._on_connect(self._decode_connect(first, data[body:stop]))
                return
            # AUTHENTICATING: only AUTH or DISCONNECT until CONNACK (MQTT-3.1.2-30)
            if ptype not in (_AUTH, _DISCONNECT):
                raise ProtocolError(f"packet type {ptype} during authentication")
            packet = grammar.decode(ptype, first & 0x0F, data[body:stop], self.version)
            if isinstance(packet, pk.Auth):
                self._on_auth(packet)
            else:
                log.info("client %s from %s gave up authenticating", self.client_id, self.peer)
                self.close(publish_will=False)
            return
        if ptype == _PUBLISH:
            self._publish_fast(first, data, body, stop)
        elif _PUBACK <= ptype <= _PUBCOMP:
            ack = fastpath.decode_ack(ptype, first & 0x0F, data, body, stop, self.version)
            self._on_ack(ptype, ack)
        elif ptype == _PINGREQ:
            if first != 0xC0 or stop != body:
                raise MalformedPacket("PINGREQ with flags or a body")
            self._send(fastpath.PINGRESP)  # MQTT-3.12.4-1
        elif ptype == _CONNECT:
            raise ProtocolError("second CONNECT on one connection")  # MQTT-3.1.0-2
        elif ptype == 0 or ptype in (
            PacketType.CONNACK,
            PacketType.SUBACK,
            PacketType.UNSUBACK,
            PacketType.PINGRESP,
        ):
            raise ProtocolError(f"a client may not send packet type {ptype}")
        elif ptype == _SUBSCRIBE:
            # More filters than a client may hold could never be granted: refused whole.
            self._on_subscribe(
                fastpath.decode_subscribe(
                    first & 0x0F,
                    data,
                    body,
                    stop,
                    self.version,
                    self.broker.options.max_subscriptions_per_client,
                )
            )
        else:
            limit = self.broker.options.max_subscriptions_per_client
            if ptype == _UNSUBSCRIBE and limit:  # as many as a client may hold, at most
                fastpath.check_unsubscribe_count(data, body, stop, self.version, limit)
            packet = grammar.decode(ptype, first & 0x0F, data[body:stop], self.version)
            if isinstance(packet, pk.Unsubscribe):
                self._on_unsubscribe(packet)
            elif isinstance(packet, pk.Disconnect):
                self._on_disconnect(packet)
            elif isinstance(packet, pk.Auth):
                self._on_auth(packet)

    def _decode_connect(self, first: int, body: bytes) -> pk.Connect:
        # Learn the protocol level first so a failure is answered in the client's own version.
        self._learn_version(body)
        return fastpath.decode_connect(first & 0x0F, body, 0, len(body))

    def _learn_version(self, body: bytes) -> None:
        """The protocol level from the start of a CONNECT body, when it is there."""
        if body[:6] == b"\x00\x04MQTT" and len(body) > 6:
            self.version = MQTT_5 if body[6] >= MQTT_5 else body[6]
        elif body[:8] == b"\x00\x06MQIsdp":
            self.version = pk.MQTT_3_1

    # -- CONNECT ----------------------------------------------------------------------------

    def _on_connect(self, packet: pk.Connect) -> None:
        """Check a CONNECT; accept it at once, or after an enhanced-authentication exchange."""
        broker = self.broker
        broker.connects += 1
        opts = broker.options
        self.version = version = packet.protocol_level
        v5 = version == MQTT_5
        props = packet.properties
        self.max_send_size = props.get(Prop.MAXIMUM_PACKET_SIZE, 268_435_460)
        self.problem_info = props.get(Prop.REQUEST_PROBLEM_INFORMATION, 1) == 1
        if not packet.client_id:
            if not v5 and not packet.clean_start:
                raise MQTTError(
                    "empty client id with a persistent session",
                    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                )  # 3.1.1 MQTT-3.1.3-8
            self.assigned_id = True
            packet.client_id = broker.new_client_id()  # MQTT-3.1.3-6, -7
        self.client_id = packet.client_id
        will = packet.will
        if will is not None:
            if not valid_topic_name(will.topic):
                raise MQTTError("invalid will topic", ReasonCode.TOPIC_NAME_INVALID)
            if will.qos > opts.maximum_qos:
                raise MQTTError(
                    "will QoS above the maximum", ReasonCode.QOS_NOT_SUPPORTED
                )  # MQTT-3.2.2-12
            if will.retain and not opts.retain_available:
                raise MQTTError(
                    "retained will not supported", ReasonCode.RETAIN_NOT_SUPPORTED
                )  # MQTT-3.2.2-13
            if will.properties.get(Prop.PAYLOAD_FORMAT_INDICATOR) == 1:
                _check_utf8_payload(will.payload)
        if opts.server_reference:
            moved = ReasonCode.SERVER_MOVED if opts.server_moved else ReasonCode.USE_ANOTHER_SERVER
            raise MQTTError("redirected to " + opts.server_reference, moved)
        method = props.get(Prop.AUTHENTICATION_METHOD)
        if Prop.AUTHENTICATION_DATA in props and method is None:
            raise ProtocolError("Authentication Data without an Authentication Method")
        certificate_user = getattr(self.link, "certificate_user", None)
        if certificate_user is not None:
            # A client certificate the listener verified is the credential; its name is the
            # user name (mutual TLS with tls_certificate_username).
            packet.username = certificate_user
        self.username = packet.username  # as claimed, for the log until CONNACK says more
        if certificate_user is None and method is None:
            listener = getattr(self.link, "listener", None)
            anonymous = getattr(listener, "allow_anonymous", None)
            if packet.username is None and anonymous is not None:
                if not anonymous:  # this listener's own rule
                    raise MQTTError(
                        "anonymous access refused on this listener", ReasonCode.NOT_AUTHORIZED
                    )
            elif broker.offload is not None:
                # Hashing a password takes milliseconds: off the event loop, while this
                # connection waits (state AUTHENTICATING, input held) for the answer.
                self.state = AUTHENTICATING
                self._checking = True
                self._connect = packet
                authenticator = broker.authenticator
                address = self.address
                broker.offload(
                    lambda: authenticator.check_password(
                        packet.client_id, packet.username, packet.password, anonymous, address
                    ),
                    self._password_checked,
                )
                return
            else:
                code = broker.authenticator.check_password(
                    packet.client_id, packet.username, packet.password, anonymous, self.address
                )
                if code:
                    raise MQTTError("authentication failed", code)
        if method is None:
            self._accept(packet, None)
            return
        exchange = broker.authenticator.exchange(
            method, packet.client_id, packet.username, self.address
        )
        if exchange is None:
            raise MQTTError(
                f"authentication method {method!r} not supported",
                ReasonCode.BAD_AUTHENTICATION_METHOD,
            )  # MQTT-4.12.0-1
        self._auth = exchange
        self._auth_method = method
        self._connect = packet
        self.state = AUTHENTICATING
        self._auth_step(props.get(Prop.AUTHENTICATION_DATA))

    def _password_checked(self, code: int) -> None:
        """The answer of a password check run off the event loop (see _on_connect)."""
        self._checking = False
        packet = self._connect
        self._connect = None
        if self.state == CLOSED or packet is None:
            return
        self._resume_connect(packet, None, code)

    def _claim_done(self, packet: pk.Connect, auth_props: dict[int, Any] | None) -> None:
        """In a cluster: this node owns the client id now, the client's session is here if
        another node had it (see _accept)."""
        self._checking = False
        if self.state != CLOSED:
            self._resume_connect(packet, auth_props, 0)

    def _resume_connect(
        self, packet: pk.Connect, auth_props: dict[int, Any] | None, code: int
    ) -> None:
        """Accept a CONNECT whose answer waited (``code``: the password check's), then read
        what the client sent meanwhile."""
        store = self.broker.store
        writes = store.writes
        try:
            if code:
                raise MQTTError("authentication failed", code)
            self._accept(packet, auth_props)
        except MQTTError as exc:
            self._fail(exc)
            return
        if store.writes != writes:
            self._hold_output()
        if self.input_paused and not self.paused:
            self.input_paused = False
            self.link.resume_reading()
        if self._pending:
            self.data_received(b"")

    def _auth_step(self, data: bytes | None) -> None:
        """Run one step of the enhanced-authentication exchange (section 4.12)."""
        assert self._auth is not None
        outcome = self._auth.step(data)
        auth_props: dict[int, Any] = {Prop.AUTHENTICATION_METHOD: self._auth_method}
        if outcome.data is not None:
            auth_props[Prop.AUTHENTICATION_DATA] = outcome.data
        if outcome.status == CONTINUE:  # MQTT-4.12.0-2, -5
            self._send(grammar.encode(pk.Auth(ReasonCode.CONTINUE_AUTHENTICATION, auth_props)))
            return
        self._auth = None
        if outcome.status != SUCCESS:
            raise MQTTError("authentication failed", outcome.reason_code)  # MQTT-4.12.0-4
        if self.state == AUTHENTICATING:
            packet = self._connect
            assert packet is not None
            self._connect = None
            if outcome.username is not None:
                packet.username = outcome.username
            self._accept(packet, auth_props)
        else:  # re-authentication succeeded
            if outcome.username is not None and outcome.username != self.username:
                raise MQTTError("re-authenticated as another user", ReasonCode.NOT_AUTHORIZED)
            self._send(grammar.encode(pk.Auth(ReasonCode.SUCCESS, auth_props)))
            log.info("client %s re-authenticated", self.client_id)

    def _on_auth(self, packet: pk.Auth) -> None:
        method = packet.properties.get(Prop.AUTHENTICATION_METHOD)
        if self._auth_method is None:
            raise ProtocolError("AUTH without an Authentication Method in CONNECT")  # 4.12.0-7
        if method != self._auth_method:
            raise ProtocolError("AUTH with another Authentication Method")  # MQTT-4.12.1-1
        code = packet.reason_code
        if self.state == CONNECTED and code == ReasonCode.RE_AUTHENTICATE and self._auth is None:
            exchange = self.broker.authenticator.exchange(
                method, self.client_id, self.username, self.address
            )
            if exchange is None:
                raise MQTTError("re-authentication refused", ReasonCode.NOT_AUTHORIZED)
            self._auth = exchange
        elif code != ReasonCode.CONTINUE_AUTHENTICATION or self._auth is None:
            raise ProtocolError(f"unexpected AUTH reason code 0x{code:02X}")
        self._auth_step(packet.properties.get(Prop.AUTHENTICATION_DATA))

    def _accept(self, packet: pk.Connect, auth_props: dict[int, Any] | None) -> None:
        """The client is who it says: take over or create its session and send CONNACK."""
        broker = self.broker
        backplane = broker.router.backplane
        if backplane is not None and not self._claimed:
            # A cluster node first takes the client id over: its session may be on another
            # node, which hands it over. The CONNECT waits (input held) until then.
            self._claimed = self._checking = True
            self.state = AUTHENTICATING
            backplane.claim(
                packet.client_id,
                packet.clean_start,
                lambda: self._claim_done(packet, auth_props),
            )
            return
        opts = broker.options
        version = self.version
        v5 = version == MQTT_5
        props = packet.properties
        client_id = packet.client_id
        self.send_quota = min(props.get(Prop.RECEIVE_MAXIMUM, 65535), opts.max_inflight)
        self.alias_maximum = props.get(Prop.TOPIC_ALIAS_MAXIMUM, 0) if v5 else 0
        keep_alive = packet.keep_alive
        server_keep_alive = None
        if opts.max_keepalive and (keep_alive == 0 or keep_alive > opts.max_keepalive):
            keep_alive = server_keep_alive = opts.max_keepalive
        self.keep_alive = keep_alive
        if v5:
            requested = props.get(Prop.SESSION_EXPIRY_INTERVAL, 0)
        else:
            requested = 0 if packet.clean_start else 0xFFFFFFFF
        expiry = min(requested, opts.max_session_expiry)
        self.connect_expiry = expiry
        self.will = packet.will
        session, present = broker.attach(
            self, client_id, packet.clean_start, expiry, packet.username
        )
        self.username = packet.username
        self.session = session
        self.state = CONNECTED
        if v5:
            extra: dict[int, Any] = {}
            if self.assigned_id:
                extra[Prop.ASSIGNED_CLIENT_IDENTIFIER] = client_id  # MQTT-3.2.2-16
            if server_keep_alive is not None:
                extra[Prop.SERVER_KEEP_ALIVE] = server_keep_alive
            if expiry != requested:
                extra[Prop.SESSION_EXPIRY_INTERVAL] = expiry
            if opts.response_information and props.get(Prop.REQUEST_RESPONSE_INFORMATION):
                extra[Prop.RESPONSE_INFORMATION] = opts.response_information.replace(
                    "%c", client_id
                )  # absent unless requested: MQTT-3.1.2-28
            if auth_props:
                extra.update(auth_props)  # MQTT-4.12.0-5
            if extra:
                ack_props = {**broker.connack_properties, **extra}
                self._send(fastpath.encode_connack(pk.Connack(present, 0, ack_props), MQTT_5))
            else:  # the usual answer, encoded once by the broker
                self._send(broker.connack_v5[present])
        else:
            self._send(fastpath.encode_connack(pk.Connack(present, 0), version))
        kind = getattr(getattr(self.link, "listener", None), "kind", "MQTT over a test link")
        log.info(
            "client %s connected from %s (MQTT %s over %s, user %r, keep alive %ds, session %s)",
            client_id,
            self.peer,
            "5.0" if v5 else "3.1.1" if version == 4 else "3.1",
            kind.removeprefix("MQTT over "),  # TCP, TLS, WebSocket, WebSocket+TLS
            self.username,
            keep_alive,
            "resumed" if present else "new",
        )
        session.resend(broker.clock())

    # -- PUBLISH from the client ------------------------------------------------------------

    def _publish_fast(self, first: int, data: bytes, body: int, stop: int) -> None:
        """PUBLISH without properties (the common case): sliced here, no packet object. One
        with properties goes through the general decoder and :meth:`_on_publish`."""
        if stop - body < 2:
            raise MalformedPacket("truncated PUBLISH")
        pos = topic_end = body + 2 + ((data[body] << 8) | data[body + 1])
        if topic_end > stop:
            raise MalformedPacket("topic runs past the end of the PUBLISH")
        qos = (first >> 1) & 3
        packet_id = 0
        if qos:
            if qos == 3:
                raise MalformedPacket("PUBLISH with QoS 3")  # MQTT-3.3.1-4
            if pos + 2 > stop:
                raise MalformedPacket("truncated PUBLISH")
            packet_id = (data[pos] << 8) | data[pos + 1]
            if not packet_id:
                raise ProtocolError("PUBLISH with packet identifier 0")
            pos += 2
        elif first & 8:
            raise MalformedPacket("QoS 0 PUBLISH with DUP set")  # MQTT-3.3.1-2
        if self.version == MQTT_5:
            if pos >= stop:
                raise MalformedPacket("PUBLISH without a property length")
            if data[pos]:
                self._on_publish(
                    fastpath.decode_publish(first & 0x0F, data, body, stop, self.version)
                )
                return
            pos += 1
        raw = None
        if not qos:  # what a subscriber of the same version gets is this very packet
            raw = data[body - fastpath.fixed_header_size(stop - body) : stop]
        self._route(
            data[body:topic_end], None, data[pos:stop], qos, bool(first & 1), packet_id, raw
        )

    def _on_publish(self, packet: pk.Publish) -> None:
        """A PUBLISH with properties: topic aliases, property checks, then routing."""
        opts = self.broker.options
        qos = packet.qos
        topic = packet.topic
        props = packet.properties
        alias = props.get(Prop.TOPIC_ALIAS)
        if alias is not None:
            if not 0 < alias <= opts.topic_alias_maximum:
                raise MQTTError(
                    f"topic alias {alias} out of range", ReasonCode.TOPIC_ALIAS_INVALID
                )  # MQTT-3.3.2-9, -12
            if topic:
                self._aliases[alias] = topic
            else:
                known = self._aliases.get(alias)
                if known is None:
                    raise ProtocolError(f"topic alias {alias} has no mapping")
                topic = known
        if Prop.SUBSCRIPTION_IDENTIFIER in props:
            raise ProtocolError("PUBLISH from a client with a Subscription Identifier")  # 3.3.4-6
        if Prop.RESPONSE_TOPIC in props and not valid_topic_name(props[Prop.RESPONSE_TOPIC]):
            raise ProtocolError("Response Topic is not a valid topic name")  # MQTT-3.3.2-14
        if props.get(Prop.PAYLOAD_FORMAT_INDICATOR) == 1:
            try:
                _check_utf8_payload(packet.payload)
            except MQTTError:
                if not qos:
                    raise
                self._refuse_publish(
                    qos,
                    packet.packet_id or 0,
                    ReasonCode.PAYLOAD_FORMAT_INVALID,
                    "payload is not UTF-8 as its Payload Format Indicator says",
                )
                return
        self._route(
            fastpath.encode_topic(topic),
            props,
            packet.payload,
            qos,
            packet.retain,
            packet.packet_id or 0,
        )

    def _route(
        self,
        raw_topic: bytes,
        props: dict[int, Any] | None,
        payload: bytes,
        qos: int,
        retain: bool,
        packet_id: int,
        raw: bytes | None = None,
    ) -> None:
        """Route one received message and acknowledge it. ``raw_topic`` is the topic as on the
        wire, with its 2-byte length; ``raw``, when given, the whole QoS 0 packet as received
        (no properties), which subscribers of this client's version get unchanged."""
        broker = self.broker
        opts = broker.options
        if qos > opts.maximum_qos:
            raise MQTTError(
                f"PUBLISH at QoS {qos} above the maximum", ReasonCode.QOS_NOT_SUPPORTED
            )  # MQTT-3.2.2-11
        if retain and not opts.retain_available:
            raise MQTTError(
                "retained PUBLISH not supported", ReasonCode.RETAIN_NOT_SUPPORTED
            )  # MQTT-3.2.2-14
        router = broker.router
        authorizer = broker.authorizer
        found = router.lookup_raw(raw_topic, None if authorizer is None else self)
        if found is None:
            if raw_topic == b"\x00\x00":
                raise ProtocolError("PUBLISH with an empty topic and no topic alias")
            raise MQTTError("invalid topic name", ReasonCode.TOPIC_NAME_INVALID)  # 3.3.2-2
        topic, match = found
        if authorizer is not None and not self.may_publish(topic):
            broker.denied += 1
            self._log_denied("publish to", topic)
            if qos:  # QoS 0 is dropped silently (and counted)
                self._refuse_publish(
                    qos,
                    packet_id,
                    ReasonCode.NOT_AUTHORIZED,
                    "not authorized to publish to this topic",
                )
            return
        session = self.session
        assert session is not None
        now = broker.clock()
        broker.received += 1
        if opts.max_publish_rate:
            tokens = min(
                float(opts.max_publish_burst),
                self._tokens + (now - self._tokens_at) * opts.max_publish_rate,
            )
            if tokens < 1.0:
                raise MQTTError(
                    f"publishing faster than {opts.max_publish_rate:g} messages/s",
                    ReasonCode.MESSAGE_RATE_TOO_HIGH,
                )
            self._tokens = tokens - 1.0
            self._tokens_at = now
        if (
            retain
            and payload
            and len(router.retained) >= opts.max_retained
            and (router.retained.get(topic) is None)
        ):
            log.warning(
                "client %s: retained message on %r refused: max_retained (%d) reached",
                self.client_id,
                topic,
                opts.max_retained,
            )
            broker.denied += 1
            if qos:
                self._refuse_publish(
                    qos, packet_id, ReasonCode.QUOTA_EXCEEDED, "too many retained messages"
                )
            return
        if qos == 2:
            waiting = session.awaiting_release
            if packet_id not in waiting:
                if len(waiting) >= opts.receive_maximum:
                    raise MQTTError(
                        "more unacknowledged QoS 2 messages than Receive Maximum",
                        ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                    )  # MQTT-3.3.4-7
                message = Message.received(topic, raw_topic, payload, qos, retain, props, now)
                self.work += router.publish(message, match, session, now)
                waiting.add(packet_id)
                if session.expiry_interval:
                    broker.store.save_release(session, packet_id)
            # else a resend before PUBREL: acknowledged again, not delivered twice (4.3.3-10)
            self._send(fastpath.encode_ack(_PUBREC, packet_id, 0, None, self.version))
            return
        message = Message.received(topic, raw_topic, payload, qos, retain, props, now)
        if raw is not None:
            message.forward(self.version, raw)
        count = router.publish(message, match, session, now)
        self.work += count
        if qos:
            code = ReasonCode.NO_MATCHING_SUBSCRIBERS if not count and self.version == MQTT_5 else 0
            self._send(fastpath.encode_ack(_PUBACK, packet_id, code, None, self.version))

    # -- acknowledgements from the client ---------------------------------------------------

    def _refuse_publish(self, qos: int, packet_id: int, code: int, reason: str) -> None:
        """PUBACK/PUBREC with a failure code: the message is acknowledged, not delivered
        (MQTT-4.4.0-2). A Reason String says why, unless the client asked for none
        (MQTT-3.1.2-29) or it would not fit the client's Maximum Packet Size (MQTT-3.4.2-2)."""
        self._send_explained(_PUBACK if qos == 1 else _PUBREC, packet_id, code, reason)

    def _send_explained(self, ptype: int, packet_id: int, code: int, reason: str) -> None:
        """An acknowledgement (PUBACK, PUBREC, PUBREL, PUBCOMP) with a Reason String, unless the
        client asked for none (MQTT-3.1.2-29) or it would exceed the client's Maximum Packet
        Size (MQTT-3.4.2-2, -3.5.2-2, -3.6.2-2, -3.7.2-2)."""
        props: dict[int, Any] | None = {Prop.REASON_STRING: reason} if self.problem_info else None
        data = fastpath.encode_ack(ptype, packet_id, code, props, self.version)
        if len(data) > self.max_send_size:
            data = fastpath.encode_ack(ptype, packet_id, code, None, self.version)
        self._send(data)

    def _log_denied(self, action: str, topic: str) -> None:
        """Log a refusal of the authorizer: this connection's 1st, 2nd, 4th, 8th..., so a
        client retrying in a loop cannot flood the log."""
        self._denials = count = self._denials + 1
        if count & (count - 1) == 0:
            log.info(
                "client %s from %s (user %r): not authorized to %s %r (%d refused so far)",
                self.client_id,
                self.peer,
                self.username,
                action,
                topic,
                count,
            )

    def may_publish(self, topic: str) -> bool:
        """Whether the authorizer lets this client publish to ``topic``; the answers are
        cached per connection, up to ALLOWED_CACHE_TOPICS topics of ALLOWED_CACHE_CHARS
        characters in all."""
        authorizer = self.broker.authorizer
        assert authorizer is not None
        if self._allowed_generation != authorizer.generation:
            self._allowed.clear()
            self._allowed_size = 0
            self._allowed_generation = authorizer.generation
        allowed = self._allowed.get(topic)
        if allowed is None:
            allowed = authorizer.can_publish(self.client_id, self.username, topic)
            size = self._allowed_size + len(topic)
            if len(self._allowed) < ALLOWED_CACHE_TOPICS and size <= ALLOWED_CACHE_CHARS:
                self._allowed[topic] = allowed
                self._allowed_size = size
        return allowed

    def _on_ack(self, ptype: int, ack: pk.Ack) -> None:
        session = self.session
        assert session is not None
        packet_id = ack.packet_id
        now = self.broker.clock()
        if ptype == _PUBACK:
            session.acknowledge(packet_id, now)
        elif ptype == _PUBREC:
            delivery = session.inflight.get(packet_id)
            if delivery is None or delivery.qos != 2:
                if self.version == MQTT_5 and ack.reason_code < 0x80:
                    self._send_explained(
                        _PUBREL,
                        packet_id,
                        ReasonCode.PACKET_IDENTIFIER_NOT_FOUND,
                        f"PUBREC for packet identifier {packet_id}: no QoS 2 message in flight",
                    )
            elif session.received(packet_id, ack.reason_code, now):
                self.send_pubrel(packet_id)  # MQTT-4.3.3-4
        elif ptype == _PUBREL:
            known = packet_id in session.awaiting_release
            if known:
                session.awaiting_release.discard(packet_id)
                if session.expiry_interval:
                    self.broker.store.delete_release(session, packet_id)
            if known or self.version != MQTT_5:
                self._send(fastpath.encode_ack(_PUBCOMP, packet_id, 0, None, self.version))
            else:
                self._send_explained(
                    _PUBCOMP,
                    packet_id,
                    ReasonCode.PACKET_IDENTIFIER_NOT_FOUND,
                    f"PUBREL for packet identifier {packet_id}: no QoS 2 message awaits it",
                )
        else:
            session.completed(packet_id, now)

    # -- SUBSCRIBE / UNSUBSCRIBE ------------------------------------------------------------

    def _on_subscribe(self, packet: pk.Subscribe) -> None:
        broker = self.broker
        opts = broker.options
        session = self.session
        assert session is not None
        v5 = self.version == MQTT_5
        identifier = packet.properties.get(Prop.SUBSCRIPTION_IDENTIFIER)
        if identifier is not None and not opts.subscription_identifiers:
            raise MQTTError(
                "subscription identifiers are not supported",
                ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
            )
        codes: list[int] = []
        new_subs: list[tuple[Subscription, bool]] = []
        over = 0  # filters refused for max_subscriptions_per_client
        denied: str | None = None  # the first filter the authorizer refused
        for request in packet.subscriptions:
            topic_filter = request.topic_filter
            try:
                shared = parse_shared(topic_filter)
            except ValueError:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if v5 else 0x80)
                continue
            inner = shared[1] if shared else topic_filter
            if (shared is None and not valid_topic_filter(topic_filter)) or (
                not broker.router.within_limits(inner)
            ):
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if v5 else 0x80)
                continue
            if shared is not None:
                if request.no_local:
                    raise ProtocolError("No Local on a shared subscription")  # MQTT-3.8.3-4
                if not opts.shared_subscriptions:
                    codes.append(ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED if v5 else 0x80)
                    continue
            authorizer = broker.authorizer
            if authorizer is not None and not authorizer.can_subscribe(
                self.client_id, self.username, inner
            ):
                if denied is None:
                    denied = topic_filter
                codes.append(ReasonCode.NOT_AUTHORIZED if v5 else 0x80)
                continue
            if not opts.wildcard_subscriptions and ("+" in inner or "#" in inner):
                codes.append(ReasonCode.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED if v5 else 0x80)
                continue
            if (
                opts.max_subscriptions_per_client
                and len(session.subscriptions) >= opts.max_subscriptions_per_client
                and topic_filter not in session.subscriptions
            ):
                over += 1
                codes.append(ReasonCode.QUOTA_EXCEEDED if v5 else 0x80)
                continue
            size = 0 if topic_filter in session.subscriptions else filter_size(topic_filter)
            if (
                opts.max_subscription_bytes
                and session.subscription_bytes + size > opts.max_subscription_bytes
            ):
                log.info(
                    "client %s: max_subscription_bytes (%d) reached",
                    self.client_id,
                    opts.max_subscription_bytes,
                )
                codes.append(ReasonCode.QUOTA_EXCEEDED if v5 else 0x80)
                continue
            qos = min(request.qos, opts.maximum_qos)
            sub = Subscription(
                session,
                topic_filter,
                qos,
                no_local=request.no_local,
                retain_as_published=request.retain_as_published,
                retain_handling=request.retain_handling,
                identifier=identifier,
            )
            sub.read_check = broker.read_check(session, inner)
            existed = broker.router.subscribe(sub)
            session.subscriptions[topic_filter] = sub
            session.subscription_bytes += size
            if session.expiry_interval:
                broker.store.save_subscription(session, sub)
            codes.append(qos)
            new_subs.append((sub, existed))
        if denied is not None:  # one line per packet (its first refused filter), however many
            self._log_denied("subscribe to", denied)
        if over:
            log.info(
                "client %s: max_subscriptions_per_client (%d) reached: %d filter(s) refused",
                self.client_id,
                opts.max_subscriptions_per_client,
                over,
            )
        suback = pk.Suback(packet.packet_id, codes)
        self._send(self._encode_explained(suback, [r.topic_filter for r in packet.subscriptions]))
        now = broker.clock()
        for sub, existed in new_subs:
            # Retained messages after the SUBACK, per Retain Handling; never on a shared
            # subscription (MQTT-3.3.1-9, -10, -11; 4.8.2).
            if sub.share_group is None and (
                sub.retain_handling == 0 or (sub.retain_handling == 1 and not existed)
            ):
                if self._retained is None:
                    self._retained = deque()
                self._retained.append((sub, broker.router.retained.match(sub.filter, now)))
        if self._retained:
            self._send_retained()

    def _send_retained(self) -> None:
        """Send retained messages for new subscriptions, within this loop pass's input budget
        and up to ``RETAINED_PER_PASS`` bytes; the rest in later passes, while the client reads
        (none while its output is paused). Input waits meanwhile: SUBSCRIBEs from a client
        that does not read cannot pile up copies of the retained set."""
        backlog = self._retained
        session = self.session
        assert backlog is not None and session is not None
        broker = self.broker
        if self.work_pass != broker.passes:
            self.work_pass = broker.passes
            self.work = 0
        budget = broker.options.input_budget
        authorizer = broker.authorizer
        now = broker.clock()
        sent = 0
        while backlog and not self.paused and self.work < budget and sent < RETAINED_PER_PASS:
            sub, messages = backlog[0]
            message = next(messages, None)
            if message is None or session.subscriptions.get(sub.topic_filter) is not sub:
                backlog.popleft()  # done, or unsubscribed meanwhile (MQTT-3.10.4-2)
                continue
            self.work += 1
            if authorizer is not None and not authorizer.can_read(
                session.client_id, session.username, message.topic
            ):
                continue
            ident = sub.identifier
            session.deliver(
                message, min(sub.qos, message.qos), True, (ident,) if ident else (), now
            )
            sent += message.size
        if backlog:  # more in the next pass (or once the output drained); input waits
            self.work = budget
            self._pause_input()
            if not self.paused:
                broker.defer(self)

    def _encode_explained(self, ack: pk.Suback | pk.Unsuback, filters: list[str]) -> bytes:
        """A SUBACK or UNSUBACK; in MQTT 5, when it refuses a filter (or UNSUBACK finds none), a
        Reason String naming each such filter and why, unless the client asked for none
        (MQTT-3.1.2-29) or it would exceed the client's Maximum Packet Size (MQTT-3.9.2-1,
        MQTT-3.11.2-1)."""
        codes = ack.reason_codes
        if self.version == MQTT_5 and self.problem_info and any(c in _REFUSAL for c in codes):
            refused = [
                f"{topic_filter!r}: {_REFUSAL[code]}"
                for topic_filter, code in zip(filters, codes, strict=True)
                if code in _REFUSAL
            ]
            ack.properties[Prop.REASON_STRING] = "; ".join(refused)[:_REASON_MAX]
            data = fastpath.encode_suback(ack, MQTT_5)
            if len(data) <= self.max_send_size:
                return data
            ack.properties.clear()
        return fastpath.encode_suback(ack, self.version)

    def _on_unsubscribe(self, packet: pk.Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes: list[int] = []
        for topic_filter in packet.topic_filters:
            sub = session.subscriptions.pop(topic_filter, None)  # literal compare, MQTT-3.10.4-1
            if sub is not None:
                self.broker.router.unsubscribe(sub)
                session.subscription_bytes -= filter_size(topic_filter)
                if session.expiry_interval:
                    self.broker.store.delete_subscription(session, topic_filter)
                codes.append(ReasonCode.SUCCESS)
            else:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
        if self.version != MQTT_5:
            codes = []
        unsuback = pk.Unsuback(packet.packet_id, codes)
        self._send(self._encode_explained(unsuback, packet.topic_filters))

    # -- DISCONNECT -------------------------------------------------------------------------

    def _on_disconnect(self, packet: pk.Disconnect) -> None:
        session = self.session
        assert session is not None
        expiry = packet.properties.get(Prop.SESSION_EXPIRY_INTERVAL)
        if expiry is not None:
            if self.connect_expiry == 0 and expiry != 0:
                raise ProtocolError("Session Expiry Interval set on DISCONNECT after CONNECT had 0")
            session.expiry_interval = min(expiry, self.broker.options.max_session_expiry)
        # Only a normal disconnection (0x00) discards the will (MQTT-3.1.2-8, -10, 3.14.4-3);
        # 0x04 asks for it, and so does any error code.
        keep_will = packet.reason_code != ReasonCode.NORMAL_DISCONNECTION
        if not keep_will and self.will is not None:
            self.will = None  # MQTT-3.14.4-3
            if session.expiry_interval:
                self.broker.store.delete_will(session)
        log.info("client %s disconnected (reason 0x%02X)", self.client_id, packet.reason_code)
        self.close()

    # -- output -----------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        if self.state == CLOSED:
            return
        out = self._out
        if not out:
            self.broker.mark_dirty(self)
        out.append(data)

    def _hold_output(self) -> None:
        """Our input changed the store: what we have buffered so far (acknowledgements among
        it) waits until the store's current batch is committed, so that "acknowledged" means
        "on disk". Later output waits behind it, in order."""
        self._marks.append(self._out_base + len(self._out))
        self.broker.store.after_commit(self._release_output)

    def _release_output(self) -> None:
        if not self._marks:  # the connection was closed and flushed meanwhile
            return
        # Batches commit in order, so the oldest mark is the one committed now.
        self._free_upto = self._marks.pop(0)
        if self._out:
            self.broker.mark_dirty(self)

    def flush(self) -> None:
        """Write what is buffered (up to what still waits for a commit) in one call."""
        out = self._out
        if not out:
            return
        count = len(out)
        if self._marks:
            count = min(count, self._free_upto - self._out_base)
            if count <= 0:
                return
        data = out[0] if count == 1 else b"".join(out[:count])
        if count == len(out):
            out.clear()
        else:
            del out[:count]
        self._out_base += count
        self.link.write(data)
        if self.paused:
            bound = self.broker.options.max_output_buffer
            if bound and self.link.buffered() > bound:
                self._overflow()

    def _overflow(self) -> None:
        """More output than max_output_buffer waits for a client that does not read: closed
        (DISCONNECT 0x97 first in MQTT 5, for what it is worth behind all that), and what it
        did not take dropped, so its memory is freed at once."""
        if self._overflowed:
            return
        self._overflowed = True
        log.warning(
            "client %s: more than max_output_buffer (%d bytes) waits for it to read; closing",
            self._name(),
            self.broker.options.max_output_buffer,
        )
        self.disconnect(ReasonCode.QUOTA_EXCEEDED, "output buffer full")
        self.link.abort()

    def send_publish(
        self,
        message: Message,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        sub_ids: tuple[int, ...],
        now: float,
    ) -> bool:
        """Queue one PUBLISH to the client; False if it exceeds the client's Maximum Packet
        Size and was dropped instead (MQTT-3.1.2-24, -25)."""
        if self.alias_maximum:
            return self._send_aliased(message, qos, retain, dup, packet_id, sub_ids, now)
        data = message.encode(self.version, qos, retain, dup, packet_id, sub_ids, now)
        if len(data) > self.max_send_size:
            return False
        if self.state != CLOSED:
            out = self._out
            if not out:
                self.broker.mark_dirty(self)
            out.append(data)
            self.publishes_sent += 1
        return True

    def _send_aliased(
        self,
        message: Message,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        sub_ids: tuple[int, ...],
        now: float,
    ) -> bool:
        """Send with a Topic Alias: the client allowed ``alias_maximum`` of them
        (MQTT-3.1.2-26); the least recently used is reassigned when they are all taken."""
        aliases = self._out_aliases
        if aliases is None:
            aliases = self._out_aliases = OrderedDict()
        topic = message.topic
        alias = aliases.get(topic)
        evicted = None
        if alias is not None:
            aliases.move_to_end(topic)
            data = message.encode_aliased(qos, retain, dup, packet_id, sub_ids, now, alias, False)
        else:
            if len(aliases) < self.alias_maximum:
                alias = len(aliases) + 1
            else:
                evicted = aliases.popitem(last=False)
                alias = evicted[1]
            data = message.encode_aliased(qos, retain, dup, packet_id, sub_ids, now, alias, True)
            if len(data) > self.max_send_size:
                if evicted is not None:  # not sent: the client still has the old mapping
                    aliases[evicted[0]] = evicted[1]
                    aliases.move_to_end(evicted[0], last=False)
                return False
            aliases[topic] = alias
        if len(data) > self.max_send_size:
            return False
        if self.state != CLOSED:
            self.publishes_sent += 1
        self._send(data)
        return True

    def send_pubrel(self, packet_id: int) -> None:
        self._send(fastpath.encode_ack(_PUBREL, packet_id, 0, None, self.version))

    # -- closing ----------------------------------------------------------------------------

    def _name(self) -> str:
        return self.client_id or self.peer

    def _fail(self, exc: MQTTError) -> None:
        """Answer a violation per the spec, then close (MQTT-4.13.1-1)."""
        code = exc.reason_code
        if self.state not in (AWAIT_CONNECT, AUTHENTICATING):
            log.warning("client %s: %s; closing (reason 0x%02X)", self._name(), exc.message, code)
        elif code not in _LOGGED_BY_AUTHENTICATOR:
            log.warning(
                "client %s from %s (user %r): %s; refused (reason 0x%02X)",
                self._name(),
                self.peer,
                self.username,
                exc.message,
                code,
            )
        if self.state in (AWAIT_CONNECT, AUTHENTICATING):
            if self.version == MQTT_5:
                if code in CONNACK_CODES:
                    props: dict[int, Any] = {Prop.REASON_STRING: exc.message} if exc.message else {}
                    if code in (ReasonCode.USE_ANOTHER_SERVER, ReasonCode.SERVER_MOVED):
                        props[Prop.SERVER_REFERENCE] = self.broker.options.server_reference
                    data = fastpath.encode_connack(pk.Connack(False, code, props), MQTT_5)
                    if len(data) > self.max_send_size:  # MQTT-3.2.2-19
                        data = fastpath.encode_connack(pk.Connack(False, code), MQTT_5)
                    self._send(data)
            elif code in (
                ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                ReasonCode.BAD_USER_NAME_OR_PASSWORD,
                ReasonCode.NOT_AUTHORIZED,
                ReasonCode.SERVER_UNAVAILABLE,
                ReasonCode.SERVER_BUSY,
                ReasonCode.QUOTA_EXCEEDED,
                ReasonCode.USE_ANOTHER_SERVER,
                ReasonCode.SERVER_MOVED,
            ):
                self._send(bytes((0x20, 2, 0, v311_connack_code(code))))
            self.close(publish_will=False)
        else:
            self.disconnect(code, exc.message)

    def disconnect(self, reason_code: int, reason: str = "", publish_will: bool = True) -> None:
        """Server-initiated DISCONNECT (MQTT 5 only; 3.1.1 has none) and close."""
        if self.state == CLOSED:
            return
        if self.version == MQTT_5 and self.state == CONNECTED:  # MQTT-3.14.0-1
            if reason_code not in DISCONNECT_CODES:  # MQTT-3.14.2-1: e.g. a failed re-auth
                reason_code = (
                    ReasonCode.NOT_AUTHORIZED
                    if reason_code
                    in (ReasonCode.BAD_USER_NAME_OR_PASSWORD, ReasonCode.BAD_AUTHENTICATION_METHOD)
                    else ReasonCode.UNSPECIFIED_ERROR
                )
            props: dict[int, Any] = {}
            if reason:
                props[Prop.REASON_STRING] = reason
            data = grammar.encode(pk.Disconnect(reason_code, props), MQTT_5)
            if len(data) > self.max_send_size:  # MQTT-3.14.2-3
                data = grammar.encode(pk.Disconnect(reason_code), MQTT_5)
            self._send(data)
        self.close(publish_will)

    def close(self, publish_will: bool = True) -> None:
        """Flush what is buffered, close the transport and detach from the session. Output
        that waits for the store (acknowledgements) goes out once committed, then the close."""
        if self.state == CLOSED:
            return
        self.state = CLOSED
        store = self.broker.store
        if store.writes != self._writes_seen:
            # This input changed the store and then closed us (DISCONNECT, or an error, in
            # the same read): what it produced (its acks) still waits for the commit.
            self._hold_output()
        if self._marks:
            store.after_commit(self._close_link)
        else:
            self._close_link()
        self.broker.connection_closed(self, publish_will)

    def _close_link(self) -> None:
        self._marks.clear()
        self.flush()
        self.link.close()

    def connection_lost(self) -> None:
        """The transport closed under us (network failure, client vanished), or after we closed
        it: either way nothing can be written any more. Output still waiting for a commit (the
        acks of a client that sent DISCONNECT and closed at once) is dropped here, so that the
        close deferred to that commit writes nothing to the dead transport."""
        self._out.clear()
        if self.state != CLOSED:
            if self.state == CONNECTED:
                log.info("client %s: connection lost", self.client_id)
            self.state = CLOSED
            self.broker.connection_closed(self, True)

    # -- flow control from the transport ----------------------------------------------------

    def pause_writing(self) -> None:
        """The transport holds more than its high-water mark: no more output for now (QoS 0
        is dropped, QoS 1/2 queued in the session) and no more input either, whose answers
        (acks, PINGRESP) would pile up too."""
        self.paused = True
        self._pause_input()

    def resume_writing(self) -> None:
        self.paused = False
        if self.state == CLOSED:
            return
        if self.session is not None and self.state == CONNECTED:
            self.session.drain(self.broker.clock())
        if not self._checking:
            self.resume_input()


# Why a SUBSCRIBE refused a filter or an UNSUBSCRIBE found none, for the Reason String.
_REFUSAL: dict[int, str] = {
    ReasonCode.NO_SUBSCRIPTION_EXISTED: "no such subscription",
    ReasonCode.TOPIC_FILTER_INVALID: "invalid topic filter (or beyond the length/level limits)",
    ReasonCode.NOT_AUTHORIZED: "not authorized by the ACL",
    ReasonCode.QUOTA_EXCEEDED: "subscription quota exceeded",
    ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: "shared subscriptions are off",
    ReasonCode.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: "wildcard subscriptions are off",
}
_REASON_MAX = 1024  # characters of a Reason String the broker composes


def _check_utf8_payload(payload: bytes) -> None:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        raise MQTTError(
            "payload is not UTF-8 although its Payload Format Indicator says so",
            ReasonCode.PAYLOAD_FORMAT_INVALID,
        ) from None

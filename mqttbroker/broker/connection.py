"""One network connection: its protocol state (where it is in the connection's life, who its
client is, what was agreed in CONNECT), keep alive bookkeeping, closing, and the answer to every
malformed or illegal packet. Beside it: the input's framing (``framing.py``), the output buffer
(``output.py``), the publish rights (``rights.py``), the states and which function handles each
packet (``state.py``), and what each packet means: ``connect.py`` (CONNECT, AUTH, DISCONNECT,
PINGREQ), ``publish.py`` (PUBLISH from the client and its QoS flows), ``subscribe.py``
(SUBSCRIBE, UNSUBSCRIBE, retained messages for new subscriptions), ``deliver.py`` (PUBLISH to
the client and its acknowledgements).

Sans-I/O. The transport edge calls :meth:`Connection.data_received` with whatever bytes arrived
and :meth:`Connection.connection_lost` when the socket closes; the connection writes through a
:class:`Link` (``write``, ``close``). Output is not written per packet: it is appended to the
connection's :class:`~mqttbroker.broker.output.Output` and the broker flushes every buffer once
per event-loop pass (passes.PassScheduler).
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from ..protocol import fastpath, grammar
from ..protocol import packets as pk
from ..protocol import properties as prop
from ..protocol.errors import MQTTError, ProtocolError
from ..protocol.packets import MQTT_5, PUBLISH
from ..protocol.reasons import DISCONNECT_CODES, ReasonCode
from . import connect, deliver, publish, subscribe
from .auth import Pending
from .connect import NO_LIMITS, Login
from .framing import Framing
from .message import Message
from .output import Output
from .policy import OPEN, ListenerPolicy
from .rights import Rights
from .state import (
    ACCEPT,
    AUTHENTICATE,
    AUTHENTICATING,
    AWAIT_CONNECT,
    CLOSE,
    CLOSED,
    CONNECTED,
    HANDLERS,
    RECEIVES,
    next_state,
)
from .topics import Subscription, parse_shared

if TYPE_CHECKING:
    from .aliases import TopicAliases
    from .core import Broker
    from .session import Session

log = logging.getLogger("mqttbroker.connection")

# By first byte: 1 for PUBACK, PUBREC, PUBREL and PUBCOMP with the fixed-header flags each
# must have (0, 0, 2, 0: section 2.1.3), whose two-byte form the connection reads without a
# packet object.
_PLAIN_ACK: Final = bytes(
    1 if first in (pk.PUBACK << 4, pk.PUBREC << 4, pk.PUBREL << 4 | 2, pk.PUBCOMP << 4) else 0
    for first in range(256)
)

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


@final
class Connection:
    __slots__ = (
        "broker",
        "link",
        "host",
        "port",
        "policy",
        "state",
        "version",
        "session",
        "client_id",
        "username",
        "address",
        "keep_alive",
        "last_received",
        "opened_at",
        "limits",
        "will",
        "aliases",
        "retained",
        "input",
        "output",
        "login",
        "rights",
    )

    def __init__(
        self,
        broker: Broker,
        link: Link,
        peer: str = "?",
        policy: ListenerPolicy = OPEN,
        certificate_user: str | None = None,
    ) -> None:
        self.broker = broker
        self.link = link
        # Its peer as the log names it ("address:port"), kept as the address, one string
        # however many clients it has, and the port (no object): an idle connection keeps no
        # string of its own. A peer without a port (a Unix socket's path) is all in ``host``.
        host, _, port = peer.rpartition(":")
        if host and port.isdigit():
            self.host = sys.intern(host)
            self.port = int(port)
        else:
            self.host = peer
            self.port = -1
        self.policy = policy  # its listener's rules
        self.state = AWAIT_CONNECT
        self.version = MQTT_5
        self.session: Session | None = None
        self.client_id = ""
        self.username: str | None = None
        self.address: str | None = None  # the client's address: per-address limits, logins
        self.keep_alive = 0
        now = broker.clock()
        self.last_received = now
        self.opened_at = now
        self.limits = NO_LIMITS  # what its CONNECT asked of what it is sent (connect.py)
        self.will: pk.Will | None = None
        # What most connections never need is created on first use: the topic aliases (the
        # client's and ours for it), the publish rights.
        self.aliases: TopicAliases | None = None
        # Retained messages still to send for new subscriptions, sent a share per loop pass
        # while the output drains (see subscribe.send_retained).
        self.retained: deque[tuple[Subscription, Iterator[Message]]] | None = None
        self.input = Framing()
        self.output = Output()
        # Made when a CONNECT needs one (most clean connections never do).
        self.login: Login | None = Login(certificate_user) if certificate_user is not None else None
        self.rights: Rights | None = None

    def __repr__(self) -> str:
        return f"Connection({self.client_id or self.peer!r})"

    @property
    def peer(self) -> str:
        """The client's socket peer as the log names it (see ``tcp.peer_name``)."""
        port = self.port
        return self.host if port < 0 else f"{self.host}:{port}"

    @property
    def certificate_user(self) -> str | None:
        login = self.login
        return None if login is None else login.certificate_user

    @property
    def assigned_id(self) -> bool:
        login = self.login
        return login is not None and login.assigned_id

    # -- input ------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        """Parse the complete packets in ``data`` (plus what was left over) and act on them.

        The work one connection's input causes in one event-loop pass is bounded
        (``input_budget`` packets and deliveries; an event loop may hand over many reads per
        pass): past it, the rest waits, reading from this client pauses, and the broker resumes
        it after the pass's output is flushed. A publisher whose messages fan out widely cannot
        hold the event loop (and everyone's output) for seconds."""
        framing = self.input
        size = len(data)
        framing.received += size  # this client's, and (the only place) the broker's
        broker = self.broker
        broker.stats.bytes_received += size
        if self.state == CLOSED:
            return  # MQTT-3.1.4-6: nothing after a refused CONNECT is processed
        if framing.waiting:  # an answer is awaited (a password check): keep the bytes
            framing.keep(data)
            return
        joined = framing.take(data)
        if joined is None:
            return  # the packet kept is still incomplete
        data = joined
        end = len(data)
        pos = 0
        now = broker.clock()  # the time of this read, for every packet in it
        store = broker.store
        output = self.output
        writes = output.writes_seen = store.writes
        opts = broker.options
        budget = opts.input_budget
        framing.begin_pass(broker.scheduler.passes)  # the budget is per event-loop pass
        try:
            while pos < end:
                if framing.work >= budget:
                    break
                state = self.state
                if state == AWAIT_CONNECT and not self._first_packet(data, pos, end):
                    return
                connected = state == CONNECTED
                stop = framing.split(data, pos, end, opts, connected)
                if stop < 0:
                    break
                first = data[pos]
                if connected and first >> 4 == PUBLISH:  # the hottest packet, at once
                    framing.publishes += 1
                    publish.publish_fast(self, first, data, pos, framing.body, stop, now)
                else:
                    self._dispatch(first, data, framing.body, stop, now)
                framing.work += 1
                pos = stop
                if self.state == CLOSED:
                    return
                if framing.waiting:
                    break
            if pos:  # keep alive counts whole packets, not a trickle of bytes (MQTT-3.1.2-22)
                self.last_received = now
            if store.writes != writes:
                self.hold_output()
        except Pending as held:  # an authorizer asks a service (http_auth): wait for it
            if pos:
                self.last_received = now
            if store.writes != writes:
                self.hold_output()
            self._await_rights(held, data[pos:])
            return
        except MQTTError as exc:
            self.fail(exc)
            return
        except Exception:  # a bug of ours: log it, close this client, keep serving the others
            log.exception("client %s: internal error while handling its packet", self.name())
            self.fail(MQTTError("internal error", ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR))
            return
        if pos < end or framing.waiting:
            if framing.waiting:  # the rest waits for the answer
                framing.keep(data[pos:])
                framing.pause(self.link)
                return
            if framing.work >= budget:
                framing.keep(data[pos:])  # parsed when resumed
                framing.pause(self.link)
                if not output.paused and not self.retained:  # else deferred already, or
                    broker.scheduler.defer(self)  # resume_writing goes on
                return
            framing.leave(data[pos:])  # an incomplete packet
        if framing.paused and not output.paused and not self.retained:
            framing.resume(self.link)

    def _first_packet(self, data: bytes, pos: int, end: int) -> bool:
        """Before CONNECT: False (and closed) when the packet at ``pos`` is not a CONNECT;
        else the protocol level is learnt from its head, so that a refusal (a CONNECT too
        large, or one that does not decode) is answered in the client's version."""
        if data[pos] >> 4 != pk.CONNECT:
            # MQTT-3.1.0-1: not MQTT, or not a CONNECT. There is nothing to acknowledge and
            # no protocol version to answer in: close at once.
            log.warning(
                "connection from %s: first packet is not CONNECT (byte 0x%02X); closing",
                self.peer,
                data[pos],
            )
            self.close(publish_will=False)
            return False
        header = fastpath.read_fixed_header(data, pos, end)
        if header is not None:
            body = header[1]
            version = fastpath.connect_version(data[body : min(end, body + 8)])
            if version >= 0:
                self.version = version
        return True

    def resume_input(self) -> None:
        """Go on with what waited for the next loop pass, when the budget ran out (called by
        the broker): retained messages for new subscriptions first, then input left over."""
        if self.state == CLOSED or self.output.paused:
            return  # resume_writing goes on once the output drained
        if self.retained:
            subscribe.send_retained(self)
            if self.retained:
                return  # deferred again, or waiting for the output to drain
        framing = self.input
        if framing.whole():  # a whole packet, or unknown
            self.data_received(b"")
        else:
            framing.resume(self.link)

    def password_checked(self, code: int, username: str | None = None) -> None:
        """The answer of a password check run off the event loop (see connect.on_connect):
        ``code`` (0 accepts) and, if not None, the user name the check established (a
        token's claim), which replaces the CONNECT's."""
        self.input.waiting = False
        login = self.login
        if login is None:
            return
        packet = login.held
        login.held = None
        if self.state == CLOSED or packet is None:
            return
        if username is not None:
            packet.username = username
        self._resume_connect(packet, None, code)

    def _await_rights(self, held: Pending, rest: bytes) -> None:
        """The packet at the start of ``rest`` asked a right the authorizer has no answer
        for yet: keep it and what follows, read nothing more, and handle it again once the
        answer is in (it is then found). Only this client waits."""
        framing = self.input
        if rest[0] >> 4 == pk.PUBLISH:
            framing.publishes -= 1  # counted again when handled again
        framing.keep(rest)
        framing.waiting = True
        framing.pause(self.link)
        held.wait(self._rights_known)

    def _rights_known(self) -> None:
        framing = self.input
        framing.waiting = False
        if self.state == CLOSED:
            return
        if not self.output.paused:
            framing.resume(self.link)
        if framing.pending is not None:
            self.data_received(b"")

    def await_answer(self) -> None:
        """The CONNECT waits for an answer (a password check, a cluster's claim of the client
        id): its state says AUTHENTICATING, and input is kept meanwhile."""
        self.to(AUTHENTICATE)
        self.input.waiting = True

    def claim_done(self, packet: pk.Connect, auth_props: dict[int, Any] | None) -> None:
        """In a cluster: this node owns the client id now, the client's session is here if
        another node had it (see connect.accept)."""
        self.input.waiting = False
        if self.state != CLOSED:
            self._resume_connect(packet, auth_props, 0)

    def claim_refused(self, refusal: MQTTError) -> None:
        """In a cluster: the node that has the client's session refused it (another user's)."""
        self.input.waiting = False
        if self.state != CLOSED:
            self.fail(refusal)

    def _resume_connect(
        self, packet: pk.Connect, auth_props: dict[int, Any] | None, code: int
    ) -> None:
        """Accept a CONNECT whose answer waited (``code``: the password check's), then go
        through the input the client sent meanwhile."""
        store = self.broker.store
        writes = store.writes
        try:
            if code:
                raise MQTTError("authentication failed", code)
            connect.accept(self, packet, auth_props)
        except MQTTError as exc:
            self.fail(exc)
            return
        if store.writes != writes:
            self.hold_output()
        framing = self.input
        if not self.output.paused:
            framing.resume(self.link)
        if framing.pending is not None:
            self.data_received(b"")

    def _dispatch(self, first: int, data: bytes, body: int, stop: int, now: float) -> None:
        """Decode one packet other than a PUBLISH once connected (data_received hands that
        straight to publish.publish_fast, which slices one without properties without a packet
        object) and hand it to its handler. Once connected, the acks (the hot path) go straight
        to their fast decoder; every other packet is decoded by the protocol's one dispatcher,
        fastpath.decode_packet, and handed to the function state.HANDLERS names for it. What a
        state does not accept (state.RECEIVES) is refused as that state says."""
        ptype = first >> 4
        state = self.state
        if state == CONNECTED:  # the hot packets first, each straight to its fast decoder
            if stop - body == 2 and _PLAIN_ACK[first]:
                # An acknowledgement of success without properties, what nearly every one is:
                # the packet id is all it says, so no packet object is made for it.
                packet_id = (data[body] << 8) | data[body + 1]
                if ptype == pk.PUBREL:
                    publish.on_pubrel(self, packet_id)
                else:
                    deliver.on_ack(self, ptype, packet_id, 0, now)
                return
            if pk.PUBACK <= ptype <= pk.PUBCOMP:
                ack = fastpath.decode_ack(ptype, first & 0x0F, data, body, stop, self.version)
                if ptype == pk.PUBREL:
                    publish.on_pubrel(self, ack.packet_id)
                else:
                    deliver.on_ack(self, ptype, ack.packet_id, ack.reason_code, now)
                return
        if ptype not in RECEIVES[state]:
            if state == AUTHENTICATING:  # only AUTH or DISCONNECT until CONNACK (3.1.2-30)
                raise ProtocolError(f"packet type {ptype} during authentication")
            if ptype == pk.CONNECT:
                raise ProtocolError("second CONNECT on one connection")  # MQTT-3.1.0-2
            raise ProtocolError(f"a client may not send packet type {ptype}")
        # More filters than a client may hold could never be granted: refused whole.
        limit = self.broker.options.max_subscriptions_per_client
        packet = fastpath.decode_packet(first, data, body, stop, self.version, limit)
        HANDLERS[ptype](self, packet)

    def to(self, event: int) -> None:
        """Move to the state ``event`` leads to (state.TRANSITIONS); a move the table does not
        list is a bug of ours (IllegalTransition)."""
        self.state = next_state(self.state, event)

    @property
    def connected(self) -> bool:
        """CONNACK sent: the session is attached."""
        return self.state == CONNECTED

    def authenticate(self, wait: bool) -> None:
        """The CONNECT's credentials are being checked (state AUTHENTICATING): by an exchange
        of AUTH packets, or by an answer awaited (``wait``: a password check, a cluster's
        claim of the client id), input being kept meanwhile."""
        self.to(AUTHENTICATE)
        if wait:
            self.input.waiting = True

    def attach(self, session: Session) -> None:
        """The client is who it says: ``session`` is its session now (CONNACK follows)."""
        self.session = session
        self.to(ACCEPT)

    # -- authorization ---------------------------------------------------------------------

    def _rights(self) -> Rights:
        rights = self.rights
        if rights is None:
            rights = self.rights = Rights(self.broker.options.max_publish_burst, self.opened_at)
        return rights

    def log_denied(self, action: str, topic: str) -> None:
        """Log a refusal of the authorizer: this connection's 1st, 2nd, 4th, 8th..., so a
        client retrying in a loop cannot flood the log."""
        count = self._rights().denied()
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
        """Whether the authorizer lets this client publish to ``topic`` (answers cached: see
        rights.Rights)."""
        authorizer = self.broker.authorizer
        assert authorizer is not None
        return self._rights().may_publish(authorizer, self.client_id, self.username, topic)

    def take_token(self, now: float) -> bool:
        """One message's token from the publish-rate bucket (max_publish_rate, refilled up to
        max_publish_burst); False when it is empty."""
        opts = self.broker.options
        return self._rights().take_token(now, opts.max_publish_rate, opts.max_publish_burst)

    def ask_subscribe_rights(self, packet: pk.Subscribe) -> None:
        """Before a SUBSCRIBE changes anything: ask an authorizer that asks a service
        (``ask_subscribe``) about each filter, so that a missing answer (Pending) makes the
        packet wait whole; on_subscribe then finds every answer."""
        ask = getattr(self.broker.authorizer, "ask_subscribe", None)
        if ask is None:
            return
        for request in packet.subscriptions:
            try:
                shared = parse_shared(request.topic_filter)
            except ValueError:
                continue  # refused by on_subscribe
            ask(self.client_id, self.username, shared[1] if shared else request.topic_filter)

    # -- output -----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.state != CLOSED and self.output.append(data):
            self.broker.scheduler.mark_dirty(self)

    def send_explained(self, ptype: int, packet_id: int, code: int, reason: str) -> None:
        """An acknowledgement (PUBACK, PUBREC, PUBREL, PUBCOMP) with a Reason String, unless the
        client asked for none (MQTT-3.1.2-29) or it would exceed the client's Maximum Packet
        Size (MQTT-3.4.2-2, -3.5.2-2, -3.6.2-2, -3.7.2-2)."""
        props: dict[int, Any] | None = (
            {prop.REASON_STRING: reason} if self.limits.problem_info else None
        )
        data = fastpath.encode_ack(ptype, packet_id, code, props, self.version)
        if len(data) > self.limits.max_send_size:
            data = fastpath.encode_ack(ptype, packet_id, code, None, self.version)
        self.send(data)

    def hold_output(self) -> None:
        """Our input changed the store: what we have buffered so far (acknowledgements among
        it) waits until the store's current batch is committed, so that "acknowledged" means
        "on disk". Later output waits behind it, in order."""
        self.output.hold()
        self.broker.store.after_commit(self._release_output)

    def _release_output(self) -> None:
        if self.output.release():
            self.broker.scheduler.mark_dirty(self)

    def flush(self) -> None:
        """Write what is buffered (up to what still waits for a commit) in one call."""
        output = self.output
        size = output.flush(self.link)
        if size:
            broker = self.broker
            broker.stats.bytes_sent += size  # (the only place that counts the broker's)
            if output.paused and output.over(self.link, broker.options.max_output_buffer):
                self._overflow()

    def _overflow(self) -> None:
        """More output than max_output_buffer waits for a client that does not read: closed
        (DISCONNECT 0x97 first in MQTT 5, for what it is worth behind all that), and what it
        did not take dropped, so its memory is freed at once."""
        output = self.output
        if output.overflowed:
            return
        output.overflowed = True
        log.warning(
            "client %s: more than max_output_buffer (%d bytes) waits for it to read; closing",
            self.name(),
            self.broker.options.max_output_buffer,
        )
        self.disconnect(ReasonCode.QUOTA_EXCEEDED, "output buffer full")
        self.link.abort()

    # -- closing ----------------------------------------------------------------------------

    def name(self) -> str:
        return self.client_id or self.peer

    def fail(self, exc: MQTTError) -> None:
        """Answer a violation per the spec, then close (MQTT-4.13.1-1)."""
        code = exc.reason_code
        if self.state not in (AWAIT_CONNECT, AUTHENTICATING):
            log.warning("client %s: %s; closing (reason 0x%02X)", self.name(), exc.message, code)
        elif code not in _LOGGED_BY_AUTHENTICATOR:
            log.warning(
                "client %s from %s (user %r): %s; refused (reason 0x%02X)",
                self.name(),
                self.peer,
                self.username,
                exc.message,
                code,
            )
        if self.state in (AWAIT_CONNECT, AUTHENTICATING):
            refusals = self.broker.stats.refusals
            refusals[code] = refusals.get(code, 0) + 1
            connect.refuse(self, code, exc.message)
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
                props[prop.REASON_STRING] = reason
            data = grammar.encode(pk.Disconnect(reason_code, props), MQTT_5)
            if len(data) > self.limits.max_send_size:  # MQTT-3.14.2-3
                data = grammar.encode(pk.Disconnect(reason_code), MQTT_5)
            self.send(data)
        self.close(publish_will)

    def close(self, publish_will: bool = True) -> None:
        """Flush what is buffered, close the transport and detach from the session. Output
        that waits for the store (acknowledgements) goes out once committed, then the close."""
        if self.state == CLOSED:
            return
        self.to(CLOSE)
        store = self.broker.store
        if store.writes != self.output.writes_seen:
            # This input changed the store and then closed us (DISCONNECT, or an error, in
            # the same read): what it produced (its acks) still waits for the commit.
            self.hold_output()
        if self.output.held():
            store.after_commit(self._close_link)
        else:
            self._close_link()
        self.broker.connection_closed(self, publish_will)

    def _close_link(self) -> None:
        self.output.flush_all(self.link)
        self.link.close()

    def connection_lost(self) -> None:
        """The transport closed under us (network failure, client vanished), or after we closed
        it: either way nothing can be written any more. Output still waiting for a commit (the
        acks of a client that sent DISCONNECT and closed at once) is dropped here, so that the
        close deferred to that commit writes nothing to the dead transport."""
        self.output.drop()
        if self.state != CLOSED:
            if self.state == CONNECTED:
                self.broker.connection_log.lost(self.broker.clock(), self.client_id)
            self.to(CLOSE)
            self.broker.connection_closed(self, True)

    # -- flow control from the transport ----------------------------------------------------

    def pause_writing(self) -> None:
        """The transport holds more than its high-water mark: no more output for now (QoS 0
        is dropped, QoS 1/2 queued in the session) and no more input either, whose answers
        (acks, PINGRESP) would pile up too."""
        self.output.paused = True
        self.input.pause(self.link)

    def resume_writing(self) -> None:
        self.output.paused = False
        if self.state == CLOSED:
            return
        if self.session is not None and self.state == CONNECTED:
            self.session.drain(self.broker.clock())
        if not self.input.waiting:
            self.resume_input()

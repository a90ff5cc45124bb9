"""One network connection: framing, the output buffer, holding acknowledgements until the
store commits, keep alive bookkeeping, closing, and the answer to every malformed or illegal
packet. What each packet means is handled beside it: ``connect.py`` (CONNECT, AUTH,
DISCONNECT), ``publish.py`` (PUBLISH from the client and its QoS flows), ``subscribe.py``
(SUBSCRIBE, UNSUBSCRIBE, retained messages for new subscriptions), ``deliver.py`` (PUBLISH to
the client and its acknowledgements). The states and their transitions are in ``state.py``.

Sans-I/O. The transport edge calls :meth:`Connection.data_received` with whatever bytes arrived
and :meth:`Connection.connection_lost` when the socket closes; the connection writes through a
:class:`Link` (``write``, ``close``). Output is not written per packet: it is appended to a
per-connection buffer and the broker flushes every buffer once per event-loop pass (the output
of a pass's first read goes out at once while the loop is not under load: passes.py).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol

from ..protocol import fastpath, grammar
from ..protocol import packets as pk
from ..protocol import properties as prop
from ..protocol.errors import MQTTError, PacketTooLarge, ProtocolError
from ..protocol.packets import MQTT_5
from ..protocol.reasons import DISCONNECT_CODES, ReasonCode
from . import connect, deliver, publish, subscribe
from .auth import AuthExchange, Pending
from .message import Message
from .policy import OPEN, ListenerPolicy
from .state import (
    AUTHENTICATING,
    AWAIT_CONNECT,
    CLOSE,
    CLOSED,
    CONNECTED,
    RECEIVES,
    next_state,
)
from .topics import Subscription, parse_shared

if TYPE_CHECKING:
    from .core import Broker
    from .session import Session

log = logging.getLogger("mqttbroker.connection")

# The per-connection cache of publish rights: at most this many topics, of this many
# characters in all.
ALLOWED_CACHE_TOPICS = 1024
ALLOWED_CACHE_CHARS = 65_536

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


class Connection:
    __slots__ = (
        "broker",
        "link",
        "peer",
        "policy",
        "certificate_user",
        "state",
        "version",
        "session",
        "client_id",
        "keep_alive",
        "last_received",
        "opened_at",
        "send_quota",
        "max_send_size",
        "will",
        "connect_expiry",
        "aliases",
        "_pending",
        "_pending_len",
        "_need",
        "out",
        "_marks",
        "_out_base",
        "_free_upto",
        "_writes_seen",
        "alias_maximum",
        "out_aliases",
        "username",
        "_allowed",
        "_allowed_generation",
        "_allowed_size",
        "address",
        "tokens",
        "tokens_at",
        "auth",
        "auth_method",
        "held_connect",
        "_denials",
        "work",
        "work_pass",
        "publishes_sent",
        "publishes_received",
        "bytes_received",
        "bytes_sent",
        "retained",
        "problem_info",
        "paused",
        "assigned_id",
        "checking",
        "claimed",
        "input_paused",
        "_overflowed",
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
        self.peer = peer
        self.policy = policy  # its listener's rules
        # The user name a client certificate the listener verified gives (mutual TLS with
        # tls_certificate_username): then the credential that counts.
        self.certificate_user = certificate_user
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
        self.will: pk.Will | None = None
        self.connect_expiry = 0
        # What most connections never need is created on first use: the client's topic
        # aliases, the chunks of an incomplete packet, the cache of publish rights.
        self.aliases: dict[int, str] | None = None
        self._pending: list[bytes] | None = None  # bytes of an incomplete packet
        self._pending_len = 0
        self._need = 0  # bytes the incomplete packet needs in all, when known
        self.out: list[bytes] | None = None  # packets to write, from the first on until written
        # Output held for the store (see hold_output): absolute output positions that wait for
        # a commit each (few at a time: a list is smaller than a deque; made when first
        # needed, as most connections never change the store), the number of chunks flushed
        # so far, and how far output may go.
        self._marks: list[int] | None = None
        self._out_base = 0
        self._free_upto = 0
        self._writes_seen = 0  # the store's write count when our current input began
        self.alias_maximum = 0  # the client's Topic Alias Maximum
        self.out_aliases: OrderedDict[str, int] | None = None  # topic -> alias, LRU first
        self.username: str | None = None
        self._allowed: dict[str, bool] | None = None  # topic -> may publish, for the
        # rules' generation
        self._allowed_generation = -1
        self._allowed_size = 0  # characters of the topics in _allowed
        self.address: str | None = None  # the client's address: per-address limits, logins
        self.tokens = float(broker.options.max_publish_burst)  # publish-rate bucket
        self.tokens_at = now
        self.auth: AuthExchange | None = None  # an enhanced-authentication exchange under way
        self.auth_method: str | None = None
        self.held_connect: pk.Connect | None = None  # held while authenticating
        self._denials = 0  # PUBLISHes and subscriptions the authorizer refused
        self.work = 0  # packets and deliveries caused by our input in this loop pass
        self.work_pass = -1  # the pass ``work`` counts
        self.publishes_sent = 0  # PUBLISH packets queued for the client ($SYS: delivered)
        self.publishes_received = 0  # PUBLISH packets from the client
        self.bytes_received = 0  # MQTT bytes read from the client, counted per read
        self.bytes_sent = 0  # MQTT bytes written to the client, counted per write
        # Retained messages still to send for new subscriptions, sent a share per loop pass
        # while the output drains (see subscribe.send_retained).
        self.retained: deque[tuple[Subscription, Iterator[Message]]] | None = None
        # The flags last and together: compiled, each takes one byte where they sit, and eight
        # bytes apiece when scattered between the other fields.
        self.problem_info = True  # the client's Request Problem Information
        self.paused = False  # the transport asked us to stop writing
        self.assigned_id = False  # the broker chose the client id
        self.checking = False  # a password check runs off the event loop
        self.claimed = False  # in a cluster: the client id is this node's now
        self.input_paused = False  # reading paused until the broker resumes our input
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
        size = len(data)
        self.bytes_received += size  # this client's, and (the only place) the broker's
        self.broker.stats.bytes_received += size
        if self.state == CLOSED:
            return  # MQTT-3.1.4-6: nothing after a refused CONNECT is processed
        pending = self._pending
        if self.checking:  # a password check is under way: keep the bytes for later
            if pending is None:
                self._pending = [data]
            else:
                pending.append(data)
            self._pending_len += len(data)
            self._need = 0
            return
        if pending:
            pending.append(data)
            self._pending_len += len(data)
            if self._pending_len < self._need:
                return
            data = b"".join(pending)
            self._pending = None
            self._pending_len = self._need = 0
        end = len(data)
        pos = 0
        broker = self.broker
        now = broker.clock()  # the time of this read, for every packet in it
        opts = broker.options
        # Packets up to ``small`` bytes need no look at the limits: the CONNECT limit (and the
        # one of AUTH before CONNACK) is checked only past it.
        small = min(opts.max_connect_size, opts.max_packet_size)
        store = broker.store
        writes = self._writes_seen = store.writes
        budget = opts.input_budget
        if self.work_pass != broker.scheduler.passes:  # the budget is per event-loop pass
            self.work_pass = broker.scheduler.passes
            self.work = 0
        try:
            while pos < end:
                if self.work >= budget:
                    break
                if self.state == AWAIT_CONNECT and data[pos] >> 4 != pk.CONNECT:
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
                self._dispatch(data[pos], data, body, stop, now)
                self.work += 1
                pos = stop
                if self.state == CLOSED:
                    return
                if self.checking:
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
        if pos < end or self.checking:
            rest = data[pos:]
            if rest:
                self._pending = [rest]
                self._pending_len = len(rest)
            if self.checking:  # the rest waits for the password check's answer
                self._need = 0
                self.pause_input()
                return
            if self.work >= budget:
                self._need = 0  # parse the rest when resumed
                self.pause_input()
                if not self.paused and not self.retained:  # else deferred already, or
                    self.broker.scheduler.defer(self)  # resume_writing goes on
                return
        if self.input_paused and not self.paused and not self.retained:
            self.input_paused = False
            self.link.resume_reading()

    def pause_input(self) -> None:
        if not self.input_paused:
            self.input_paused = True
            self.link.pause_reading()

    def resume_input(self) -> None:
        """Go on with what waited for the next loop pass, when the budget ran out (called by
        the broker): retained messages for new subscriptions first, then input left over."""
        if self.state == CLOSED or self.paused:
            return  # resume_writing goes on once the output drained
        if self.retained:
            subscribe.send_retained(self)
            if self.retained:
                return  # deferred again, or waiting for the output to drain
        if self._pending and self._pending_len >= self._need:  # a whole packet, or unknown
            self.data_received(b"")
        elif self.input_paused:
            self.input_paused = False
            self.link.resume_reading()

    def password_checked(self, code: int, username: str | None = None) -> None:
        """The answer of a password check run off the event loop (see connect.on_connect):
        ``code`` (0 accepts) and, if not None, the user name the check established (a
        token's claim), which replaces the CONNECT's."""
        self.checking = False
        packet = self.held_connect
        self.held_connect = None
        if self.state == CLOSED or packet is None:
            return
        if username is not None:
            packet.username = username
        self._resume_connect(packet, None, code)

    def _await_rights(self, held: Pending, rest: bytes) -> None:
        """The packet at the start of ``rest`` asked a right the authorizer has no answer
        for yet: keep it and what follows, read nothing more, and handle it again once the
        answer is in (it is then found). Only this client waits."""
        if rest[0] >> 4 == pk.PUBLISH:
            self.publishes_received -= 1  # counted again when handled again
        self._pending = [rest]
        self._pending_len = len(rest)
        self._need = 0
        self.checking = True
        self.pause_input()
        held.wait(self._rights_known)

    def _rights_known(self) -> None:
        self.checking = False
        if self.state == CLOSED:
            return
        if self.input_paused and not self.paused:
            self.input_paused = False
            self.link.resume_reading()
        if self._pending:
            self.data_received(b"")

    def claim_done(self, packet: pk.Connect, auth_props: dict[int, Any] | None) -> None:
        """In a cluster: this node owns the client id now, the client's session is here if
        another node had it (see connect.accept)."""
        self.checking = False
        if self.state != CLOSED:
            self._resume_connect(packet, auth_props, 0)

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
        if self.input_paused and not self.paused:
            self.input_paused = False
            self.link.resume_reading()
        if self._pending:
            self.data_received(b"")

    def _check_size(self, size: int, head: bytes) -> None:
        """A packet of ``size`` bytes (``head``: its first bytes after the fixed header) is
        larger than the CONNECT limit: refused (0x95) before authentication, from its fixed
        header, so that nothing big is held or decoded for a client nobody knows yet; after
        it, refused past max_packet_size."""
        opts = self.broker.options
        if self.state != CONNECTED and size > opts.max_connect_size:
            if self.state == AWAIT_CONNECT:
                self._learn_version(head)
            raise PacketTooLarge(
                f"packet of {size} bytes before authentication exceeds max_connect_size "
                f"({opts.max_connect_size})"
            )
        if size > opts.max_packet_size:
            raise PacketTooLarge(
                f"packet of {size} bytes exceeds the maximum of {opts.max_packet_size}"
            )

    def _dispatch(self, first: int, data: bytes, body: int, stop: int, now: float) -> None:
        """Decode one packet and hand it to its handler. Once connected, PUBLISH and the acks
        (the hot path) go straight to their fast decoders, and a PUBLISH without properties is
        sliced without a packet object; every other packet goes through the protocol's one
        dispatcher, fastpath.decode_packet. What a state does not accept (state.RECEIVES) is
        refused as that state says."""
        ptype = first >> 4
        state = self.state
        if state == CONNECTED:  # the hot packets first, each straight to its fast decoder
            if ptype == pk.PUBLISH:
                publish.publish_fast(self, first, data, body, stop, now)
                return
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
        if state == AWAIT_CONNECT:
            self._learn_version(data[body:stop])
        # More filters than a client may hold could never be granted: refused whole.
        limit = self.broker.options.max_subscriptions_per_client
        packet = fastpath.decode_packet(first, data, body, stop, self.version, limit)
        if isinstance(packet, pk.Pingreq):
            self.send(fastpath.PINGRESP)  # MQTT-3.12.4-1
        elif isinstance(packet, pk.Subscribe):
            subscribe.on_subscribe(self, packet)
        elif isinstance(packet, pk.Unsubscribe):
            subscribe.on_unsubscribe(self, packet)
        elif isinstance(packet, pk.Connect):
            connect.on_connect(self, packet)
        elif isinstance(packet, pk.Auth):
            connect.on_auth(self, packet)
        elif isinstance(packet, pk.Disconnect):
            connect.on_disconnect(self, packet)

    def _learn_version(self, body: bytes) -> None:
        """The protocol level from the start of a CONNECT body, when it is there: learnt
        before the body is decoded, so that a refusal is answered in the client's version."""
        version = fastpath.connect_version(body)
        if version >= 0:
            self.version = version

    def to(self, event: int) -> None:
        """Move to the state ``event`` leads to (state.TRANSITIONS); a move the table does not
        list is a bug of ours (IllegalTransition)."""
        self.state = next_state(self.state, event)

    # -- authorization ---------------------------------------------------------------------

    def log_denied(self, action: str, topic: str) -> None:
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
        cache = self._allowed
        if self._allowed_generation != authorizer.generation:
            cache = self._allowed = None
            self._allowed_size = 0
            self._allowed_generation = authorizer.generation
        allowed = None if cache is None else cache.get(topic)
        if allowed is None:
            # An authorizer that asks a service (http_auth) may make this packet wait
            # (Pending): asked through its ask_publish. Not per message: per uncached topic.
            ask = getattr(authorizer, "ask_publish", None)
            if ask is None:
                allowed = authorizer.can_publish(self.client_id, self.username, topic)
            else:
                allowed = ask(self.client_id, self.username, topic)
            size = self._allowed_size + len(topic)
            if cache is None:
                cache = self._allowed = {}
            if len(cache) < ALLOWED_CACHE_TOPICS and size <= ALLOWED_CACHE_CHARS:
                cache[topic] = allowed
                self._allowed_size = size
        return allowed

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
        if self.state == CLOSED:
            return
        out = self.out
        if out is None:
            self.out = [data]
            self.broker.scheduler.mark_dirty(self)
        else:
            out.append(data)

    def send_explained(self, ptype: int, packet_id: int, code: int, reason: str) -> None:
        """An acknowledgement (PUBACK, PUBREC, PUBREL, PUBCOMP) with a Reason String, unless the
        client asked for none (MQTT-3.1.2-29) or it would exceed the client's Maximum Packet
        Size (MQTT-3.4.2-2, -3.5.2-2, -3.6.2-2, -3.7.2-2)."""
        props: dict[int, Any] | None = {prop.REASON_STRING: reason} if self.problem_info else None
        data = fastpath.encode_ack(ptype, packet_id, code, props, self.version)
        if len(data) > self.max_send_size:
            data = fastpath.encode_ack(ptype, packet_id, code, None, self.version)
        self.send(data)

    def hold_output(self) -> None:
        """Our input changed the store: what we have buffered so far (acknowledgements among
        it) waits until the store's current batch is committed, so that "acknowledged" means
        "on disk". Later output waits behind it, in order."""
        marks = self._marks
        if marks is None:
            marks = self._marks = []
        out = self.out
        marks.append(self._out_base + (len(out) if out is not None else 0))
        self.broker.store.after_commit(self._release_output)

    def _release_output(self) -> None:
        marks = self._marks
        if not marks:  # the connection was closed and flushed meanwhile
            return
        # Batches commit in order, so the oldest mark is the one committed now.
        self._free_upto = marks.pop(0)
        if self.out:
            self.broker.scheduler.mark_dirty(self)

    def flush(self) -> None:
        """Write what is buffered (up to what still waits for a commit) in one call."""
        out = self.out
        if not out:
            return
        count = len(out)
        if self._marks:
            count = min(count, self._free_upto - self._out_base)
            if count <= 0:
                return
        data = out[0] if count == 1 else b"".join(out[:count])
        if count == len(out):
            self.out = None  # an idle connection keeps no list
        else:
            del out[:count]
        self._out_base += count
        size = len(data)
        self.bytes_sent += size  # this client's, and (the only place) the broker's
        self.broker.stats.bytes_sent += size
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
            if len(data) > self.max_send_size:  # MQTT-3.14.2-3
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
        if store.writes != self._writes_seen:
            # This input changed the store and then closed us (DISCONNECT, or an error, in
            # the same read): what it produced (its acks) still waits for the commit.
            self.hold_output()
        if self._marks:
            store.after_commit(self._close_link)
        else:
            self._close_link()
        self.broker.connection_closed(self, publish_will)

    def _close_link(self) -> None:
        self._marks = None
        self.flush()
        self.link.close()

    def connection_lost(self) -> None:
        """The transport closed under us (network failure, client vanished), or after we closed
        it: either way nothing can be written any more. Output still waiting for a commit (the
        acks of a client that sent DISCONNECT and closed at once) is dropped here, so that the
        close deferred to that commit writes nothing to the dead transport."""
        self.out = None
        if self.state != CLOSED:
            if self.state == CONNECTED:
                if self.broker.options.connection_log_interval:
                    self.broker.stats.unlogged_lost += 1
                else:
                    log.info("client %s: connection lost", self.client_id)
            self.to(CLOSE)
            self.broker.connection_closed(self, True)

    # -- flow control from the transport ----------------------------------------------------

    def pause_writing(self) -> None:
        """The transport holds more than its high-water mark: no more output for now (QoS 0
        is dropped, QoS 1/2 queued in the session) and no more input either, whose answers
        (acks, PINGRESP) would pile up too."""
        self.paused = True
        self.pause_input()

    def resume_writing(self) -> None:
        self.paused = False
        if self.state == CLOSED:
            return
        if self.session is not None and self.state == CONNECTED:
            self.session.drain(self.broker.clock())
        if not self.checking:
            self.resume_input()

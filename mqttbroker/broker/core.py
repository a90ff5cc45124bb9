"""The broker's state and the rules that span connections: the session registry (takeover, Clean
Start, expiry), wills, keep alive and the connection limits. When output is written is the
scheduler's (``passes.py``); the running totals are ``stats.py``'s.

Sans-I/O: time comes from the injected ``clock``; the transport edge calls :meth:`Broker.tick`
twice a second and sets the scheduler's ``wake`` to schedule its flush.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from ..protocol import fastpath
from ..protocol import packets as pk
from ..protocol import properties as prop
from ..protocol.errors import MQTTError
from ..protocol.packets import MQTT_5, Will
from ..protocol.properties import limit_user_properties
from ..protocol.reasons import ReasonCode
from .auth import AllowAll, Authenticator, Authorizer
from .connect import ClientLimits
from .connection import Connection, Link
from .connection_log import ConnectionLog
from .message import Message
from .options import PER_ADDRESS_DEFAULT, BrokerOptions
from .passes import PassScheduler
from .policy import OPEN, ListenerPolicy
from .router import Router
from .session import NEVER, Session
from .sink import RESERVED_PREFIXES
from .state import AUTHENTICATING, AWAIT_CONNECT
from .stats import BrokerStats
from .store import Restored, Store
from .topics import SharedGroup, Subscription

log = logging.getLogger("mqttbroker.broker")

_WILL_NOT_FORWARDED = (prop.WILL_DELAY_INTERVAL, prop.MESSAGE_EXPIRY_INTERVAL)


def _user(username: str | None) -> str:
    """A session's owner as the log names it."""
    return "anonymous" if username is None else f"user {username!r}"


def connack_properties(opts: BrokerOptions) -> dict[int, Any]:
    """What every MQTT 5 CONNACK tells the client about this broker (section 3.2.2.3);
    properties at their default value are left out."""
    props: dict[int, Any] = {}
    if opts.receive_maximum != 65535:
        props[prop.RECEIVE_MAXIMUM] = opts.receive_maximum
    if opts.maximum_qos < 2:
        props[prop.MAXIMUM_QOS] = opts.maximum_qos  # MQTT-3.2.2-9
    if not opts.retain_available:
        props[prop.RETAIN_AVAILABLE] = 0
    props[prop.MAXIMUM_PACKET_SIZE] = opts.max_packet_size
    if opts.topic_alias_maximum:
        props[prop.TOPIC_ALIAS_MAXIMUM] = opts.topic_alias_maximum
    if not opts.wildcard_subscriptions:
        props[prop.WILDCARD_SUBSCRIPTION_AVAILABLE] = 0
    if not opts.subscription_identifiers:
        props[prop.SUBSCRIPTION_IDENTIFIER_AVAILABLE] = 0
    if not opts.shared_subscriptions:
        props[prop.SHARED_SUBSCRIPTION_AVAILABLE] = 0
    return props


def _check_pattern(pattern: str, client_id: str, username: str | None) -> None:
    """MQTTError (0x85) unless ``client_id`` matches ``client_id_pattern`` for ``username``: "%u"
    the user name, "*" any characters."""
    if username is not None:
        parts = (re.escape(part).replace(r"\*", ".*") for part in pattern.split("%u"))
        if re.fullmatch(re.escape(username).join(parts), client_id, re.DOTALL):
            return
    raise MQTTError(
        f"client id does not match client_id_pattern for {_user(username)}",
        ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
    )


class Broker:
    """The sessions and connections of one broker, and what spans them (see the module)."""

    def __init__(
        self,
        options: BrokerOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
        store: Store | None = None,
        authenticator: Authenticator | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.options = options or BrokerOptions()
        self.options.check()
        limit_user_properties(self.options.max_user_properties)  # the codec's, one per process
        self.clock = clock
        self.store = store or Store()
        self.authenticator: Authenticator = authenticator or AllowAll()
        self.authorizer = authorizer  # None: everyone may publish and subscribe anywhere
        self.stats = BrokerStats()  # the running totals every report reads
        self.connection_log = ConnectionLog(self.options)  # the lines about each client
        self._per_address: dict[str, int] = {}  # open connections per source address
        self.connack_properties = connack_properties(self.options)
        # The MQTT 5 CONNACK most clients get (success, nothing particular to the client),
        # indexed by Session Present.
        self.connack_v5: tuple[bytes, bytes] = (
            fastpath.encode_connack(pk.Connack(False, 0, self.connack_properties), MQTT_5),
            fastpath.encode_connack(pk.Connack(True, 0, self.connack_properties), MQTT_5),
        )
        self.sessions: dict[str, Session] = {}
        # The sessions with queued messages, exactly (kept by Session: see Session.backlog):
        # what the admin API sorts by oldest queued message and the alerts survey, without a
        # walk over all sessions.
        self.backlog: dict[Session, None] = {}
        self.persistent_sessions = 0  # sessions of non-zero expiry (max_sessions)
        self._user_sessions: dict[str, int] = {}  # user name -> its persistent sessions
        # The open connections, as a dict's keys rather than a set: a set of 10,000 takes
        # 52-105 bytes per member as it grows by four, a dict 30-52.
        self.connections: dict[Connection, None] = {}
        # What clients' CONNECTs asked of what they are sent, one object per distinct answer
        # (connect.client_limits), most clients sharing the defaults'.
        self.client_limits: dict[tuple[int, int, int, bool], ClientLimits] = {}
        self.router = Router(self.options, self.store)
        self.scheduler = PassScheduler()  # when the connections' output is written
        # Checks a CONNECT's user name and password elsewhere (the edge's chain of login
        # sources: hashing on worker threads, an HTTP service...), called with the connection,
        # the CONNECT and the listener's anonymous rule; the answer comes back on the event
        # loop through conn.password_checked(code, username). None: the authenticator's
        # check_password, here (tests do).
        self.offload: Callable[[Connection, pk.Connect, bool | None], None] | None = None
        # Told of client.connected (before the CONNACK: the connection sets the session's user
        # name right after), client.disconnected and session.expired (webhooks use these).
        self.observers: list[Callable[[str, Session], None]] = []

    # -- connections -----------------------------------------------------------------------

    def connect(
        self,
        link: Link,
        peer: str = "?",
        address: str | None = None,
        policy: ListenerPolicy = OPEN,
        certificate_user: str | None = None,
    ) -> Connection:
        """A new network connection from ``peer`` ("address:port", how the log names it) and
        ``address`` (by default the address in ``peer``; a proxy's client may differ), on a
        listener whose rules are ``policy`` (a local-only one has no per-address limit unless
        one is configured); ``certificate_user``: the user name of a client certificate the
        listener verified. Past the connection limits it is closed at once (the log says which
        limit)."""
        conn = Connection(self, link, peer, policy, certificate_user)
        opts = self.options
        if address is None:
            address = conn.host
        # One string per address, however many of its clients are connected (it lives as long
        # as they do): an idle connection keeps no copy of its own.
        address = sys.intern(address)
        if opts.max_connections and len(self.connections) >= opts.max_connections:
            self._refuse(conn, f"max_connections ({opts.max_connections}) reached")
            return conn
        per_address = opts.max_connections_per_address
        if per_address is None:
            per_address = 0 if policy.local else PER_ADDRESS_DEFAULT
        if per_address:
            count = self._per_address.get(address, 0)
            if count >= per_address:
                self._refuse(
                    conn, f"max_connections_per_address ({per_address}) reached for {address}"
                )
                return conn
            self._per_address[address] = count + 1
        conn.address = address  # (uncounted without the limit: releasing it is then a no-op)
        self.connections[conn] = None
        return conn

    def _refuse(self, conn: Connection, why: str) -> None:
        stats = self.stats
        stats.refused += 1
        if stats.refused & (stats.refused - 1) == 0:  # 1st, 2nd, 4th, 8th... refusal
            log.warning(
                "connection from %s refused: %s (%d refused so far)", conn.peer, why, stats.refused
            )
        conn.close(publish_will=False)

    # -- sessions ---------------------------------------------------------------------------

    def new_client_id(self) -> str:
        while True:
            client_id = self.options.client_id_prefix + uuid.uuid4().hex[:20]
            if client_id not in self.sessions:
                return client_id

    def attach(
        self,
        conn: Connection,
        client_id: str,
        clean_start: bool,
        expiry: int,
        username: str | None,
    ) -> tuple[Session, bool]:
        """Bind ``conn``, authenticated as ``username``, to the session of ``client_id``: take it
        over from an older connection (MQTT-3.1.4-3), discard it on Clean Start (MQTT-3.1.2-4)
        or resume it (-5, -6). Returns (session, session present).

        A session belongs to the user that created it (None: anonymous). A client of another
        user is refused, or gets a fresh session and the old one is discarded, per
        ``session_owner_mismatch`` and ``allow_takeover_by_other_user``; a client id against
        ``client_id_pattern`` and a new persistent session past ``max_sessions`` or
        ``max_sessions_per_user`` are refused too, and so is a client id reserved for the
        integrations (``$bridge/``, ``$webhook/``). A refusal raises MQTTError before anything
        has changed."""
        self.check_client_id(conn, client_id, username)
        now = self.clock()
        session = self.sessions.get(client_id)
        foreign = session is not None and self.check_owner(session, username)
        if expiry:
            self._check_session_caps(session, username, clean_start or foreign)
        if session is not None and session.connection is not None:
            session.connection.disconnect(
                ReasonCode.SESSION_TAKEN_OVER, "another connection took over the session"
            )
            session = self.sessions.get(client_id)  # gone if its expiry was 0
        if session is not None and (clean_start or foreign):
            if foreign:
                log.warning(
                    "session %s of %s discarded: its client id was taken by %s",
                    client_id,
                    _user(session.username),
                    _user(username),
                )
            self.end_session(session, now)
            session = None
        present = session is not None
        # Back within the first half of its expiry interval (or it never expires): the record
        # the store has would keep the session through a restart as well as a new one.
        early = False
        if session is None:
            session = self.sessions[client_id] = Session(
                client_id, self.options, self.store, self.backlog
            )
            session.username = username
        else:
            if session.will is not None:
                session.will = None  # reconnected before the will delay ran out (MQTT-3.1.3-9)
                session.will_due = None
                self.store.delete_will(session)
            due = session.expires_at
            early = due is None or due - now >= session.expiry_interval / 2
            session.expires_at = None
        if present and not expiry:
            self.store.delete_session(session)  # it ends with this connection now
        session.expiry_interval = expiry
        session.connection = conn
        self._count(session, expiry != 0)
        if expiry:
            self.store.save_session(session, early)
            if conn.will is not None:
                self.store.save_will(session, conn.will, None)
        if self.observers:
            self.notify("client.connected", session)
        return session, present

    def check_client_id(self, conn: Connection, client_id: str, username: str | None) -> None:
        """MQTTError (0x85) if ``client_id`` is not one a client of ``username`` may use: one
        reserved for the integrations, or against ``client_id_pattern`` (the broker's own
        assigned ids exempt). Depends on nothing but the two: a cluster node asks it before
        another node hands the session over (connect.accept)."""
        if client_id.startswith(RESERVED_PREFIXES):  # the integrations' own sessions
            raise MQTTError(
                f"client identifier {client_id!r} is reserved",
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
            )
        if self.options.client_id_pattern and not conn.assigned_id:
            _check_pattern(self.options.client_id_pattern, client_id, username)

    def check_owner(self, session: Session, username: str | None) -> bool:
        """Whether a client of ``username`` taking ``session`` over (the session of its client
        id) takes another user's: MQTTError (0x87) if it may not (``session_owner_mismatch``,
        ``allow_takeover_by_other_user``); True if it may, and that session is then discarded,
        not resumed. A cluster node that has the session asks it for the node the client
        connects to (cluster/node.py, the hand-over)."""
        if session.username == username:
            return False
        opts = self.options
        if session.connection is not None:
            if not opts.allow_takeover_by_other_user:
                raise MQTTError(
                    "client id in use by a connection of another user", ReasonCode.NOT_AUTHORIZED
                )
        elif opts.session_owner_mismatch == "refuse":
            raise MQTTError(
                "client id taken by a session of another user", ReasonCode.NOT_AUTHORIZED
            )
        return True

    def _check_session_caps(
        self, existing: Session | None, username: str | None, replaced: bool
    ) -> None:
        """A persistent session for ``username`` is about to resume ``existing`` (the session
        of its client id now, if any) or, when ``replaced``, to take its place: refuse it if it
        is one too many (``max_sessions``, ``max_sessions_per_user``)."""
        freed = existing is not None and existing.counted
        if freed and not replaced:
            return  # resumed: it is counted already
        opts = self.options
        if opts.max_sessions and self.persistent_sessions - freed >= opts.max_sessions:
            raise MQTTError(
                f"max_sessions ({opts.max_sessions}) reached", ReasonCode.QUOTA_EXCEEDED
            )
        if username is not None and opts.max_sessions_per_user:
            mine = self._user_sessions.get(username, 0)
            if freed and existing is not None and existing.username == username:
                mine -= 1
            if mine >= opts.max_sessions_per_user:
                raise MQTTError(
                    f"max_sessions_per_user ({opts.max_sessions_per_user}) reached for "
                    f"{_user(username)}",
                    ReasonCode.QUOTA_EXCEEDED,
                )

    def _count(self, session: Session, persistent: bool) -> None:
        """Count ``session`` among the persistent sessions (in all and per user), or not."""
        if session.counted == persistent:
            return
        session.counted = persistent
        step = 1 if persistent else -1
        self.persistent_sessions += step
        user = session.username
        if user is not None:
            left = self._user_sessions.get(user, 0) + step
            if left > 0:
                self._user_sessions[user] = left
            else:
                self._user_sessions.pop(user, None)

    def restore(self, restored: Restored) -> None:
        """Build the sessions and retained messages of the previous run from the store's
        records (before any client connects): a session whose client was connected when the
        broker stopped starts its expiry now, and its will is due now (or after its delay).
        :meth:`restored` follows, once the integrations have claimed their sessions."""
        now = self.clock()
        for message in restored.retained:
            self.router.retained.store(message, save=False)
        for record in restored.sessions:
            session = Session(record.client_id, self.options, self.store, self.backlog)
            session.stored = record.stored
            session.username = record.username
            session.expiry_interval = record.expiry_interval
            if record.expires_at is not None:
                session.expires_at = record.expires_at
            elif record.expiry_interval != NEVER:
                session.expires_at = now + record.expiry_interval
            for sub_record in record.subscriptions:
                sub = Subscription(
                    session,
                    sub_record.topic_filter,
                    sub_record.qos,
                    no_local=sub_record.no_local,
                    retain_as_published=sub_record.retain_as_published,
                    retain_handling=sub_record.retain_handling,
                    identifier=sub_record.identifier,
                )
                self.router.subscribe(sub)
                session.add_subscription(sub, save=False)
            for delivery in record.deliveries:
                session.restore_delivery(delivery, now)
            session.restore_releases(record.releases)
            will = record.will
            if will is not None:
                session.will = will
                if record.will_due is not None:
                    session.will_due = record.will_due
                else:  # connected when the broker stopped: the connection is gone now
                    delay = will.properties.get(prop.WILL_DELAY_INTERVAL, 0)
                    session.will_due = now + (delay if record.will_version == MQTT_5 else 0)
            self.sessions[record.client_id] = session
            self.store.save_session(session)  # records the expiry deadline now running

    def restored(self) -> None:
        """The sessions of the previous run are back: count them, and hold their
        subscriptions and queued messages against the rules as they are now (the ACL may have
        changed while the broker was down)."""
        for session in self.sessions.values():
            # An integration's session (bridge, webhook) is the operator's: never counted.
            self._count(session, session.persistent and session.sink is None)
        self.recheck_subscriptions()

    def notify(self, event: str, session: Session) -> None:
        for observer in self.observers:
            observer(event, session)

    def connection_closed(self, conn: Connection, publish_will: bool) -> None:
        self.connections.pop(conn, None)
        self.stats.delivered_closed += conn.output.publishes
        conn.output.publishes = 0
        if conn.address is not None:
            left = self._per_address.get(conn.address, 1) - 1
            if left > 0:
                self._per_address[conn.address] = left
            else:
                self._per_address.pop(conn.address, None)
            conn.address = None
        session = conn.session
        will = conn.will
        conn.will = None
        if session is None or session.connection is not conn:
            return
        if self.observers:
            self.notify("client.disconnected", session)
        session.connection = None
        now = self.clock()
        store = self.store
        persistent = session.persistent
        if will is not None and publish_will:
            delay = (
                will.properties.get(prop.WILL_DELAY_INTERVAL, 0) if conn.version == MQTT_5 else 0
            )
            if delay and persistent:
                session.will = will  # MQTT-3.1.2-8: after the delay, or when the session ends
                session.will_due = now + delay
                store.save_will(session, will, session.will_due)
            else:
                if persistent:
                    store.delete_will(session)
                self.publish_will(will, session, now)
        # else (broker shutting down): a stored will stays armed and is published after the
        # restart, when the client has not come back within its delay.
        if not persistent:
            self.end_session(session, now)
            return
        if session.expiry_interval != NEVER:
            session.expires_at = now + session.expiry_interval
        store.save_session(session)

    def end_session(self, session: Session, now: float) -> None:
        """Remove a session with its subscriptions and queue (MQTT-4.1.0-2); a will still
        waiting out its delay is published now."""
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
            backplane = self.router.backplane
            if backplane is not None:
                backplane.session_ended(session.client_id)
        self._count(session, False)
        self.stats.dropped_ended += session.dropped  # the total dropped never goes down
        session.dropped = 0
        if session.stored:  # a session the store never recorded (clean) costs it nothing
            self.store.delete_session(session)
        for sub in session.subscriptions.values():
            self.router.unsubscribe(sub)
        session.clear_subscriptions()
        self._hand_over_shared(session, now)
        session.queue.clear()
        session.queue_emptied()
        session.inflight.clear()
        if session.will is not None:
            will = session.will
            session.will = session.will_due = None
            self.publish_will(will, session, now)

    def _hand_over_shared(self, session: Session, now: float) -> None:
        """Messages a shared subscription gave to a session that has now ended go to another
        member of the group: queued ones, and QoS 1 ones in flight (section 4.8.2). A QoS 2
        message in flight is not sent to anyone else (MQTT-4.8.2-5)."""
        strategy = self.options.shared_subscription_strategy
        pending = [d for d in session.inflight.values() if d.qos == 1 and not d.released]
        pending.extend(session.queue)
        groups: dict[str, SharedGroup | None] = {}
        for delivery in pending:
            share = delivery.share
            message = delivery.message
            if share is None or message.expired(now):
                continue
            if share in groups:
                group = groups[share]
            else:
                group = groups[share] = self.router.trie.shared_group(share)
            if group is None:  # no member left
                continue
            member = group.pick(strategy, message.topic, "", exclude=session)
            if member is not None and (
                member.read_check is None or member.read_check(message.topic)
            ):  # sent as that member's subscription would have sent it
                ident = member.identifier
                member.session.deliver(
                    message,
                    min(member.qos, message.qos),
                    message.retain and member.retain_as_published,
                    (ident,) if ident else (),
                    now,
                    share,
                )

    def publish_will(self, will: Will, session: Session, now: float) -> None:
        props = will.properties
        expires_at = interval = None
        if props:
            interval = props.get(prop.MESSAGE_EXPIRY_INTERVAL)
            if interval is not None:
                expires_at = now + interval
            props = {k: v for k, v in props.items() if k not in _WILL_NOT_FORWARDED}
        message = Message(
            will.topic,
            will.payload,
            will.qos,
            will.retain,
            props,
            expires_at,
            expiry_interval=interval,
        )
        authorizer = self.authorizer
        if authorizer is not None and not authorizer.can_publish(
            session.client_id, session.username, will.topic
        ):
            log.warning(
                "will of %s not published: not authorized for %r", session.client_id, will.topic
            )
            return
        match = self.router.lookup(will.topic)
        if match is not None:
            log.info("publishing the will of %s on %r", session.client_id, will.topic)
            self.router.publish(message, match, session, now)

    def read_check(self, session: Session, topic_filter: str) -> Callable[[str], bool] | None:
        """What a granted subscription to ``topic_filter`` checks each message's topic with:
        None unless the authorizer denies this client some topic the filter reaches."""
        authorizer = self.authorizer
        if authorizer is None or not authorizer.needs_read_check(
            session.client_id, session.username, topic_filter
        ):
            return None
        return partial(authorizer.can_read, session.client_id, session.username)

    def recheck_subscriptions(self) -> int:
        """After the rules changed (SIGHUP, or while the broker was down): remove the
        subscriptions the authorizer no longer allows, so that a revoked right stops the flow at
        once, and drop the messages queued for a session that it may no longer read. Returns
        how many subscriptions went."""
        authorizer = self.authorizer
        if authorizer is None:
            return 0
        removed = dropped = 0
        for session in list(self.sessions.values()):
            if session.sink is not None:  # an integration's rules are the operator's own
                continue
            client_id = session.client_id
            username = session.username
            for topic_filter, sub in list(session.subscriptions.items()):
                if authorizer.can_subscribe(client_id, username, sub.filter):
                    sub.read_check = self.read_check(session, sub.filter)
                    continue
                session.remove_subscription(topic_filter)
                self.router.unsubscribe(sub)
                removed += 1
                log.warning(
                    "session %s: subscription %r removed: no longer authorized",
                    client_id,
                    topic_filter,
                )
            if session.queue or session.inflight:
                count = session.drop_unreadable(
                    partial(authorizer.can_read, client_id, username), self.clock()
                )
                if count:
                    dropped += count
                    log.warning(
                        "session %s: %d queued messages dropped: no longer authorized to read them",
                        client_id,
                        count,
                    )
        if removed or dropped:
            log.warning(
                "rules rechecked: %d subscriptions removed, %d queued messages dropped",
                removed,
                dropped,
            )
        return removed

    # -- time -------------------------------------------------------------------------------

    def tick(self) -> None:
        """Enforce time: CONNECT timeout, keep alive (MQTT-3.1.2-22), delayed wills, session
        expiry. Called by the edge twice a second."""
        now = self.clock()
        opts = self.options
        self.connection_log.tick(now)
        # Both walks only pick out what is due, and act on it after: closing a connection or
        # ending a session changes the set walked (no copy of it each half second).
        silent: list[Connection] = []
        timed_out: list[Connection] = []
        for conn in self.connections:
            if conn.state in (AWAIT_CONNECT, AUTHENTICATING):
                if now - conn.opened_at > opts.connect_timeout:
                    silent.append(conn)
            elif conn.keep_alive and now - conn.last_received > 1.5 * conn.keep_alive:
                timed_out.append(conn)
        for conn in silent:
            log.info(
                "connection from %s sent no CONNECT in %gs; closing",
                conn.peer,
                opts.connect_timeout,
            )
            conn.close(publish_will=False)
        for conn in timed_out:
            log.info(
                "client %s: keep alive of %ds ran out; closing", conn.client_id, conn.keep_alive
            )
            conn.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep alive timeout")
        due: list[Session] = []
        for session in self.sessions.values():
            drops = session.drops
            if drops is not None and drops.unlogged and now >= drops.log_next:
                session.report_drops(now)  # the rest of a burst of drops
            if session.connection is None and (
                (session.will_due is not None and now >= session.will_due)
                or (session.expires_at is not None and now >= session.expires_at)
            ):
                due.append(session)
        for session in due:
            if session.will_due is not None and now >= session.will_due:
                will = session.will
                session.will = session.will_due = None
                if will is not None:
                    self.store.delete_will(session)
                    self.publish_will(will, session, now)
            if session.expires_at is not None and now >= session.expires_at:
                log.info("session %s expired", session.client_id)
                if self.observers:
                    self.notify("session.expired", session)
                self.end_session(session, now)

    def shutdown(self) -> None:
        """Tell every MQTT 5 client the server is shutting down (0x8B) and close them all."""
        for conn in list(self.connections):
            conn.disconnect(
                ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down", publish_will=False
            )
        self.scheduler.flush()

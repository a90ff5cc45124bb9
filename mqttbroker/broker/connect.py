"""CONNECT, enhanced authentication (AUTH, section 4.12), PINGREQ and DISCONNECT from the client:
who it is, which session it gets, the CONNACK, keep alive, and what ends the connection on its
side. What a CONNECT settled that the connection keeps (the exchange under way, the CONNECT held
while an answer is awaited, the Session Expiry Interval asked for) is its :class:`Login`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, final

from mypy_extensions import mypyc_attr

from ..protocol import fastpath, grammar
from ..protocol import packets as pk
from ..protocol import properties as prop
from ..protocol.errors import MQTTError, ProtocolError
from ..protocol.packets import MQTT_5
from ..protocol.reasons import CONNACK_CODES, ReasonCode, v311_connack_code
from . import publish
from .auth import CONTINUE, SUCCESS, AuthExchange, LoginRequest
from .topics import valid_topic_name

if TYPE_CHECKING:
    from .backplane import Backplane
    from .connection import Connection
    from .core import Broker

log = logging.getLogger("mqttbroker.connection")

# The refusals an MQTT 3.1.1 CONNACK can express (its return codes 1-5); others get no CONNACK.
_V311_REFUSALS = (
    ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
    ReasonCode.BAD_USER_NAME_OR_PASSWORD,
    ReasonCode.NOT_AUTHORIZED,
    ReasonCode.SERVER_UNAVAILABLE,
    ReasonCode.SERVER_BUSY,
    ReasonCode.QUOTA_EXCEEDED,
    ReasonCode.USE_ANOTHER_SERVER,
    ReasonCode.SERVER_MOVED,
)


# Distinct ClientLimits a broker shares between its clients, at most: beyond them (clients that
# each ask for something else), a client's are its own.
SHARED_LIMITS: Final = 64


@final
@mypyc_attr(acyclic=True)
class ClientLimits:
    """What a client's CONNECT asked of what it is sent, fixed for its connection: its Receive
    Maximum (capped by max_inflight), Maximum Packet Size, Topic Alias Maximum and Request
    Problem Information. Clients that ask the same share one (most ask for nothing: the
    defaults), where four fields of each connection took 32 bytes."""

    __slots__ = ("send_quota", "max_send_size", "alias_maximum", "problem_info")

    def __init__(
        self, send_quota: int, max_send_size: int, alias_maximum: int, problem_info: bool
    ) -> None:
        self.send_quota = send_quota
        self.max_send_size = max_send_size
        self.alias_maximum = alias_maximum
        self.problem_info = problem_info


# Before its CONNECT is read: what a refusal may be sent as (no limit of the client's yet).
NO_LIMITS: Final = ClientLimits(65535, 268_435_460, 0, True)


def client_limits(broker: Broker, props: dict[int, Any], v5: bool) -> ClientLimits:
    """The ClientLimits of a CONNECT with properties ``props``: shared with the clients that
    asked the same, up to SHARED_LIMITS distinct ones."""
    key = (
        min(props.get(prop.RECEIVE_MAXIMUM, 65535), broker.options.max_inflight),
        props.get(prop.MAXIMUM_PACKET_SIZE, 268_435_460),
        props.get(prop.TOPIC_ALIAS_MAXIMUM, 0) if v5 else 0,
        props.get(prop.REQUEST_PROBLEM_INFORMATION, 1) == 1,
    )
    shared = broker.client_limits
    limits = shared.get(key)
    if limits is None:
        limits = ClientLimits(key[0], key[1], key[2], key[3])
        if len(shared) < SHARED_LIMITS:
            shared[key] = limits
    return limits


@final
class Login:
    """How a connection's client proved who it is, and what its CONNECT settled for later."""

    __slots__ = (
        "certificate_user",
        "exchange",
        "method",
        "held",
        "expiry",
        "assigned_id",
        "claimed",
    )

    def __init__(self, certificate_user: str | None = None) -> None:
        # The user name a client certificate the listener verified gives (mutual TLS with
        # tls_certificate_username): then the credential that counts.
        self.certificate_user = certificate_user
        self.exchange: AuthExchange | None = None  # an enhanced-authentication exchange
        self.method: str | None = None  # its Authentication Method (re-authentication too)
        self.held: pk.Connect | None = None  # the CONNECT, while its answer is awaited
        self.expiry = 0  # the Session Expiry Interval CONNECT set (DISCONNECT may not raise 0)
        self.assigned_id = False  # the broker chose the client id
        self.claimed = False  # in a cluster: the client id is this node's now


def _login(conn: Connection) -> Login:
    login = conn.login
    if login is None:
        login = conn.login = Login()
    return login


def on_connect(conn: Connection, packet: pk.Connect) -> None:
    """Check a CONNECT; accept it at once, or after an enhanced-authentication exchange."""
    broker = conn.broker
    broker.stats.connects += 1
    opts = broker.options
    conn.version = version = packet.protocol_level
    v5 = version == MQTT_5
    props = packet.properties
    conn.limits = client_limits(broker, props, v5)
    if not packet.client_id:
        if not v5 and not packet.clean_start:
            raise MQTTError(
                "empty client id with a persistent session",
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
            )  # 3.1.1 MQTT-3.1.3-8
        _login(conn).assigned_id = True
        packet.client_id = broker.new_client_id()  # MQTT-3.1.3-6, -7
    conn.client_id = packet.client_id
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
        if will.properties.get(prop.PAYLOAD_FORMAT_INDICATOR) == 1:
            publish.check_utf8_payload(will.payload)
    if opts.server_reference:
        moved = ReasonCode.SERVER_MOVED if opts.server_moved else ReasonCode.USE_ANOTHER_SERVER
        raise MQTTError("redirected to " + opts.server_reference, moved)
    method = props.get(prop.AUTHENTICATION_METHOD)
    if prop.AUTHENTICATION_DATA in props and method is None:
        raise ProtocolError("Authentication Data without an Authentication Method")
    certificate_user = conn.certificate_user
    if certificate_user is not None:
        # A client certificate the listener verified is the credential; its name is the
        # user name (mutual TLS with tls_certificate_username).
        packet.username = certificate_user
    conn.username = packet.username  # as claimed, for the log until CONNACK says more
    if certificate_user is None and method is None:
        anonymous = conn.policy.allow_anonymous
        if packet.username is None and packet.password is None and anonymous is not None:
            if not anonymous:  # this listener's own rule
                raise MQTTError(
                    "anonymous access refused on this listener", ReasonCode.NOT_AUTHORIZED
                )
        elif broker.offload is not None:
            # Hashing a password takes milliseconds, an HTTP service longer: checked by the
            # edge while this connection waits (state AUTHENTICATING, input held) for the
            # answer, conn.password_checked.
            _login(conn).held = packet
            conn.authenticate(wait=True)
            broker.offload(conn, packet, anonymous)
            return
        else:
            code = broker.authenticator.check_password(
                LoginRequest(
                    packet.client_id, packet.username, packet.password, anonymous, conn.address
                )
            )
            if code:
                raise MQTTError("authentication failed", code)
    if method is None:
        accept(conn, packet, None)
        return
    exchange = broker.authenticator.exchange(
        method, packet.client_id, packet.username, conn.address
    )
    if exchange is None:
        raise MQTTError(
            f"authentication method {method!r} not supported",
            ReasonCode.BAD_AUTHENTICATION_METHOD,
        )  # MQTT-4.12.0-1
    login = _login(conn)
    login.exchange = exchange
    login.method = method
    login.held = packet
    conn.authenticate(wait=False)
    auth_step(conn, props.get(prop.AUTHENTICATION_DATA))


def auth_step(conn: Connection, data: bytes | None) -> None:
    """Run one step of the enhanced-authentication exchange (section 4.12)."""
    login = conn.login
    assert login is not None and login.exchange is not None
    outcome = login.exchange.step(data)
    auth_props: dict[int, Any] = {prop.AUTHENTICATION_METHOD: login.method}
    if outcome.data is not None:
        auth_props[prop.AUTHENTICATION_DATA] = outcome.data
    if outcome.status == CONTINUE:  # MQTT-4.12.0-2, -5
        conn.send(grammar.encode(pk.Auth(ReasonCode.CONTINUE_AUTHENTICATION, auth_props)))
        return
    login.exchange = None
    if outcome.status != SUCCESS:
        raise MQTTError("authentication failed", outcome.reason_code)  # MQTT-4.12.0-4
    if not conn.connected:
        packet = login.held
        assert packet is not None
        login.held = None
        if outcome.username is not None:
            packet.username = outcome.username
        accept(conn, packet, auth_props)
    else:  # re-authentication succeeded
        if outcome.username is not None and outcome.username != conn.username:
            raise MQTTError("re-authenticated as another user", ReasonCode.NOT_AUTHORIZED)
        conn.send(grammar.encode(pk.Auth(ReasonCode.SUCCESS, auth_props)))
        log.info("client %s re-authenticated", conn.client_id)


def on_auth(conn: Connection, packet: pk.Auth) -> None:
    method = packet.properties.get(prop.AUTHENTICATION_METHOD)
    login = conn.login
    if login is None or login.method is None:
        raise ProtocolError("AUTH without an Authentication Method in CONNECT")  # 4.12.0-7
    if method != login.method:
        raise ProtocolError("AUTH with another Authentication Method")  # MQTT-4.12.1-1
    code = packet.reason_code
    if conn.connected and code == ReasonCode.RE_AUTHENTICATE and login.exchange is None:
        exchange = conn.broker.authenticator.exchange(
            method, conn.client_id, conn.username, conn.address
        )
        if exchange is None:
            raise MQTTError("re-authentication refused", ReasonCode.NOT_AUTHORIZED)
        login.exchange = exchange
    elif code != ReasonCode.CONTINUE_AUTHENTICATION or login.exchange is None:
        raise ProtocolError(f"unexpected AUTH reason code 0x{code:02X}")
    auth_step(conn, packet.properties.get(prop.AUTHENTICATION_DATA))


def _claim(
    conn: Connection,
    packet: pk.Connect,
    auth_props: dict[int, Any] | None,
    backplane: Backplane,
) -> None:
    """A cluster node first takes the client id over (see accept); not a closure in accept,
    for the same reason."""
    _login(conn).claimed = True
    conn.authenticate(wait=True)
    backplane.claim(
        packet.client_id,
        packet.clean_start,
        packet.username,
        lambda refusal: _claimed(conn, packet, auth_props, refusal),
    )


def _claimed(
    conn: Connection,
    packet: pk.Connect,
    auth_props: dict[int, Any] | None,
    refusal: MQTTError | None,
) -> None:
    """The claim's answer: go on with the CONNECT, or refuse it as the node that has the
    session (another user's) did."""
    if refusal is None:
        conn.claim_done(packet, auth_props)
    else:
        conn.claim_refused(refusal)


def accept(conn: Connection, packet: pk.Connect, auth_props: dict[int, Any] | None) -> None:
    """The client is who it says: take over or create its session and send CONNACK."""
    broker = conn.broker
    backplane = broker.router.backplane
    login = conn.login
    if backplane is not None and (login is None or not login.claimed):
        # A cluster node first takes the client id over: its session may be on another
        # node, which hands it over (or refuses to: another user's session, checked there).
        # The CONNECT waits (input held) until then. What needs no session is checked
        # first, so that a client refused for it moves nothing.
        broker.check_client_id(conn, packet.client_id, packet.username)
        _claim(conn, packet, auth_props, backplane)
        return
    opts = broker.options
    version = conn.version
    v5 = version == MQTT_5
    props = packet.properties
    client_id = packet.client_id
    keep_alive = packet.keep_alive
    server_keep_alive = None
    if opts.max_keepalive and (keep_alive == 0 or keep_alive > opts.max_keepalive):
        keep_alive = server_keep_alive = opts.max_keepalive
    conn.keep_alive = keep_alive
    if v5:
        requested = props.get(prop.SESSION_EXPIRY_INTERVAL, 0)
    else:
        requested = 0 if packet.clean_start else 0xFFFFFFFF
    expiry = min(requested, opts.max_session_expiry)
    if expiry:
        _login(conn).expiry = expiry
    conn.will = packet.will
    session, present = broker.attach(conn, client_id, packet.clean_start, expiry, packet.username)
    # The session's own copy of the id (the same text), so that a resumed session's connection
    # keeps no second one: the CONNECT's goes with the packet.
    conn.client_id = session.client_id
    conn.username = packet.username
    conn.attach(session)
    if v5:
        extra: dict[int, Any] = {}
        if conn.assigned_id:
            extra[prop.ASSIGNED_CLIENT_IDENTIFIER] = client_id  # MQTT-3.2.2-16
        if server_keep_alive is not None:
            extra[prop.SERVER_KEEP_ALIVE] = server_keep_alive
        if expiry != requested:
            extra[prop.SESSION_EXPIRY_INTERVAL] = expiry
        if opts.response_information and props.get(prop.REQUEST_RESPONSE_INFORMATION):
            extra[prop.RESPONSE_INFORMATION] = opts.response_information.replace(
                "%c", client_id
            )  # absent unless requested: MQTT-3.1.2-28
        if auth_props:
            extra.update(auth_props)  # MQTT-4.12.0-5
        if extra:
            ack_props = {**broker.connack_properties, **extra}
            conn.send(fastpath.encode_connack(pk.Connack(present, 0, ack_props), MQTT_5))
        else:  # the usual answer, encoded once by the broker
            conn.send(broker.connack_v5[present])
    else:
        conn.send(fastpath.encode_connack(pk.Connack(present, 0), version))
    now = broker.clock()
    broker.connection_log.connected(
        now,
        client_id,
        conn.peer,
        "5.0" if v5 else "3.1.1" if version == 4 else "3.1",
        conn.policy.kind.removeprefix("MQTT over "),  # TCP, TLS, WebSocket, WebSocket+TLS
        conn.username,
        keep_alive,
        present,
    )
    session.resend(now)


def on_disconnect(conn: Connection, packet: pk.Disconnect) -> None:
    """DISCONNECT from the client: its Session Expiry Interval may change (not from 0), and
    only a normal disconnection discards the will. Before CONNACK: it gave up authenticating."""
    if not conn.connected:
        log.info("client %s from %s gave up authenticating", conn.client_id, conn.peer)
        conn.close(publish_will=False)
        return
    session = conn.session
    assert session is not None
    expiry = packet.properties.get(prop.SESSION_EXPIRY_INTERVAL)
    if expiry is not None:
        login = conn.login
        if (login is None or login.expiry == 0) and expiry != 0:
            raise ProtocolError("Session Expiry Interval set on DISCONNECT after CONNECT had 0")
        session.expiry_interval = min(expiry, conn.broker.options.max_session_expiry)
    # Only a normal disconnection (0x00) discards the will (MQTT-3.1.2-8, -10, 3.14.4-3);
    # 0x04 asks for it, and so does any error code.
    keep_will = packet.reason_code != ReasonCode.NORMAL_DISCONNECTION
    if not keep_will and conn.will is not None:
        conn.will = None  # MQTT-3.14.4-3
        if session.persistent:
            conn.broker.store.delete_will(session)
    broker = conn.broker
    broker.connection_log.disconnected(broker.clock(), conn.client_id, packet.reason_code)
    conn.close()


def on_pingreq(conn: Connection, packet: pk.Pingreq) -> None:
    conn.send(fastpath.PINGRESP)  # MQTT-3.12.4-1


def refuse(conn: Connection, code: int, reason: str) -> None:
    """Refuse the connection before CONNACK (called by Connection.fail, which closes it): a
    CONNACK with ``code`` if the client's version has one for it. MQTT 5: any CONNACK reason
    code, with a Reason String (left out when the client's Maximum Packet Size would not take
    it, MQTT-3.2.2-19) and the Server Reference of a redirection; 3.1.1: the return code
    nearest to it, for the refusals 3.1.1 can express; otherwise nothing is sent."""
    if conn.version == MQTT_5:
        if code not in CONNACK_CODES:
            return
        props: dict[int, Any] = {prop.REASON_STRING: reason} if reason else {}
        if code in (ReasonCode.USE_ANOTHER_SERVER, ReasonCode.SERVER_MOVED):
            props[prop.SERVER_REFERENCE] = conn.broker.options.server_reference
        data = fastpath.encode_connack(pk.Connack(False, code, props), MQTT_5)
        if len(data) > conn.limits.max_send_size:
            data = fastpath.encode_connack(pk.Connack(False, code), MQTT_5)
        conn.send(data)
    elif code in _V311_REFUSALS:
        conn.send(fastpath.encode_connack(pk.Connack(False, v311_connack_code(code)), conn.version))

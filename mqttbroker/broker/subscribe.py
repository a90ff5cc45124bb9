"""SUBSCRIBE and UNSUBSCRIBE from the client, and the retained messages a new subscription gets:
sent after the SUBACK, a share per event-loop pass, while the client reads (the transport under
its high-water mark)."""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from ..protocol import fastpath
from ..protocol import packets as pk
from ..protocol import properties as prop
from ..protocol.errors import MQTTError, ProtocolError
from ..protocol.packets import MQTT_5
from ..protocol.reasons import ReasonCode
from .topics import Subscription, parse_shared, valid_topic_filter

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("mqttbroker.connection")

# Bytes of retained messages sent for new subscriptions per connection and loop pass.
RETAINED_PER_PASS = 1_048_576
# Bytes of retained messages a later pass buffers before it writes them to the transport: the
# transport says pause_writing from within the write that takes it past its high-water mark,
# and the replay stops there, within one message and this much of the mark. It is also the
# share sent with the SUBACK, which is written at the pass's end. Written only at the pass's
# end, a whole share of a pass would go past the mark for every client that does not read.
REPLAY_WRITE = 65_536

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


def on_subscribe(conn: Connection, packet: pk.Subscribe) -> None:
    """SUBSCRIBE: each filter checked (syntax, limits, features, the authorizer, quotas) and
    granted or refused in the SUBACK; then the retained messages of the new subscriptions."""
    broker = conn.broker
    opts = broker.options
    session = conn.session
    assert session is not None
    v5 = conn.version == MQTT_5
    identifier = packet.properties.get(prop.SUBSCRIPTION_IDENTIFIER)
    if identifier is not None and not opts.subscription_identifiers:
        raise MQTTError(
            "subscription identifiers are not supported",
            ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
        )
    if getattr(broker.authorizer, "ask_subscribe", None) is not None:  # http_auth's
        conn.ask_subscribe_rights(packet)  # may make the packet wait, before any change
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
            conn.client_id, conn.username, inner
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
        size = session.subscription_growth(topic_filter)
        if (
            opts.max_subscription_bytes
            and session.subscription_bytes + size > opts.max_subscription_bytes
        ):
            log.info(
                "client %s: max_subscription_bytes (%d) reached",
                conn.client_id,
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
        session.add_subscription(sub)
        codes.append(qos)
        new_subs.append((sub, existed))
    if denied is not None:  # one line per packet (its first refused filter), however many
        conn.log_denied("subscribe to", denied)
    if over:
        log.info(
            "client %s: max_subscriptions_per_client (%d) reached: %d filter(s) refused",
            conn.client_id,
            opts.max_subscriptions_per_client,
            over,
        )
    suback = pk.Suback(packet.packet_id, codes)
    conn.send(_encode_explained(conn, suback, [r.topic_filter for r in packet.subscriptions]))
    now = broker.clock()
    retained = broker.router.retained
    for sub, existed in new_subs:
        # Retained messages after the SUBACK, per Retain Handling; never on a shared
        # subscription (MQTT-3.3.1-9, -10, -11; 4.8.2). A filter without wildcards has one
        # topic: nothing to go through when it has no retained message (most subscriptions).
        if sub.share_group is None and (
            sub.retain_handling == 0 or (sub.retain_handling == 1 and not existed)
        ):
            topic_filter = sub.filter
            if "+" not in topic_filter and "#" not in topic_filter:
                if retained.get(topic_filter) is None:
                    continue
            if conn.retained is None:
                conn.retained = deque()
            conn.retained.append((sub, retained.match(topic_filter, now)))
    if conn.retained:
        # Not written before the pass's end: the SUBACK may wait for the store to commit this
        # input (Connection.hold_output, after the packet).
        send_retained(conn, False)


def send_retained(conn: Connection, write: bool = True) -> None:
    """Send retained messages for new subscriptions, within this loop pass's input budget
    and up to ``RETAINED_PER_PASS`` bytes; the rest in later passes, while the client reads
    (none while its output is paused). Input waits meanwhile: SUBSCRIBEs from a client
    that does not read cannot pile up copies of the retained set. ``write`` (a later pass):
    written to the transport every ``REPLAY_WRITE`` bytes (output held for the store stays
    held), so that a client that does not read is held at most the transport's high-water
    mark, one message and ``REPLAY_WRITE`` bytes; else (with the SUBACK) ``REPLAY_WRITE`` bytes
    and one message at most, written at the pass's end."""
    backlog = conn.retained
    session = conn.session
    assert backlog is not None and session is not None
    broker = conn.broker
    framing = conn.input
    framing.begin_pass(broker.scheduler.passes)  # the budget is per event-loop pass
    output = conn.output
    budget = broker.options.input_budget
    authorizer = broker.authorizer
    now = broker.clock()
    sent = 0
    unwritten = 0  # bytes delivered since the last write to the transport
    limit = RETAINED_PER_PASS if write else REPLAY_WRITE
    while backlog and not output.paused and framing.work < budget and sent < limit:
        sub, messages = backlog[0]
        message = next(messages, None)
        if message is None or session.subscriptions.get(sub.topic_filter) is not sub:
            backlog.popleft()  # done, or unsubscribed meanwhile (MQTT-3.10.4-2)
            continue
        framing.work += 1
        if authorizer is not None and not authorizer.can_read(
            session.client_id, session.username, message.topic
        ):
            continue
        ident = sub.identifier
        session.deliver(message, min(sub.qos, message.qos), True, (ident,) if ident else (), now)
        size = message.size
        sent += size
        if write:
            unwritten += size
            if unwritten >= REPLAY_WRITE:
                unwritten = 0
                conn.flush()  # past the high-water mark: pause_writing ends the loop
    if backlog:  # more in the next pass (or once the output drained); input waits
        framing.work = budget
        framing.pause(conn.link)
        if not output.paused:
            broker.scheduler.defer(conn)
    else:
        conn.retained = None  # an empty deque still takes 760 bytes


def on_unsubscribe(conn: Connection, packet: pk.Unsubscribe) -> None:
    """UNSUBSCRIBE: filters compared literally; UNSUBACK (with reason codes in MQTT 5). An
    authorizer with ``can_unsubscribe`` (the dynamic security's unsubscribe ACLs) may refuse
    a filter, as Mosquitto does: the subscription stays, 0x87 in MQTT 5 (MQTT 3.1.1's UNSUBACK
    has no codes). Other authorizers have no such method and cost nothing here."""
    session = conn.session
    assert session is not None
    codes: list[int] = []
    check = getattr(conn.broker.authorizer, "can_unsubscribe", None)
    denied: str | None = None  # the first filter the authorizer refused
    for topic_filter in packet.topic_filters:
        if check is not None and not check(conn.client_id, conn.username, _unshared(topic_filter)):
            if denied is None:
                denied = topic_filter
            codes.append(ReasonCode.NOT_AUTHORIZED)
            continue
        sub = session.remove_subscription(topic_filter)  # literal compare, MQTT-3.10.4-1
        if sub is not None:
            conn.broker.router.unsubscribe(sub)
            codes.append(ReasonCode.SUCCESS)
        else:
            codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
    if denied is not None:  # one line per packet, as for SUBSCRIBE
        conn.log_denied("unsubscribe from", denied)
    if conn.version != MQTT_5:
        codes = []
    unsuback = pk.Unsuback(packet.packet_id, codes)
    conn.send(_encode_explained(conn, unsuback, packet.topic_filters))


def _unshared(topic_filter: str) -> str:
    """The filter an authorizer is asked about: a shared subscription's own filter (as for
    SUBSCRIBE); a filter that is not valid as such, as written."""
    try:
        shared = parse_shared(topic_filter)
    except ValueError:
        return topic_filter
    return shared[1] if shared else topic_filter


def _encode_explained(conn: Connection, ack: pk.Suback | pk.Unsuback, filters: list[str]) -> bytes:
    """A SUBACK or UNSUBACK; in MQTT 5, when it refuses a filter (or UNSUBACK finds none), a
    Reason String naming each such filter and why, unless the client asked for none
    (MQTT-3.1.2-29) or it would exceed the client's Maximum Packet Size (MQTT-3.9.2-1,
    MQTT-3.11.2-1)."""
    codes = ack.reason_codes
    if conn.version == MQTT_5 and conn.limits.problem_info and any(c in _REFUSAL for c in codes):
        refused = [
            f"{topic_filter!r}: {_REFUSAL[code]}"
            for topic_filter, code in zip(filters, codes, strict=True)
            if code in _REFUSAL
        ]
        ack.properties[prop.REASON_STRING] = "; ".join(refused)[:_REASON_MAX]
        data = fastpath.encode_suback(ack, MQTT_5)
        if len(data) <= conn.limits.max_send_size:
            return data
        ack.properties.clear()
    return fastpath.encode_suback(ack, conn.version)

"""The JSON API under ``/api/v1`` (described by ``openapi.json`` beside this file).

Every listing is paged: ``limit`` (at most MAX_LIMIT) items, and ``next_cursor`` to ask for the
next page with (``cursor``). A request examines at most ``paging.SCAN_LIMIT`` entries, so that
none holds the event loop for a walk over everything, however sparse its filter: a page may
then have fewer items than asked, and a cursor to go on. The sessions sorted by oldest queued
age are those of ``Broker.backlog`` (the sessions with queued messages), never all of them.
Inputs are checked and refused with a 4xx JSON body ``{"error": ..., "status": ...}``.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from aiohttp import web

from .. import __version__
from ..broker.connection import Connection
from ..broker.core import Broker
from ..broker.message import Message
from ..broker.session import Session
from ..broker.state import CONNECTED
from ..broker.topics import SharedGroup, Subscription, valid_topic_filter, valid_topic_name
from ..protocol.packets import MQTT_5
from ..protocol.properties import PropertyId as Prop
from ..protocol.reasons import ReasonCode
from .alerts import Survey, oldest_queued_age
from .paging import format_cursor, parse_cursor, scan, scan_tree

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100
PREVIEW_BYTES = 256
MAX_BODY = 1_048_576
API_CLIENT_ID = "admin-api"  # the client id ACL patterns see for messages the API publishes

T = TypeVar("T")


class ApiError(Exception):
    """A 4xx answer with a JSON body (the admin server's middleware renders it)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}

    def response(self) -> web.Response:
        response = web.json_response(
            {"error": self.message, "status": self.status}, status=self.status
        )
        response.headers.update(self.headers)
        return response


def _int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, f"{name}: expected an integer, got {text[:40]!r}") from None
    if not low <= value <= high:
        raise ApiError(400, f"{name}: must be between {low} and {high}")
    return value


def _limit(request: web.Request) -> int:
    return _int(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)


def _cursor(request: web.Request, parts: int | None = None) -> list[int]:
    """The ``cursor`` of a previous page's ``next_cursor`` ([]: the first page); ``parts``: the
    number of integers this listing's cursors have, when fixed."""
    text = request.query.get("cursor")
    if text is None:
        return []
    try:
        cursor = parse_cursor(text)
    except ValueError:
        cursor = []
    if not cursor or (parts is not None and len(cursor) != parts):
        raise ApiError(400, f"cursor: not a cursor of this listing: {text[:80]!r}")
    return cursor


def _page(
    request: web.Request, found: tuple[list[T], list[int] | None], render: Callable[[T], Any]
) -> web.Response:
    items, cursor = found
    return web.json_response(
        {
            "items": [render(item) for item in items],
            "limit": _limit(request),
            "next_cursor": format_cursor(cursor),
        }
    )


def _tree_page(
    request: web.Request,
    root: Any,
    items_at: Callable[[Any], Iterable[T]],
    keep: Callable[[T], bool],
    render: Callable[[T], Any],
) -> web.Response:
    """A page of the items of a topic tree (subscriptions, shared groups, retained messages)
    under the ``filter`` parameter, from the ``cursor`` on: ``items_at(node)``, those ``keep``
    accepts, as ``render`` shows them."""
    levels = _levels(request)
    found = scan_tree(root, levels, _cursor(request), items_at, keep, _limit(request))
    return _page(request, found, render)


def _levels(request: web.Request) -> list[str]:
    """The levels of the ``filter`` parameter (``#`` when absent)."""
    value = request.query.get("filter", "#")
    if not valid_topic_filter(value):
        raise ApiError(400, f"filter: not a valid topic filter: {value[:80]!r}")
    return value.split("/")


def _protocol(conn: Connection) -> str:
    return "MQTT 5" if conn.version == MQTT_5 else "MQTT 3.1.1"


class Api:
    """The handlers of /api/v1."""

    def __init__(
        self,
        broker: Broker,
        survey: Survey,
        websockets: list[dict[str, Any]],
        history: Callable[[], list[dict[str, float]]],
    ) -> None:
        self.broker = broker
        self.survey = survey
        self.websockets = websockets
        self.history = history
        self.started = time.time()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/v1/overview", self.overview),
            web.get("/api/v1/clients", self.clients),
            web.get("/api/v1/clients/{client_id}", self.client),
            web.post("/api/v1/clients/{client_id}/kick", self.kick),
            web.get("/api/v1/sessions", self.sessions),
            web.get("/api/v1/sessions/{client_id}", self.session),
            web.delete("/api/v1/sessions/{client_id}", self.delete_session),
            web.get("/api/v1/subscriptions", self.subscriptions),
            web.get("/api/v1/shared", self.shared),
            web.get("/api/v1/retained", self.retained),
            web.delete("/api/v1/retained", self.delete_retained),
            web.post("/api/v1/publish", self.publish),
        ]

    # -- helpers ----------------------------------------------------------------------------

    def _wall(self, at: float) -> float:
        """A broker clock reading as a Unix time."""
        return round(time.time() - (self.broker.clock() - at), 3)

    def _session_of(self, request: web.Request) -> Session:
        client_id = request.match_info["client_id"]
        session = self.broker.sessions.get(client_id)
        if session is None:
            raise ApiError(404, f"no session with client id {client_id[:80]!r}")
        return session

    def _connected(self, request: web.Request) -> Connection:
        conn = self._session_of(request).connection
        if conn is None or conn.state != CONNECTED:
            client_id = request.match_info["client_id"]
            raise ApiError(404, f"client {client_id[:80]!r} is not connected")
        return conn

    def _backlog(self, session: Session, now: float) -> dict[str, Any]:
        age = oldest_queued_age(session, now)
        threshold = self.survey.threshold
        return {
            "queued": len(session.queue),
            "queued_bytes": session.queued_bytes,
            "inflight": len(session.inflight),
            "oldest_queued_age": round(age, 3),
            "stuck": bool(threshold) and age > threshold,
            "dropped": session.dropped,
        }

    def _render_client(self, conn: Connection) -> dict[str, Any]:
        now = self.broker.clock()
        session = conn.session
        item: dict[str, Any] = {
            "client_id": conn.client_id,
            "protocol": _protocol(conn),
            "address": conn.peer,
            "listener": self.survey.listener_name(getattr(conn.link, "listener", None)),
            "user": conn.username,
            "keep_alive": conn.keep_alive,
            "connected_since": self._wall(conn.opened_at),
            "messages_received": conn.input.publishes,
            "messages_sent": conn.output.publishes,
            "bytes_received": conn.input.received,
            "bytes_sent": conn.output.sent,
            "subscriptions": sorted(session.subscriptions) if session is not None else [],
        }
        if session is not None:
            item.update(self._backlog(session, now))
        return item

    def _render_session(self, session: Session) -> dict[str, Any]:
        now = self.broker.clock()
        item: dict[str, Any] = {
            "client_id": session.client_id,
            "online": session.connection is not None,
            "user": session.username,
            "expiry_interval": session.expiry_interval,
            "expires_at": None if session.expires_at is None else self._wall(session.expires_at),
            "subscriptions": [
                {"filter": name, "qos": sub.qos} for name, sub in session.subscriptions.items()
            ],
        }
        item.update(self._backlog(session, now))
        return item

    # -- handlers ---------------------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        broker = self.broker
        figures = self.survey.current()
        snap = broker.stats.snapshot(broker.connections, figures.census.dropped)
        times = getattr(broker.store, "commit_times", None)
        return web.json_response(
            {
                "version": __version__,
                "started": round(self.started, 3),
                "connections": sum(figures.census.connections.values()),
                "connections_by_listener": figures.census.connections,
                "sessions_online": figures.census.sessions_online,
                "sessions_offline": figures.census.sessions_offline,
                "subscriptions": broker.router.trie.count,
                "retained": len(broker.router.retained),
                "queued": figures.queued,
                "inflight": figures.census.inflight,
                "oldest_queued_age": round(figures.oldest_age, 3),
                "stuck_sessions": sorted(figures.stuck),
                "alert_threshold": self.survey.threshold,
                "messages_received": snap.received,
                "messages_received_by_qos": {
                    str(qos): count for qos, count in enumerate(snap.received_by_qos)
                },
                "messages_delivered": snap.delivered,
                "messages_dropped": snap.dropped,
                "bytes_received": snap.bytes_received,
                "bytes_sent": snap.bytes_sent,
                "connections_refused": snap.refusals_by_reason(),
                "store_commits": times.count if times is not None else 0,
                "store_commit_seconds": round(times.total, 6) if times is not None else 0.0,
                "websocket_listeners": self.websockets,
                "history": self.history(),
            }
        )

    async def clients(self, request: web.Request) -> web.Response:
        prefix = request.query.get("client_id", "")
        user = request.query.get("user")
        address = request.query.get("address", "")

        def wanted(conn: Connection) -> bool:
            return (
                conn.state == CONNECTED
                and conn.client_id.startswith(prefix)
                and (user is None or conn.username == user)
                and conn.peer.startswith(address)
            )

        start = _cursor(request, 1)
        found = scan(self.broker.connections, wanted, start[0] if start else 0, _limit(request))
        return _page(request, found, self._render_client)

    async def client(self, request: web.Request) -> web.Response:
        return web.json_response(self._render_client(self._connected(request)))

    async def kick(self, request: web.Request) -> web.Response:
        conn = self._connected(request)
        conn.disconnect(ReasonCode.ADMINISTRATIVE_ACTION, "disconnected through the admin API")
        request["audit"] = f"client {conn.client_id!r} disconnected (0x98)"
        return web.json_response({"client_id": conn.client_id, "disconnected": True})

    async def sessions(self, request: web.Request) -> web.Response:
        prefix = request.query.get("client_id", "")
        sort = request.query.get("sort", "")
        if sort not in ("", "oldest_queued_age"):
            raise ApiError(400, 'sort: expected "oldest_queued_age" or nothing')
        start = _cursor(request, 1)
        first = start[0] if start else 0
        limit = _int(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        if not sort:

            def wanted(session: Session) -> bool:
                return session.client_id.startswith(prefix)

            found = scan(self.broker.sessions.values(), wanted, first, limit)
            return _page(request, found, self._render_session)
        waiting = [s for s in self.broker.backlog if s.client_id.startswith(prefix)]
        waiting.sort(key=lambda s: s.queue[0].queued_at)  # the oldest first
        end = first + limit
        more = [end] if end < len(waiting) else None
        return _page(request, (waiting[first:end], more), self._render_session)

    async def session(self, request: web.Request) -> web.Response:
        return web.json_response(self._render_session(self._session_of(request)))

    async def delete_session(self, request: web.Request) -> web.Response:
        session = self._session_of(request)
        conn = session.connection
        if conn is not None:
            conn.disconnect(
                ReasonCode.ADMINISTRATIVE_ACTION, "session deleted through the admin API"
            )
        broker = self.broker
        if broker.sessions.get(session.client_id) is session:  # a persistent one outlives it
            broker.end_session(session, broker.clock())
        online = " (it was connected: disconnected with 0x98)" if conn is not None else ""
        request["audit"] = f"session {session.client_id!r} deleted{online}"
        return web.json_response({"client_id": session.client_id, "deleted": True})

    async def subscriptions(self, request: web.Request) -> web.Response:
        def render(sub: Subscription) -> dict[str, Any]:
            return {
                "client_id": sub.session.client_id,
                "filter": sub.topic_filter,
                "qos": sub.qos,
                "share_group": sub.share_group,
                "no_local": sub.no_local,
                "retain_as_published": sub.retain_as_published,
                "identifier": sub.identifier or None,
            }

        def subs(node: Any) -> itertools.chain[Subscription]:
            groups = (group.members for group in (node.groups or {}).values())
            own = (node.subs or {}).values()
            return itertools.chain(own, itertools.chain.from_iterable(groups))

        return _tree_page(request, self.broker.router.trie.root, subs, _everything, render)

    async def shared(self, request: web.Request) -> web.Response:
        now = self.broker.clock()

        def render(group: SharedGroup) -> dict[str, Any]:
            members = group.members
            return {
                "filter": members[0].topic_filter if members else group.name,
                "group": group.name,
                "members": [
                    {
                        "client_id": sub.session.client_id,
                        "online": sub.session.connection is not None,
                        **self._backlog(sub.session, now),
                    }
                    for sub in members
                ],
            }

        def groups(node: Any) -> Any:
            return (node.groups or {}).values()

        return _tree_page(request, self.broker.router.trie.root, groups, _everything, render)

    async def retained(self, request: web.Request) -> web.Response:
        now = self.broker.clock()

        def render(message: Message) -> dict[str, Any]:
            preview = message.payload[:PREVIEW_BYTES]
            try:
                text, encoding = preview.decode(), "utf-8"
            except UnicodeDecodeError:
                text, encoding = base64.b64encode(preview).decode(), "base64"
            return {
                "topic": message.topic,
                "qos": message.qos,
                "size": len(message.payload),
                "payload_preview": text,
                "preview_encoding": encoding,
                "truncated": len(message.payload) > PREVIEW_BYTES,
                "expires_in": message.remaining_expiry(now),
            }

        def message(node: Any) -> tuple[Message, ...]:
            return () if node.message is None else (node.message,)

        def live(message: Message) -> bool:
            return not message.expired(now)

        return _tree_page(request, self.broker.router.retained.root, message, live, render)

    async def delete_retained(self, request: web.Request) -> web.Response:
        topic = request.query.get("topic", "")
        if not valid_topic_name(topic):
            raise ApiError(400, f"topic: not a valid topic name: {topic[:80]!r}")
        retained = self.broker.router.retained
        if retained.get(topic) is None:
            raise ApiError(404, f"no retained message on {topic[:80]!r}")
        retained.store(Message(topic, b"", 0, True))  # an empty payload clears it
        request["audit"] = f"retained message on {topic!r} deleted"
        return web.json_response({"topic": topic, "deleted": True})

    async def publish(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        broker = self.broker
        topic = body.get("topic")
        if not isinstance(topic, str) or not valid_topic_name(topic):
            raise ApiError(400, "topic: expected a topic name (no wildcards)")
        if not broker.router.within_limits(topic) or "\0" in topic:
            raise ApiError(400, "topic: too long, too deep or with U+0000")
        qos = body.get("qos", 0)
        if qos not in (0, 1, 2) or isinstance(qos, bool):
            raise ApiError(400, "qos: expected 0, 1 or 2")
        retain = body.get("retain", False)
        if not isinstance(retain, bool):
            raise ApiError(400, "retain: expected true or false")
        payload = _payload(body)
        if len(payload) > broker.options.max_packet_size:
            raise ApiError(413, "payload: larger than broker.max_packet_size")
        props, interval = _properties(body.get("properties", {}))
        authorizer = broker.authorizer
        user = request.get("user")
        if authorizer is not None and not authorizer.can_publish(API_CLIENT_ID, user, topic):
            raise ApiError(403, f"the ACL does not let {user or 'anonymous'} publish to {topic!r}")
        now = broker.clock()
        message = Message(
            topic,
            payload,
            qos,
            retain,
            props,
            None if interval is None else now + interval,
            expiry_interval=interval,
        )
        match = broker.router.lookup(topic)
        sessions = 0 if match is None else broker.router.publish(message, match, None, now)
        request["audit"] = (
            f"published {len(payload)} bytes to {topic!r} (QoS {qos}"
            f"{', retained' if retain else ''}; {sessions} sessions)"
        )
        return web.json_response({"topic": topic, "sessions": sessions})


def _everything(item: object) -> bool:
    return True


async def json_body(request: web.Request) -> dict[str, Any]:
    if request.content_type != "application/json":
        raise ApiError(415, "expected Content-Type: application/json")
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise ApiError(413, f"request body larger than {MAX_BODY} bytes")
    try:
        body = json.loads(await request.read())
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"request body larger than {MAX_BODY} bytes") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "expected a JSON object")
    return body


def _payload(body: dict[str, Any]) -> bytes:
    payload = body.get("payload", "")
    encoding = body.get("encoding", "utf-8")
    if not isinstance(payload, str):
        raise ApiError(400, "payload: expected a string")
    if encoding == "utf-8":
        return payload.encode()
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "payload: not valid base64") from None
    raise ApiError(400, 'encoding: expected "utf-8" or "base64"')


def _properties(value: Any) -> tuple[dict[int, Any], int | None]:
    """The MQTT 5 properties of a published message, and its expiry interval."""
    if not isinstance(value, dict):
        raise ApiError(400, "properties: expected an object")
    props: dict[int, Any] = {}
    interval = None
    for key, item in value.items():
        if key == "message_expiry_interval":
            if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item <= 0xFFFFFFFF:
                raise ApiError(400, f"properties.{key}: expected seconds (0 to 4294967295)")
            interval = item
        elif key == "payload_format_indicator":
            if item not in (0, 1) or isinstance(item, bool):
                raise ApiError(400, f"properties.{key}: expected 0 or 1")
            props[Prop.PAYLOAD_FORMAT_INDICATOR] = item
        elif key in ("content_type", "response_topic"):
            if not isinstance(item, str) or "\0" in item or len(item.encode()) > 65535:
                raise ApiError(400, f"properties.{key}: expected a string")
            if key == "response_topic" and not valid_topic_name(item):
                raise ApiError(400, f"properties.{key}: expected a topic name")
            props[Prop.CONTENT_TYPE if key == "content_type" else Prop.RESPONSE_TOPIC] = item
        elif key == "correlation_data":
            if not isinstance(item, str) or len(item) > 65535:
                raise ApiError(400, f"properties.{key}: expected a UTF-8 string")
            props[Prop.CORRELATION_DATA] = item.encode()
        elif key == "user_properties":
            if not isinstance(item, list) or not all(
                isinstance(p, list)
                and len(p) == 2
                and all(isinstance(s, str) and "\0" not in s for s in p)
                for p in item
            ):
                raise ApiError(400, f"properties.{key}: expected a list of [name, value] pairs")
            props[Prop.USER_PROPERTY] = [(name, text) for name, text in item]
        else:
            raise ApiError(400, f"properties.{key}: unknown property")
    return props, interval

"""Webhooks: messages and broker events POSTed to an HTTP endpoint (aiohttp's client), at least
once, signed, with retries and a dead-letter topic.

Each webhook is a sink (broker/sink.py): its session ``$webhook/<name>`` subscribes to the
configured topic filters, so pending deliveries wait in the SQLite store and a restart loses
none; events (``client.connected``, ...) are queued into the same session as messages on
``$event/<event>`` (a topic no client subscription can reach: webhook filters may not start with
``$event``). ``concurrency`` workers take deliveries from the queue; a delivery leaves the store
when the endpoint answered 2xx, or when it became a dead letter.

The request: ``format = "json"`` sends an envelope (``event``, ``delivery_id``, ``timestamp``,
``topic``, ``payload`` as text when it is UTF-8 else base64 with ``payload_encoding``, ``qos``,
``retain``, ``properties``, ``client_id``, ``username``); ``"raw"`` sends the payload as it is,
with the metadata in ``X-Mqttbroker-*`` headers. Every request carries
``X-Mqttbroker-Event``, ``X-Mqttbroker-Delivery-Id`` (the same on every attempt: receivers dedupe
by it) and, with a secret, ``X-Mqttbroker-Signature: t=<unix seconds>,v2=<hex>`` (see
:func:`signed_string`); receivers reject old ``t`` to stop replays. The values of the
``X-Mqttbroker-*`` headers are percent-encoded (:func:`header_value`): a topic or client id may
hold CR, LF or any other character, and none can break or add a header.

Retries: connection errors, timeouts, 5xx and 429 (its Retry-After honoured) are retried after
``retry_delay`` seconds doubling up to ``retry_max_delay``, with jitter; any other 4xx is not, nor
a 3xx (redirects are not followed: the body and its signature go to the configured URL only),
nor a request that cannot be made (the HTTP client refused it). After ``max_attempts`` (or one
of those), the delivery is published to ``dead_letter_topic`` (if set) with the reason, and
counted. The attempt count is not stored: after a restart a pending delivery starts counting
again.

The URL may hold secrets (a user name and password, a token in the query): the webhook keeps it
to itself and shows only :func:`redact_url`'s form (``Webhook.url``) in logs, ``$SYS``, the
admin API and dead letters.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import hashlib
import hmac
import json
import logging
import random
import time
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp

from ..broker.core import Broker
from ..broker.message import Message
from ..broker.session import Delivery, Session
from ..broker.sink import Outbox, Sink
from ..config import WebhookConfig
from ..protocol.properties import PropertyId as Prop

log = logging.getLogger("mqttbroker.webhook")

EVENT_PREFIX = "$event/"
MAX_QUEUED_BYTES = 64 * 1_048_576
DEAD_LETTER_QOS = 1
DROP_CHECK_SECONDS = 1.0
MAX_RETRY_AFTER = 3600.0  # a Retry-After is honoured up to an hour
REDACTED = "***"
# The metadata headers, in the order the signed string lists them (signed_string).
SIGNED_HEADERS = (
    "X-Mqttbroker-Event",
    "X-Mqttbroker-Delivery-Id",
    "X-Mqttbroker-Topic",
    "X-Mqttbroker-Qos",
    "X-Mqttbroker-Retain",
    "X-Mqttbroker-Client-Id",
)
# Kept as they are in a header value: printable ASCII but "%" (quote() keeps letters, digits
# and "_.-~" anyway).
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%" and not chr(c).isalnum())


def redact_url(url: str) -> str:
    """``url`` as it may be shown: the user name and password (all of the userinfo) become
    ``***``, a path beyond ``/`` becomes ``/***`` (Slack, Discord and Teams webhooks carry
    their secret in the path), each query value becomes ``***`` (a query item without ``=``
    becomes ``***`` as a whole; the names of the others are kept), the fragment is dropped.
    Scheme, host and port are kept: they tell which endpoint it is."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rpartition("@")[2]
    path = parts.path if parts.path in ("", "/") else "/" + REDACTED
    query = "&".join(
        f"{name}={REDACTED}" if eq else REDACTED
        for name, eq, _ in (item.partition("=") for item in parts.query.split("&") if item)
    )
    return urlunsplit((parts.scheme, netloc, path, query, ""))


def header_value(value: str) -> str:
    """A metadata header's value, percent-encoded: the UTF-8 bytes of ``value`` outside
    printable ASCII (controls such as CR and LF, space, DEL, non-ASCII) and ``%`` itself become
    ``%XX``; the rest is kept (``sensors/room 1`` is sent as ``sensors/room%201``). Receivers
    decode it with ``urllib.parse.unquote`` (not ``unquote_plus``: ``+`` is a ``+``)."""
    return quote(value, safe=_HEADER_SAFE)


def signed_string(timestamp: int, headers: dict[str, str], body: bytes) -> bytes:
    r"""What ``v2`` signs (HMAC-SHA256 with the secret, in hex): seven lines, each ended by a
    line feed, then the body as sent. The lines: the timestamp ``t`` of the signature header,
    then the value of each of :data:`SIGNED_HEADERS` in that order, as sent (percent-encoded,
    so none holds a line feed), or an empty line when the request has no such header (a
    ``format = "json"`` request has only the event and the delivery id: the body holds the
    rest)::

        <t>\n<event>\n<delivery id>\n<topic>\n<qos>\n<retain>\n<client id>\n<body>
    """
    lines = [str(timestamp), *(headers.get(name, "") for name in SIGNED_HEADERS)]
    return "".join(line + "\n" for line in lines).encode() + body


class Webhook(Sink):
    def __init__(self, broker: Broker, config: WebhookConfig) -> None:
        self.broker = broker
        self._config = config  # private: its url may hold secrets
        self._target = config.url  # where requests go; never shown
        self.url = redact_url(config.url)  # what logs, $SYS, the API and dead letters show
        self.name = config.name
        self.outbox = Outbox(
            broker, "$webhook/" + config.name, self, config.max_queued, MAX_QUEUED_BYTES
        )
        self.session = self.outbox.session
        topics = config.topics if "message.publish" in config.events else []
        self.outbox.subscribe({topic_filter: 2 for topic_filter in topics})
        if topics:
            broker.router.track_origin = True  # the envelope names the publisher
        self.events = frozenset(e for e in config.events if e != "message.publish")
        if self.events:
            broker.observers.append(self._observe)
        self.delivered = 0
        self.failures = 0  # failed attempts
        self.dead = 0  # dead letters
        self.last_error = ""
        self._started: dict[int, float] = {}  # packet id -> first attempt (wall clock)
        self._work = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._http: aiohttp.ClientSession | None = None
        self._reported: str | None = None

    # -- the broker's side ------------------------------------------------------------------

    def wake(self) -> None:
        self._work.set()

    def _observe(self, event: str, session: Session) -> None:
        if event in self.events and session is not self.session:
            # After this pass: a connecting client's user name is set just after attach.
            asyncio.get_running_loop().call_soon(self._queue_event, event, session)

    def _queue_event(self, event: str, session: Session, **extra: Any) -> None:
        fields = {"client_id": session.client_id, "username": session.username, **extra}
        message = Message(EVENT_PREFIX + event, json.dumps(fields).encode(), 1)
        self.session.deliver(message, 1, False, (), self.broker.clock())

    async def _watch_drops(self) -> None:
        """message.dropped: once a second, one event per session that dropped messages since
        (with how many), its own drops aside."""
        seen: dict[str, int] = {}
        while True:
            await asyncio.sleep(DROP_CHECK_SECONDS)
            for client_id, session in list(self.broker.sessions.items()):
                count = session.dropped
                before = seen.get(client_id, 0)
                if count > before and session is not self.session:
                    self._queue_event("message.dropped", session, dropped=count - before)
                if count:
                    seen[client_id] = count
            for client_id in [c for c in seen if c not in self.broker.sessions]:
                del seen[client_id]

    def status(self) -> dict[str, Any]:
        """Figures for $SYS, the admin API and /metrics."""
        session = self.session
        oldest = min(self._started.values(), default=None)
        return {
            "url": self.url,
            "queued": len(session.queue),
            "inflight": len(session.inflight),
            "delivered": self.delivered,
            "failures": self.failures,
            "dead_letters": self.dead,
            "dropped": session.dropped,
            "oldest_pending_age": 0.0 if oldest is None else round(time.time() - oldest, 3),
            "last_error": self.last_error,
        }

    def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self._config.timeout)
        self._http = aiohttp.ClientSession(timeout=timeout)
        # Deliveries in flight when the broker stopped go first, in their order.
        restored = list(self.session.inflight.items())
        self._tasks = [
            asyncio.create_task(self._worker(restored), name=f"webhook {self.name}")
            for _ in range(self._config.concurrency)
        ]
        if "message.dropped" in self.events:
            self._tasks.append(asyncio.create_task(self._watch_drops()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self._http is not None:
            await self._http.close()

    # -- delivering -------------------------------------------------------------------------

    async def _worker(self, restored: list[tuple[int, Delivery]]) -> None:
        while True:
            if restored:
                packet_id, delivery = restored.pop(0)
            else:
                item = self.outbox.take()
                if item is None:
                    self._work.clear()
                    await self._work.wait()
                    continue
                packet_id, delivery = item
            try:
                await self._deliver(packet_id, delivery)
            except Exception as exc:  # a bug of ours: logged; the delivery is given up
                log.exception("webhook %s: internal error", self.name)
                self._started.pop(packet_id, None)
                try:
                    why = f"internal error: {type(exc).__name__}"
                    self._dead_letter(delivery, _delivery_id(self.name, delivery), why, 0)
                    self.outbox.done(packet_id)
                except Exception:  # still failing: it stays pending (until a restart)
                    log.exception("webhook %s: internal error giving up a delivery", self.name)
                    await asyncio.sleep(self._config.retry_max_delay)

    def _request(self, delivery: Delivery, delivery_id: str) -> tuple[bytes, dict[str, str]]:
        message = delivery.message
        client_id = username = None
        if message.topic.startswith(EVENT_PREFIX):
            event = message.topic[len(EVENT_PREFIX) :]
            body_fields: dict[str, Any] = json.loads(message.payload)
            client_id = body_fields.pop("client_id", None)
            username = body_fields.pop("username", None)
            body_fields.update(topic=None, payload=None)
        else:
            event = "message.publish"
            client_id, username = message.origin_id, message.origin_user
            body_fields = {"topic": message.topic, **_payload(message.payload)}
            body_fields["qos"] = message.qos
            body_fields["retain"] = delivery.retain
            body_fields["properties"] = _properties(message, self.broker.clock())
        headers = {
            "X-Mqttbroker-Event": header_value(event),
            "X-Mqttbroker-Delivery-Id": header_value(delivery_id),
        }
        if self._config.format == "json" or event != "message.publish":
            envelope = {
                "event": event,
                "delivery_id": delivery_id,
                "timestamp": time.time(),
                **body_fields,
                "client_id": client_id,
                "username": username,
            }
            body = json.dumps(envelope).encode()
            headers["Content-Type"] = "application/json"
        else:
            body = message.payload
            headers["Content-Type"] = "application/octet-stream"
            headers["X-Mqttbroker-Topic"] = header_value(message.topic)
            headers["X-Mqttbroker-Qos"] = str(message.qos)
            headers["X-Mqttbroker-Retain"] = "true" if delivery.retain else "false"
            if client_id is not None:
                headers["X-Mqttbroker-Client-Id"] = header_value(client_id)
        secret = self._config.secret
        if secret is not None:
            stamp = int(time.time())
            signed = signed_string(stamp, headers, body)
            digest = hmac.new(secret, signed, hashlib.sha256).hexdigest()
            headers["X-Mqttbroker-Signature"] = f"t={stamp},v2={digest}"
        return body, headers

    async def _deliver(self, packet_id: int, delivery: Delivery) -> None:
        cfg = self._config
        assert self._http is not None
        self._started[packet_id] = time.time()
        delivery_id = _delivery_id(self.name, delivery)
        attempt = 0
        ok = False
        while True:
            attempt += 1
            wait: float | None = None
            permanent = False
            try:
                body, headers = self._request(delivery, delivery_id)
                # Redirects are not followed: a 3xx is an answer like a 4xx (no retry).
                async with self._http.post(
                    self._target, data=body, headers=headers, allow_redirects=False
                ) as response:
                    status = response.status
                    retry_after = response.headers.get("Retry-After")
                    await response.read()
                if 200 <= status < 300:
                    ok = True
                    break
                why = f"HTTP {status}"
                if 300 <= status < 400:
                    why += " (redirects are not followed)"
                # The endpoint will not take it: no retry.
                permanent = status != 429 and status < 500
                if status == 429 and retry_after is not None:
                    wait = _retry_after(retry_after)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                why = self._scrub(
                    f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                )
            except ValueError as exc:  # the request cannot be made (a header refused, ...)
                why = self._scrub(f"request not sent: {type(exc).__name__}: {exc}")
                permanent = True
            if permanent:
                self._failure(why)
                self._dead_letter(delivery, delivery_id, why, attempt)
                break
            self._failure(why)
            if attempt >= cfg.max_attempts:
                self._dead_letter(delivery, delivery_id, f"{why} after {attempt} attempts", attempt)
                break
            if wait is None:
                wait = min(cfg.retry_max_delay, cfg.retry_delay * 2 ** min(attempt - 1, 30))
                wait *= random.uniform(0.5, 1.0)
            await asyncio.sleep(min(wait, MAX_RETRY_AFTER))
        if ok:
            self.delivered += 1
            if self._reported is not None:
                log.info("webhook %s: %s answers again", self.name, self.url)
                self._reported = None
        self._started.pop(packet_id, None)
        self.outbox.done(packet_id)

    def _failure(self, why: str) -> None:
        self.failures += 1
        self.last_error = why
        if why != self._reported:  # once per outage (and when the reason changes)
            self._reported = why
            log.warning("webhook %s: %s: %s; retrying", self.name, self.url, why)

    def _scrub(self, text: str) -> str:
        """An error message with the URL's secrets (as :func:`redact_url` sees them) hidden."""
        text = text.replace(self._target, self.url)
        parts = urlsplit(self._target)
        userinfo = parts.netloc.rpartition("@")[0]
        if userinfo:
            text = text.replace(userinfo + "@", REDACTED + "@")
        for secret in (parts.password, parts.query):
            if secret:
                text = text.replace(secret, REDACTED)
        return text

    def _dead_letter(
        self, delivery: Delivery, delivery_id: str, reason: str, attempts: int
    ) -> None:
        self.dead += 1
        message = delivery.message
        log.warning(
            "webhook %s: delivery %s (topic %r) given up: %s",
            self.name,
            delivery_id,
            message.topic,
            reason,
        )
        topic = self._config.dead_letter_topic
        if not topic:
            return
        letter = {
            "webhook": self.name,
            "url": self.url,
            "reason": reason,
            "attempts": attempts,
            "delivery_id": delivery_id,
            "topic": message.topic,
            **_payload(message.payload),
            "qos": message.qos,
            "retain": delivery.retain,
        }
        code = self.outbox.publish(topic, json.dumps(letter).encode(), DEAD_LETTER_QOS, False, None)
        if code >= 0x80:
            log.warning(
                "webhook %s: dead letter not published to %r (0x%02X)", self.name, topic, code
            )


def _delivery_id(name: str, delivery: Delivery) -> str:
    """The same id on every attempt and after a restart: the store's key for the delivery
    (unique in the session, kept in the store) and a digest of the message."""
    message = delivery.message
    digest = hashlib.sha256(message.topic_bytes + message.payload).hexdigest()[:12]
    return f"{name}-{delivery.stored}-{digest}"


def _payload(payload: bytes) -> dict[str, Any]:
    try:
        return {"payload": payload.decode("utf-8"), "payload_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"payload": base64.b64encode(payload).decode(), "payload_encoding": "base64"}


def _properties(message: Message, now: float) -> dict[str, Any]:
    """The message's MQTT 5 properties by name, JSON-friendly."""
    out: dict[str, Any] = {}
    for key, value in message.properties.items():
        name = Prop(key).name.lower()
        if key == Prop.USER_PROPERTY:
            out[name] = [list(pair) for pair in value]
        elif isinstance(value, bytes):
            out[name] = base64.b64encode(value).decode()
        else:
            out[name] = value
    if message.expiry_interval is not None:
        out["message_expiry_interval"] = message.remaining_expiry(now)
    return out


def _retry_after(value: str) -> float | None:
    """Retry-After: seconds, or an HTTP date."""
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())

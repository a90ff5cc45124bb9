#!/usr/bin/env python3
r"""An HTTP endpoint for the broker's webhooks (``[[webhook]]``), doing what a receiver should:

- verify the signature: ``X-Mqttbroker-Signature: t=<unix seconds>,v2=<hex>``, where hex is
  HMAC-SHA256(secret, the signed string), compared in constant time (several ``v2=`` are
  accepted, for a secret being rotated). The signed string covers the metadata headers as well
  as the body: seven lines, each ended by a line feed, then the raw body::

      <t>\n<event>\n<delivery id>\n<topic>\n<qos>\n<retain>\n<client id>\n<body>

  the lines holding the values of ``X-Mqttbroker-Event``, ``-Delivery-Id``, ``-Topic``,
  ``-Qos``, ``-Retain`` and ``-Client-Id`` exactly as received (still percent-encoded; an
  empty line for a header the request does not have);
- reject replays: a timestamp more than 5 minutes old (or ahead) is refused;
- deduplicate: deliveries are at least once, so the same ``X-Mqttbroker-Delivery-Id`` may come
  again (a retry after a timeout, say); it is answered 200 and not handled twice;
- answer 2xx once handled: anything else makes the broker retry (5xx, 429) or give up (other
  4xx, which is what a forged or stale request gets here).

Both of the webhook's formats are taken: ``format = "json"``, the envelope (``event``,
``delivery_id``, ``timestamp``, ``topic``, ``payload``, ``payload_encoding``, ``qos``, ``retain``,
``properties``, ``client_id``, ``username``), and ``format = "raw"``, the payload as the body
(``application/octet-stream``) with the topic, QoS, retain flag and client id in
``X-Mqttbroker-*`` headers. Events (``client.connected``, ...) always come as an envelope. The
values of the ``X-Mqttbroker-*`` headers are percent-encoded (UTF-8; a topic or client id may
hold CR, LF, spaces...): they are decoded with ``urllib.parse.unquote`` once verified.

The secret comes from ``--secret-file`` (its content without the trailing newline) or the
environment variable ``WEBHOOK_SECRET``.

    WEBHOOK_SECRET=s3cret python examples/webhook_receiver.py --port 8081

The ids seen are remembered in memory (the newest ``--remember``), so a restart forgets them;
a receiver whose handler has lasting effects keeps them where it keeps those effects.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import signal
import sys
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from aiohttp import web

SIGNATURE = "X-Mqttbroker-Signature"
DELIVERY_ID = "X-Mqttbroker-Delivery-Id"
EVENT = "X-Mqttbroker-Event"
TOPIC = "X-Mqttbroker-Topic"  # format = "raw": the metadata in headers
QOS = "X-Mqttbroker-Qos"
RETAIN = "X-Mqttbroker-Retain"
CLIENT_ID = "X-Mqttbroker-Client-Id"
TOLERANCE = 300  # seconds: older (or further ahead) timestamps are refused
# The headers the signature covers, in the order of the signed string.
SIGNED_HEADERS = (EVENT, DELIVERY_ID, TOPIC, QOS, RETAIN, CLIENT_ID)

log = logging.getLogger("webhook_receiver")


def signed_string(timestamp: int, headers: Mapping[str, str], body: bytes) -> bytes:
    """What the signature covers: the timestamp and the metadata headers as received, a line
    each, then the body."""
    lines = [str(timestamp), *(headers.get(name, "") for name in SIGNED_HEADERS)]
    return "".join(line + "\n" for line in lines).encode() + body


def sign(secret: bytes, timestamp: int, headers: Mapping[str, str], body: bytes) -> str:
    """The value of the signature header for a request sent at ``timestamp``."""
    signed = signed_string(timestamp, headers, body)
    digest = hmac.new(secret, signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v2={digest}"


def verify(secret: bytes, headers: Mapping[str, str], body: bytes, now: float) -> str | None:
    """None if the signature header signs the metadata headers and ``body`` with ``secret``
    recently enough, else the reason."""
    timestamp: int | None = None
    signatures: list[str] = []
    for part in headers.get(SIGNATURE, "").split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v2":
            signatures.append(value)
    if timestamp is None or not signatures:
        return "malformed signature header"
    if abs(now - timestamp) > TOLERANCE:
        return "timestamp outside the tolerance (replayed or clock skew)"
    expected = sign(secret, timestamp, headers, body).partition(",v2=")[2]
    # compare_digest against each candidate, so timing reveals nothing about the expected value
    if not any(hmac.compare_digest(expected, candidate) for candidate in signatures):
        return "signature does not match"
    return None


class Receiver:
    def __init__(self, secret: bytes, remember: int) -> None:
        self.secret = secret
        self.remember = remember
        self.seen: OrderedDict[str, None] = OrderedDict()  # delivery ids handled, oldest first
        self.handled = 0

    async def webhook(self, request: web.Request) -> web.Response:
        body = await request.read()
        problem = verify(self.secret, request.headers, body, time.time())
        if problem is not None:
            log.warning("refused a request from %s: %s", request.remote, problem)
            return web.json_response({"error": problem}, status=401)
        delivery_id = unquote(request.headers.get(DELIVERY_ID, ""))
        if not delivery_id:
            return web.json_response({"error": f"no {DELIVERY_ID} header"}, status=400)
        if delivery_id in self.seen:
            log.info("delivery %r again: already handled", delivery_id)
            return web.json_response({"status": "duplicate"})
        try:
            if request.content_type == "application/json":
                envelope = json.loads(body)
                if envelope.get("delivery_id", delivery_id) != delivery_id:
                    raise ValueError("delivery_id differs from the header's")
                payload = payload_bytes(envelope)
            else:  # format = "raw"
                envelope, payload = raw_envelope(request.headers, delivery_id), body
        except (ValueError, AttributeError, TypeError) as error:
            return web.json_response({"error": f"not a webhook delivery: {error}"}, status=400)
        event = unquote(request.headers.get(EVENT, "")) or envelope.get("event", "")
        self.handle(event, envelope, payload)
        # Remembered only once handled: if handling fails, the retry is handled again.
        self.seen[delivery_id] = None
        if len(self.seen) > self.remember:
            self.seen.popitem(last=False)
        return web.json_response({"status": "ok"})

    def handle(self, event: str, envelope: dict[str, Any], payload: bytes | None) -> None:
        """What to do with a delivery: here, log it (client-supplied strings with %r)."""
        self.handled += 1
        if payload is not None:
            log.info(
                "handled %r: %s on %r, %d bytes, qos %s: %r",
                envelope.get("delivery_id"),
                event,
                envelope.get("topic"),
                len(payload),
                envelope.get("qos"),
                payload[:64],
            )
        else:
            log.info(
                "handled %r: %s, client %r",
                envelope.get("delivery_id"),
                event,
                envelope.get("client_id"),
            )


def payload_bytes(envelope: dict[str, Any]) -> bytes | None:
    """The message's payload (text as UTF-8, or base64), None for an event without one."""
    payload = envelope.get("payload")
    if payload is None:
        return None
    if envelope.get("payload_encoding") == "base64":
        return base64.b64decode(payload, validate=True)
    return str(payload).encode()


def raw_envelope(headers: Mapping[str, str], delivery_id: str) -> dict[str, Any]:
    """What the headers of a ``format = "raw"`` delivery say, as the envelope would (their
    values percent-decoded)."""
    topic, qos = headers.get(TOPIC), headers.get(QOS, "")
    if topic is None or not qos.isdigit():
        raise ValueError(f"no {TOPIC} or {QOS} header")
    client_id = headers.get(CLIENT_ID)
    return {
        "event": unquote(headers.get(EVENT, "message.publish")),
        "delivery_id": delivery_id,
        "topic": unquote(topic),
        "qos": int(qos),
        "retain": headers.get(RETAIN) == "true",
        "client_id": None if client_id is None else unquote(client_id),
    }


def read_secret(args: argparse.Namespace) -> bytes:
    if args.secret_file:
        try:
            return Path(args.secret_file).read_bytes().rstrip(b"\r\n")
        except OSError as error:
            sys.exit(f"--secret-file {args.secret_file}: {error.strerror}")
    secret = os.environ.get("WEBHOOK_SECRET", "")
    if not secret:
        sys.exit("no secret: give --secret-file PATH or set WEBHOOK_SECRET")
    return secret.encode()


async def serve(args: argparse.Namespace, secret: bytes) -> None:
    receiver = Receiver(secret, args.remember)
    app = web.Application(client_max_size=args.max_body)
    app.router.add_post(args.path, receiver.webhook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        for host, port, *_ in runner.addresses:
            log.info("listening on http://%s:%d%s", host, port, args.path)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
    log.info("stopped after %d deliveries", receiver.handled)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081, help="0: any free port")
    parser.add_argument("--path", default="/webhook")
    parser.add_argument("--secret-file", default="", help="default: $WEBHOOK_SECRET")
    parser.add_argument(
        "--remember", type=int, default=100_000, help="delivery ids kept for deduplication"
    )
    parser.add_argument("--max-body", type=int, default=2**20 * 4, help="bytes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        asyncio.run(serve(args, read_secret(args)))
    except OSError as error:
        sys.exit(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

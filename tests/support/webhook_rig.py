"""The rig of the bridge and webhook tests: ``Rig``, the fixtures such a test starts its brokers
and clients with; our broker started from a TOML file, and a webhook endpoint (a real aiohttp
server on its own thread) with the receiver's signature check written out from the format the
README gives. Mosquitto (``support.launcher.Mosquitto``), the
collecting subscriber (``support.clients.Collector``) and the publishers (the ``paho`` fixture)
come from tests/support."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from support.clients import Collector, PahoClient
from support.http_service import serve
from support.launcher import BrokerProcess, Mosquitto

SECRET = b"s3cret-for-tests"
# The metadata headers the signature covers, in the order of the signed string (README).
SIGNED_HEADERS = ("Event", "Delivery-Id", "Topic", "Qos", "Retain", "Client-Id")


def write_config(path: Path, text: str) -> tuple[str, ...]:
    """The arguments that start our broker from this TOML text."""
    path.write_text(text)
    return ("--config", str(path))


@dataclass
class Rig:
    """What an integration test starts its brokers and clients with: its temporary folder, our
    broker (``start_broker``), Mosquittos, collecting subscribers and paho clients, each stopped
    after the test, and webhook endpoints (``endpoint(answer)``), closed after it."""

    tmp_path: Path
    start_broker: Callable[..., BrokerProcess]
    mosquitto: Callable[..., Mosquitto]
    collect: Callable[..., Collector]
    paho: Callable[..., PahoClient]
    endpoint: Callable[..., Endpoint]

    def broker(self, config: str, name: str = "w.toml") -> BrokerProcess:
        """Our broker started from the TOML text ``config`` (written to ``name``)."""
        return self.start_broker(extra_args=write_config(self.tmp_path / name, config))


@dataclass
class Request:
    method: str
    path: str
    query: str
    at: float
    body: bytes
    headers: dict[str, str]
    status: int

    @property
    def delivery_id(self) -> str:
        return self.headers["X-Mqttbroker-Delivery-Id"]

    def envelope(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.body)
        return data


class Endpoint:
    """An aiohttp server on its own thread; ``answer(path, body, count)`` decides each reply
    (to any method: a redirected request may come as a GET)."""

    def __init__(self, answer: Callable[[str, bytes, int], tuple[int, dict[str, str]]]) -> None:
        self.answer = answer
        self.hang = False
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.released = asyncio.Event()
        self.runner, self.port = self.loop.run_until_complete(
            serve([("*", "/{path}", self._handle)])
        )
        ready.set()
        self.loop.run_forever()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.hang:
            await self.released.wait()  # no answer until the test ends
        path = request.match_info["path"]
        with self.lock:
            count = sum(1 for r in self.requests if r.path == path)
            status, headers = self.answer(path, body, count)
            self.requests.append(
                Request(
                    request.method,
                    path,
                    request.query_string,
                    time.monotonic(),
                    body,
                    dict(request.headers),
                    status,
                )
            )
        return web.Response(status=status, headers=headers)

    def ok(self, path: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.path == path and r.status == 200]

    def all(self, path: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.path == path]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.released.set)
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def verify(request: Request, secret: bytes = SECRET) -> None:
    """The receiver's check: HMAC-SHA256 with the shared secret over the timestamp, the
    metadata headers' values as received (a line each, empty for an absent header) and the
    body."""
    fields = dict(
        part.split("=", 1) for part in request.headers["X-Mqttbroker-Signature"].split(",")
    )
    lines = [fields["t"]] + [
        request.headers.get(f"X-Mqttbroker-{name}", "") for name in SIGNED_HEADERS
    ]
    signed = "\n".join(lines).encode() + b"\n" + request.body
    expected = hmac.new(secret, signed, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(fields["v2"], expected), request
    assert abs(int(fields["t"]) - time.time()) < 300  # not a replay of an old request

#!/usr/bin/env python3
"""Request/response over MQTT 5: a request carries a Response Topic (where to answer) and
Correlation Data (which request an answer belongs to); the server publishes its answer there
with the same Correlation Data. Several servers may run at once: they share the requests
(``$share/<service>/rpc/<service>/request``), and a client matches answers by correlation, so
they may come back in any order.

    python examples/rpc.py demo                  # a server and a client in one process
    python examples/rpc.py serve                 # or: the server ...
    python examples/rpc.py call add 2 3          # ... and a client, printing the result

Methods of the example server: ``add`` and ``multiply`` (numbers), ``echo`` (anything),
``sleep`` (seconds, at most 10: answers after that long). Requests and answers are JSON
(``{"method": ..., "params": [...]}``, ``{"result": ...}`` or ``{"error": ...}``), with Content
Type ``application/json``; each request has a Message Expiry Interval of the client's timeout,
so a server never runs a request whose caller has given up.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

log = logging.getLogger("rpc")
CONTENT_TYPE = "application/json"


def request_topic(service: str) -> str:
    return f"rpc/{service}/request"


def _sleep(seconds: float) -> float:
    if not 0 <= seconds <= 10:
        raise ValueError("sleep: 0 to 10 seconds")
    time.sleep(seconds)
    return seconds


METHODS: dict[str, Callable[..., Any]] = {
    "add": lambda *numbers: sum(numbers),
    "multiply": lambda *numbers: math.prod(numbers),
    "echo": lambda *params: list(params),
    "sleep": _sleep,
}


def new_client(client_id: str = "") -> mqtt.Client:
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
    )
    client.on_socket_open = _no_delay
    return client


def _no_delay(client: mqtt.Client, userdata: Any, sock: Any) -> None:
    """Send each packet at once: with Nagle's algorithm, a PUBACK followed by the next request
    waits for the broker's delayed ACK (about 40 ms a call)."""
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# -- the server ----------------------------------------------------------------------------


class Server:
    """Answers requests on ``rpc/<service>/request``, several at a time (a thread pool)."""

    def __init__(self, host: str, port: int, service: str = "calc", threads: int = 8) -> None:
        self.host, self.port, self.service = host, port, service
        self.ready = threading.Event()
        self.pool = ThreadPoolExecutor(threads)
        self.client = new_client()
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message

    def start(self) -> None:
        self.client.connect(self.host, self.port)
        self.client.loop_start()

    def stop(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.disconnect()
        self.client.loop_stop()

    def _on_connect(self, client: mqtt.Client, *_: Any) -> None:
        client.subscribe(f"$share/{self.service}/{request_topic(self.service)}", qos=1)

    def _on_subscribe(
        self, client: mqtt.Client, userdata: Any, mid: int, codes: Any, properties: Any
    ) -> None:
        log.info("serving %s on %s:%d", request_topic(self.service), self.host, self.port)
        self.ready.set()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        properties = message.properties
        response_topic = getattr(properties, "ResponseTopic", None)
        if not response_topic:
            log.warning("request without a Response Topic on %s: ignored", message.topic)
            return
        correlation = getattr(properties, "CorrelationData", None)
        self.pool.submit(self._answer, response_topic, correlation, message.payload)

    def _answer(
        self, response_topic: str, correlation: bytes | None, payload: bytes | bytearray
    ) -> None:
        try:
            request = json.loads(payload)
            method = METHODS[request["method"]]
            answer = {"result": method(*request.get("params", []))}
        except KeyError as error:
            answer = {"error": f"unknown method or missing field: {error}"}
        except Exception as error:  # noqa: BLE001 - the caller gets it, the server goes on
            answer = {"error": f"{type(error).__name__}: {error}"}
        properties = Properties(PacketTypes.PUBLISH)
        properties.ContentType = CONTENT_TYPE
        if correlation is not None:
            properties.CorrelationData = correlation
        self.client.publish(response_topic, json.dumps(answer), qos=1, properties=properties)


# -- the client ----------------------------------------------------------------------------


class RemoteError(Exception):
    """The server answered with an error."""


class Client:
    """Calls a service; safe to use from several threads at once."""

    def __init__(self, host: str, port: int, service: str = "calc") -> None:
        self.service = service
        client_id = f"rpc-client-{uuid.uuid4().hex[:12]}"
        self.response_topic = f"rpc/{service}/response/{client_id}"
        self.client = new_client(client_id)
        self.client.on_message = self._on_message
        self._lock = threading.Lock()
        self._pending: dict[bytes, tuple[threading.Event, list[Any]]] = {}
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.connect(host, port)
        self.client.subscribe(self.response_topic, qos=1)
        self.client.loop_start()
        if not subscribed.wait(10):
            self.close()
            raise TimeoutError(f"no SUBACK from {host}:{port}")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def call(self, method: str, *params: Any, timeout: float = 10.0) -> Any:
        correlation = uuid.uuid4().bytes
        done = threading.Event()
        slot: list[Any] = []
        with self._lock:
            self._pending[correlation] = (done, slot)
        properties = Properties(PacketTypes.PUBLISH)
        properties.ResponseTopic = self.response_topic
        properties.CorrelationData = correlation
        properties.ContentType = CONTENT_TYPE
        properties.MessageExpiryInterval = max(1, math.ceil(timeout))
        request = json.dumps({"method": method, "params": list(params)})
        try:
            self.client.publish(request_topic(self.service), request, qos=1, properties=properties)
            if not done.wait(timeout):
                raise TimeoutError(f"no answer to {method} within {timeout}s")
        finally:
            with self._lock:
                self._pending.pop(correlation, None)
        answer = slot[0]
        if "error" in answer:
            raise RemoteError(answer["error"])
        return answer["result"]

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        correlation = getattr(message.properties, "CorrelationData", None)
        with self._lock:
            waiting = self._pending.get(correlation) if correlation else None
        if waiting is None:
            log.warning("answer without a pending request (late, or not ours): ignored")
            return
        done, slot = waiting
        try:
            slot.append(json.loads(message.payload))
        except ValueError:
            slot.append({"error": f"not JSON: {message.payload[:100]!r}"})
        done.set()


# -- the command line ----------------------------------------------------------------------


def number_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def serve(args: argparse.Namespace) -> int:
    server = Server(args.host, args.port, args.service)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    stop.wait()
    server.stop()
    return 0


def call(args: argparse.Namespace) -> int:
    client = Client(args.host, args.port, args.service)
    try:
        result = client.call(args.method, *map(number_or_text, args.params), timeout=args.timeout)
    except (RemoteError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(json.dumps(result))
    return 0


def demo(args: argparse.Namespace) -> int:
    server = Server(args.host, args.port, args.service)
    server.start()
    if not server.ready.wait(10):
        sys.exit(f"could not subscribe on {args.host}:{args.port}")
    client = Client(args.host, args.port, args.service)
    try:
        # A slow call and a quick one at once: the quick answer comes first, and correlation
        # data gives each caller its own.
        slow = threading.Thread(target=lambda: print("sleep(1) ->", client.call("sleep", 1)))
        slow.start()
        print("add(2, 3) ->", client.call("add", 2, 3))
        print("multiply(6, 7) ->", client.call("multiply", 6, 7))
        slow.join()
        try:
            client.call("divide", 1, 0)
        except RemoteError as error:
            print("divide(1, 0) -> error:", error)
    finally:
        client.close()
        server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--service", default="calc", help="requests go to rpc/SERVICE/request")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="answer requests until stopped")
    caller = commands.add_parser("call", help="call a method and print its result")
    caller.add_argument("method")
    caller.add_argument("params", nargs="*", help="JSON values (plain words are strings)")
    caller.add_argument("--timeout", type=float, default=10.0)
    commands.add_parser("demo", help="a server and a client in one process")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        return {"serve": serve, "call": call, "demo": demo}[args.command](args)
    except OSError as error:  # the broker is not there
        sys.exit(f"cannot connect to {args.host}:{args.port}: {error.strerror or error}")


if __name__ == "__main__":
    sys.exit(main())

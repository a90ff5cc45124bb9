"""Login sources and HTTP rights: connections per second with each source, and publishes per
second with rights from the HTTP service (cached and not) beside the ACL file.

    python -m benchmarks.auth_sources                  # 3 runs of each, medians
    python -m benchmarks.auth_sources --runs 1 --connects 500 --duration 2   # a quick look

Our broker is pinned to core 0 (when taskset is there); this generator and the HTTP auth
service (an aiohttp app in a process of its own, answering 204 at once) share core 1.

Connections: ``--connects`` MQTT 3.1.1 logins, 32 at a time, each CONNECT -> CONNACK ->
DISCONNECT on a new TCP connection, every login a different client id and user:

* ``anonymous``: no source (the listener's anonymous rule);
* ``password_file``: a file of as many users, mosquitto_passwd's sha512-pbkdf2 (101
  iterations): each login hashes once, on the worker threads;
* ``dynsec``: as many dynamic-security clients (101 iterations);
* ``jwt RS256`` / ``jwt ES256`` / ``jwt EdDSA``: a token per device, one public key;
* ``http (calls)``: every login asks the service; ``http (cached)``: 32 client ids
  reconnecting, so all but the first 32 are answered from the cache.

Publishes: 8 publishers, QoS 1, 16 in flight each, 64-byte payloads, ``--duration`` seconds;
PUBACKs counted. Rights from: none; the ACL file; the HTTP service's acl_url with 100 topics per
publisher cycled (cached: the connection's own cache after the first of each); and a new topic
for every message, ``cache_ttl = 0``: a call to the service per message, the publisher's packet
held meanwhile. The ACL file with a new topic per message is beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from mqttbroker.protocol import grammar
from mqttbroker.protocol import packets as pk

from . import brokers as br

CONCURRENCY = 32
PUBLISHERS = 8
WINDOW = 16
PAYLOAD = b"x" * 64
V311 = 4

SERVICE = """\
import sys
from aiohttp import web

async def answer(request):
    await request.read()
    return web.Response(status=204)

app = web.Application()
app.router.add_post("/auth", answer)
app.router.add_post("/acl", answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def connect_packet(client_id: str, user: str | None, password: bytes | None) -> bytes:
    return grammar.encode(pk.Connect(client_id, V311, username=user, password=password), V311)


DISCONNECT = grammar.encode(pk.Disconnect(), V311)


async def login(host: str, port: int, packet: bytes) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(packet)
        ack = await reader.readexactly(4)
        if ack[3] == 0:
            writer.write(DISCONNECT)
        return ack[3]
    finally:
        writer.close()


async def connects(host: str, port: int, packets: list[bytes]) -> float:
    """Logins per second; every one must be accepted."""
    queue = list(reversed(packets))
    refused: list[int] = []

    async def worker() -> None:
        while queue:
            code = await login(host, port, queue.pop())
            if code:
                refused.append(code)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - started
    if refused:
        raise SystemExit(f"{len(refused)} logins refused (0x{refused[0]:02X})")
    return len(packets) / elapsed


async def publisher(
    host: str, port: int, index: int, topics: Callable[[int], str], until: float
) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(connect_packet(f"pub-{index}-{os.getpid()}", f"user{index}", b"pw"))
    ack = await reader.readexactly(4)
    assert ack[3] == 0, f"publisher refused: 0x{ack[3]:02X}"
    sent = acked = 0

    def send() -> None:
        nonlocal sent
        sent += 1
        packet_id = sent % 65535 + 1
        writer.write(
            grammar.encode(pk.Publish(topics(sent), PAYLOAD, 1, packet_id=packet_id), V311)
        )

    for _ in range(WINDOW):
        send()
    while True:
        head = await reader.readexactly(4)
        assert head[0] == 0x40, head
        acked += 1
        if time.perf_counter() >= until:
            break
        send()
    writer.write(DISCONNECT)
    writer.close()
    return acked


async def publishes(
    host: str, port: int, topics: Callable[[int, int], str], seconds: float
) -> float:
    started = time.perf_counter()
    until = started + seconds
    counts = await asyncio.gather(
        *(
            publisher(host, port, i, lambda n, i=i: topics(i, n), until)  # type: ignore[misc]
            for i in range(PUBLISHERS)
        )
    )
    return sum(counts) / (time.perf_counter() - started)


# -- the set-ups ------------------------------------------------------------------------------


class Setup:
    def __init__(self, work: Path, count: int, service_port: int) -> None:
        self.work = work
        self.count = count
        self.service = f"http://127.0.0.1:{service_port}"
        self.ids = [f"dev-{i}" for i in range(count)]

    def password_file(self) -> tuple[str, list[bytes]]:
        import hashlib
        from base64 import b64encode as b64

        def b64encode(data: bytes) -> str:
            return b64(data).decode()

        lines = []
        for i in range(self.count):
            salt = os.urandom(12)
            digest = hashlib.pbkdf2_hmac("sha512", b"pw", salt, 101, 64)
            lines.append(f"user{i}:$7$101${b64encode(salt)}${b64encode(digest)}")
        path = self.work / "passwd"
        path.write_text("\n".join(lines) + "\n")
        packets = [connect_packet(self.ids[i], f"user{i}", b"pw") for i in range(self.count)]
        return f'[security]\npassword_file = "{path}"\n', packets

    def dynsec(self) -> tuple[str, list[bytes]]:
        from mqttbroker.security.dynsec import Dynsec, save_state

        state = Dynsec(101)
        commands = [
            {"command": "createClient", "username": f"user{i}", "password": "pw"}
            for i in range(self.count)
        ]
        state.handle_document({"commands": commands})
        path = self.work / "dynsec.json"
        save_state(path, state)
        packets = [connect_packet(self.ids[i], f"user{i}", b"pw") for i in range(self.count)]
        config = f'[dynsec]\nenabled = true\niterations = 101\nimport_file = "{path}"\n'
        return config, packets

    def jwt(self, alg: str) -> tuple[str, list[bytes]]:
        import jwt
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

        key: Any
        if alg == "RS256":
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        elif alg == "ES256":
            key = ec.generate_private_key(ec.SECP256R1())
        else:
            key = ed25519.Ed25519PrivateKey.generate()
        path = self.work / f"{alg}.pem"
        path.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        exp = int(time.time() + 3600)
        packets = [
            connect_packet(
                client_id,
                "u",
                jwt.encode({"sub": client_id, "exp": exp}, key, algorithm=alg).encode(),
            )
            for client_id in self.ids
        ]
        config = f'[jwt]\nenabled = true\nalgorithms = ["{alg}"]\npublic_key_file = "{path}"\n'
        return config, packets

    def http(self, cached: bool) -> tuple[str, list[bytes]]:
        ids = [self.ids[i % CONCURRENCY] for i in range(self.count)] if cached else self.ids
        packets = [connect_packet(client_id, client_id, b"pw") for client_id in ids]
        return f'[http_auth]\nenabled = true\nurl = "{self.service}/auth"\n', packets

    def acl(self) -> str:
        path = self.work / "acl"
        path.write_text("pattern readwrite bench/#\n")
        return f'[security]\nacl_file = "{path}"\nallow_anonymous = true\n'

    def http_rights(self, ttl: float) -> str:
        return f'[http_auth]\nenabled = true\nacl_url = "{self.service}/acl"\ncache_ttl = {ttl}\n'


def start_service(port: int, pin: bool) -> subprocess.Popen[bytes]:
    cmd = br.pinned(br.GENERATOR_CORE, [sys.executable, "-c", SERVICE, str(port)], pin)
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 15
    while not br.port_open("127.0.0.1", port):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the HTTP auth service did not start")
        time.sleep(0.05)
    return proc


def measure(config: str, pin: bool, run: Callable[[str, int], Any]) -> float:
    handle = br.start_ours(pin, V311, "ours", config, "mqttbroker")
    try:
        return float(asyncio.run(run(handle.host, handle.port)))
    finally:
        handle.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--connects", type=int, default=2000)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--no-pin", action="store_true")
    args = parser.parse_args()
    pin = br.pinning_available() and not args.no_pin
    if pin:
        os.sched_setaffinity(0, {br.GENERATOR_CORE})
    service_port = br.free_port()
    service = start_service(service_port, pin)
    results: dict[str, list[float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
            setup = Setup(Path(tmp), args.connects, service_port)
            anonymous = [connect_packet(i, None, None) for i in setup.ids]
            logins: dict[str, tuple[str, list[bytes]]] = {
                "anonymous": ("", anonymous),
                "password_file": setup.password_file(),
                "dynsec": setup.dynsec(),
                "jwt RS256": setup.jwt("RS256"),
                "jwt ES256": setup.jwt("ES256"),
                "jwt EdDSA": setup.jwt("EdDSA"),
                "http (a call each)": setup.http(cached=False),
                "http (cached)": setup.http(cached=True),
            }
            cycled = lambda i, n: f"bench/{i}/{n % 100}"  # noqa: E731
            fresh = lambda i, n: f"bench/{i}/{n}"  # noqa: E731
            rights: dict[str, tuple[str, Callable[[int, int], str]]] = {
                "no rights checked": ("", cycled),
                "ACL file, 100 topics": (setup.acl(), cycled),
                "ACL file, a new topic each": (setup.acl(), fresh),
                "HTTP acl_url, 100 topics (cached)": (setup.http_rights(60.0), cycled),
                "HTTP acl_url, a new topic each, cache_ttl 0": (setup.http_rights(0.0), fresh),
            }
            for run in range(args.runs):
                for name, (config, packets) in logins.items():
                    rate = measure(config, pin, partial(connects, packets=packets))
                    results.setdefault(f"connect: {name}", []).append(rate)
                    print(f"run {run + 1}: connect {name}: {rate:,.0f}/s", flush=True)
                for name, (config, topics) in rights.items():
                    run_it = partial(publishes, topics=topics, seconds=args.duration)
                    rate = measure(config, pin, run_it)
                    results.setdefault(f"publish: {name}", []).append(rate)
                    print(f"run {run + 1}: publish {name}: {rate:,.0f}/s", flush=True)
    finally:
        service.terminate()
        service.wait(5)
    print(f"\n| | median of {args.runs} (per second) | runs |\n|---|---:|---|")
    for name, rates in results.items():
        runs = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"| {name} | {statistics.median(rates):,.0f} | {runs} |")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"auth_sources-{stamp}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

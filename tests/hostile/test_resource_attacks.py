"""Resource attacks on a real broker, each bounded to seconds: what one client sends must not
exhaust the broker's memory or its event loop. While each attack runs, a control client's
publish/subscribe round trip keeps working, and the broker's RSS stays under a stated bound
(generous; the attacks as they were took it far past it). Traffic stays on loopback."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cleanup import ended_after
from support.clients import (
    PahoClient,
    RawClient,
    closed_by_peer,
    connect_packet,
    packet,
    parse_connack,
    parse_disconnect_v5,
    publish_packet,
    subscribe_packet,
    unique,
    utf8,
    vbi,
)
from support.launcher import rss_bytes, write_file

MIB = 1024 * 1024
RSS_BOUND = 100 * MIB  # growth allowed while an attack runs
ATTACK_SECONDS = 3.0  # how long the control client keeps working under each attack


class Control:
    """A subscriber and a publisher on a topic of their own: one round trip at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.topic = f"control/{unique()}"
        self.receiver = PahoClient(host, port)
        self.receiver.connect()
        self.receiver.subscribe(self.topic, 1)
        self.sender = PahoClient(host, port)
        self.sender.connect()
        self.count = 0

    def round_trip(self) -> None:
        self.count += 1
        payload = f"ping {self.count}".encode()
        self.sender.publish(self.topic, payload, 1)
        self.receiver.wait_payload(payload, timeout=10)

    def close(self) -> None:
        self.sender.close()
        self.receiver.close()


@pytest.fixture
def controlled_broker(
    start_broker: Callable[..., Any], tmp_path: Path
) -> Iterator[Callable[[str], tuple[Any, Control]]]:
    """``controlled_broker(config_text)``: a broker (memory store) with that config, and a
    control client pair on it (closed after the test)."""
    count = itertools.count()
    with ended_after(Control.close) as keep:

        def run(config: str) -> tuple[Any, Control]:
            path = write_file(tmp_path / f"broker{next(count)}.toml", config)
            server = start_broker(extra_args=("--config", str(path), "--memory"))
            control = keep(Control(server.host, server.port))
            control.round_trip()
            return server, control

        yield run


def under_attack(server: Any, control: Control, baseline: int) -> int:
    """Keep the control client's round trip going for ATTACK_SECONDS while the attack runs;
    the broker's largest RSS growth (bytes) seen meanwhile."""
    pid = server.proc.pid
    peak = 0
    until = time.monotonic() + ATTACK_SECONDS
    while time.monotonic() < until:
        control.round_trip()
        peak = max(peak, rss_bytes(pid) - baseline)
        time.sleep(0.05)
    return max(peak, rss_bytes(pid) - baseline)


def non_reader(host: str, port: int) -> socket.socket:
    """A socket whose owner never reads: a small receive buffer, so the broker's output for it
    stays with the broker."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((host, port))
    return sock


# -- 2: retained messages amplified by SUBSCRIBEs of a client that never reads ---------------


def test_subscribes_of_a_non_reader_do_not_copy_the_retained_set(
    controlled_broker: Callable[[str], tuple[Any, Control]],
) -> None:
    """40 SUBSCRIBEs to 5 MB of retained messages used to queue 40 copies (200 MB) at once.
    They are now sent as the client reads: it does not, so its output stops at the high-water
    mark and so does reading its input. A reading subscriber still gets every retained message
    (more than one event-loop pass's share)."""
    server, control = controlled_broker("")
    publisher = PahoClient(server.host, server.port)
    publisher.connect()
    base = f"ret/{unique()}"
    for index in range(50):
        publisher.publish(f"{base}/{index}", bytes([index]) * 100_000, 1, retain=True)
    baseline = rss_bytes(server.proc.pid)

    attacker = non_reader(server.host, server.port)
    attacker.sendall(connect_packet(unique("amp"), 5, 60, True))
    attacker.sendall(b"".join(subscribe_packet(i, [(f"{base}/#", 0)], 5) for i in range(1, 41)))
    growth = under_attack(server, control, baseline)
    assert growth < RSS_BOUND, f"RSS grew by {growth // MIB} MiB under the SUBSCRIBE flood"

    reader = PahoClient(server.host, server.port)
    reader.connect()
    reader.subscribe(f"{base}/#", 0)
    got = reader.wait_messages(50, timeout=30)
    assert sorted(m.payload for m in got) == sorted(bytes([i]) * 100_000 for i in range(50))
    assert all(m.retain for m in got)
    attacker.close()
    reader.close()
    publisher.close()


# -- 7: replies to a client that sends but never reads -----------------------------------------


def test_a_client_that_never_reads_its_replies_is_no_longer_read(
    controlled_broker: Callable[[str], tuple[Any, Control]],
) -> None:
    """PINGREQs from a client that does not read its PINGRESPs: once its output is over the
    high-water mark the broker stops reading from it (its sends stall) instead of buffering
    every answer; the control client is served meanwhile."""
    server, control = controlled_broker("")
    baseline = rss_bytes(server.proc.pid)
    attacker = non_reader(server.host, server.port)
    attacker.sendall(connect_packet(unique("ping"), 5, 0, True))
    chunk = b"\xc0\x00" * 262_144  # 512 KiB of PINGREQ
    sent = 0
    stalled = False
    attacker.setblocking(False)
    quiet_since = time.monotonic()
    while sent < 40 * MIB:
        try:
            sent += attacker.send(chunk[sent % len(chunk) :])  # whole packets, in order
            quiet_since = time.monotonic()
        except BlockingIOError:
            if time.monotonic() - quiet_since > 2.0:  # nothing taken for 2 s: reading stopped
                stalled = True
                break
            time.sleep(0.02)
    assert stalled, f"the broker read all {sent // MIB} MiB of PINGREQ of a client not reading"
    growth = under_attack(server, control, baseline)
    assert growth < RSS_BOUND, f"RSS grew by {growth // MIB} MiB"

    # Once it reads, the broker reads from it again.
    attacker.setblocking(True)
    reading = threading.Event()

    def drain() -> None:
        reading.set()
        try:
            while attacker.recv(1 << 20):
                pass
        except OSError:
            pass

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    reading.wait(5)
    attacker.settimeout(20)
    attacker.sendall(chunk[sent % len(chunk) :] + chunk * 2)  # 1 MiB more, taken
    attacker.close()


# -- 3 and 11: before authentication, only a small CONNECT ------------------------------------


@pytest.mark.parametrize("version", [5, 4])
def test_a_large_connect_is_refused_from_its_fixed_header(broker: Any, version: int) -> None:
    """A CONNECT announcing 1 MB is answered (MQTT 5: CONNACK 0x95) and closed as soon as its
    fixed header and protocol level arrived; the rest is never awaited or held."""
    start = connect_packet(unique("big"), version, 60, True)[2:]  # the body's first bytes
    with RawClient(broker.host, broker.port, timeout=5) as raw:
        raw.send(b"\x10" + vbi(1_000_000) + start)
        data = raw.read_until_closed(timeout=5)
    if version == 5:
        assert data[:1] == b"\x20", data.hex(" ")
        _, code, _ = parse_connack(data, 5)
        assert code == 0x95
    else:
        assert data == b""  # 3.1.1 has no code for it: closed


def user_properties(count: int) -> bytes:
    return b"".join(b"\x26" + utf8("") + utf8("") for _ in range(count))


def test_a_connect_with_many_user_properties_is_refused(broker: Any) -> None:
    """3,000 empty User Properties fit in 16 KB: refused with 0x83 (valid, but past this
    implementation's limit) after decoding no more than the limit allows."""
    with RawClient(broker.host, broker.port) as raw:
        raw.send(connect_packet(unique("props"), properties=user_properties(3000)))
        _, code, _ = parse_connack(raw.read_packet(), 5)
        assert code == 0x83
        raw.read_until_closed()


def test_a_publish_with_too_many_user_properties_is_refused(broker: Any) -> None:
    props = user_properties(65)  # one past the default max_user_properties
    with RawClient(broker.host, broker.port) as raw:
        raw.connect(unique("pubprops"))
        raw.send(publish_packet("t/props", b"payload", properties=props))
        code, _ = parse_disconnect_v5(raw.read_packet())
        assert code == 0x83
        raw.read_until_closed()


def test_partial_large_connects_hold_nothing(
    controlled_broker: Callable[[str], tuple[Any, Control]],
) -> None:
    """150 connections each sending most of a 1 MB CONNECT used to hold 150 MB until the
    CONNECT timeout; each is now refused from its fixed header."""
    server, control = controlled_broker("[broker]\nconnect_timeout = 30.0\n")
    baseline = rss_bytes(server.proc.pid)
    body = b"\x00\x04MQTT\x05\x02\x00\x3c" + b"\x00" * (1_000_000 - 10)
    partial = (b"\x10" + vbi(1_000_000) + body)[:-1]  # one byte short
    sockets: list[socket.socket] = []

    def attack() -> None:
        for _ in range(150):
            sock = socket.create_connection((server.host, server.port), timeout=10)
            sockets.append(sock)
            try:
                sock.sendall(partial)
            except OSError:
                pass  # refused and closed while we were still sending: the point

    thread = threading.Thread(target=attack, daemon=True)
    thread.start()
    growth = under_attack(server, control, baseline)
    thread.join(60)
    growth = max(growth, rss_bytes(server.proc.pid) - baseline)
    assert growth < RSS_BOUND, f"RSS grew by {growth // MIB} MiB"
    until = time.monotonic() + 10
    assert all(closed_by_peer(sock, until) for sock in sockets)
    for sock in sockets:
        sock.close()


# -- 4: long topics and the caches ----------------------------------------------------------


def test_a_topic_longer_than_the_default_limit_is_invalid(broker: Any) -> None:
    """max_topic_length is 4,096 characters by default (the spec allows 65,535)."""
    with RawClient(broker.host, broker.port) as raw:
        raw.connect(unique("long"))
        raw.send(publish_packet("t/" + "x" * 5000, b"p", 1, packet_id=1))
        code, _ = parse_disconnect_v5(raw.read_packet())
        assert code == 0x90
        raw.read_until_closed()


def test_long_topics_do_not_fill_memory(
    controlled_broker: Callable[[str], tuple[Any, Control]], tmp_path: Path
) -> None:
    """Distinct 60 KB topics: a client without publish rights used to fill the match cache
    (about 118 KB per topic) and its own cache of rights; one with rights filled the match
    cache, bounded by entries only. Now a denied topic is not cached, the match cache is
    bounded by bytes, and the rights cache by characters."""
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite control/#\ntopic write free/#\n")
    server, control = controlled_broker(
        f"[security]\nacl_file = '{acl}'\nallow_anonymous = true\n"
        "[broker]\nmax_topic_length = 65535\nmatch_cache_bytes = 16777216\n"
    )
    baseline = rss_bytes(server.proc.pid)
    level = "x" * 60_000

    def attack(prefix: str) -> None:
        with socket.create_connection((server.host, server.port), timeout=10) as sock:
            sock.sendall(connect_packet(unique("topics"), 5, 60, True))
            for start in range(0, 1500, 50):
                sock.sendall(
                    b"".join(
                        publish_packet(f"{prefix}/{level}/{i}", b"", 0)
                        for i in range(start, start + 50)
                    )
                )
            sock.sendall(b"\xe0\x00")  # DISCONNECT: then the broker closes
            closed_by_peer(sock, time.monotonic() + 30)

    threads = [
        threading.Thread(target=attack, args=(prefix,), daemon=True)
        for prefix in ("denied", "free")
    ]
    for thread in threads:
        thread.start()
    growth = under_attack(server, control, baseline)
    for thread in threads:
        thread.join(60)
    growth = max(growth, rss_bytes(server.proc.pid) - baseline)
    assert growth < RSS_BOUND, f"RSS grew by {growth // MIB} MiB"


# -- 10: one SUBSCRIBE with a great many filters ------------------------------------------------


def test_a_subscribe_with_more_filters_than_allowed_is_refused_whole(broker: Any) -> None:
    """90,000 filters, past max_subscriptions_per_client (1,000): DISCONNECT 0x97 Quota
    exceeded and one log line, not a line per filter."""
    client_id = unique("filters")
    mark = broker.log_mark()
    with RawClient(broker.host, broker.port) as raw:
        raw.connect(client_id)
        filters = b"".join(utf8(f"f/{i}") + b"\x00" for i in range(90_000))
        raw.send(packet(0x82, b"\x00\x01\x00" + filters))
        code, _ = parse_disconnect_v5(raw.read_packet(timeout=20))
        assert code == 0x97
        raw.read_until_closed()
    lines = [line for line in broker.log_since(mark).splitlines() if client_id in line]
    assert len(lines) <= 3, f"{len(lines)} log lines, e.g. {lines[-1]}"


def test_an_unsubscribe_with_more_filters_than_allowed_is_refused_whole(broker: Any) -> None:
    """The same for UNSUBSCRIBE, whose 90,000 filters took the general decoder over a second:
    refused by the fast decoder as soon as the filter past the limit starts."""
    with RawClient(broker.host, broker.port) as raw:
        raw.connect(unique("unfilters"))
        filters = b"".join(utf8(f"f/{i}") for i in range(90_000))
        raw.send(packet(0xA2, b"\x00\x01\x00" + filters))
        code, _ = parse_disconnect_v5(raw.read_packet(timeout=20))
        assert code == 0x97
        raw.read_until_closed()


# -- 11: connections per address on a listener reachable from other machines ---------------


def test_connections_per_address_are_limited_by_default_off_loopback(
    start_broker: Callable[..., Any], tmp_path: Path
) -> None:
    """max_connections_per_address is 64 by default on a listener other machines can reach
    (here one on every interface); a loopback listener is not limited."""
    config = tmp_path / "listeners.toml"
    config.write_text(
        "[broker]\nconnect_timeout = 30.0\n"
        "[[listener]]\nhost = '0.0.0.0'\nport = 0\n"
        "[[listener]]\nhost = '127.0.0.1'\nport = 0\n"
    )
    server = start_broker(extra_args=("--config", str(config), "--memory"))
    assert server.wait_for_log(r"listening on 127\.0\.0\.1:") is not None
    ports = [
        int(line.split(":")[-1].split()[0]) for line in server.log_lines() if "listening" in line
    ]
    open_port, loopback_port = ports
    held: list[socket.socket] = []
    try:
        for port in (open_port, loopback_port):
            for _ in range(64):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        # All 128 accepted (and left open, waiting for their CONNECT).
        assert not any(closed_by_peer(sock, time.monotonic() + 0.2) for sock in held[62:66])
        over_open = socket.create_connection(("127.0.0.1", open_port), timeout=10)
        held.append(over_open)
        assert closed_by_peer(over_open, time.monotonic() + 5), "65th connection not refused"
        over_loopback = socket.create_connection(("127.0.0.1", loopback_port), timeout=10)
        held.append(over_loopback)
        assert not closed_by_peer(over_loopback, time.monotonic() + 0.5)
        assert "max_connections_per_address (64) reached for 127.0.0.1" in server.log_text()
    finally:
        for sock in held:
            sock.close()

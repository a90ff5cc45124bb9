"""Clients of persistent sessions that leave at once: DISCONNECT and close without waiting for
the CONNACK, and a storm of connections taking one session over from each other. The broker,
on its SQLite store, holds the acknowledgements until they are committed; the socket is gone by
then, and that is normal: the log has no ERROR and no traceback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from helpers import DISCONNECT, MQTT_5, TIMEOUT, assert_broker_healthy, connect_packet, unique

EXPIRY_HOUR = bytes((0x11,)) + (3600).to_bytes(4, "big")  # Session Expiry Interval 3600


def _connect_bytes(client_id: str) -> bytes:
    return connect_packet(client_id, MQTT_5, clean=False, properties=EXPIRY_HOUR)


def _assert_clean_log(server: Any, since: int) -> None:
    log = server.log_since(since)
    assert "Traceback" not in log, f"the broker logged a traceback:\n{log[-3000:]}"
    assert " ERROR " not in log, f"the broker logged an ERROR:\n{log[-3000:]}"


def test_disconnect_and_close_at_once_logs_no_error(
    start_broker: Callable[..., Any],
) -> None:
    server = start_broker()  # the SQLite store
    mark = server.log_mark()
    ids = [unique("leaver") for _ in range(5)]
    for _round in range(4):
        for client_id in ids:
            with socket.create_connection((server.host, server.port)) as sock:
                sock.sendall(_connect_bytes(client_id) + DISCONNECT)
    last = ids[-1]
    assert server.wait_for_log(rf"client {last} disconnected", since=mark) is not None
    # A QoS 1 round trip on another client: it waits for a commit after the ones above.
    assert_broker_healthy(server, since=mark)
    _assert_clean_log(server, mark)
    left = [
        line for line in server.log_since(mark).splitlines() if "disconnected (reason 0x00)" in line
    ]
    assert sum(any(f"client {c} " in line for c in ids) for line in left) == 4 * len(ids)


def test_takeover_storm_logs_no_error(start_broker: Callable[..., Any]) -> None:
    server = start_broker()
    mark = server.log_mark()
    client_id = unique("storm")

    def storm() -> None:
        open_socks: list[socket.socket] = []
        for _ in range(60):
            sock = socket.create_connection((server.host, server.port))
            sock.sendall(_connect_bytes(client_id))
            open_socks.append(sock)
            if len(open_socks) > 2:
                open_socks.pop(0).close()
        for sock in open_socks:
            sock.close()

    threads = [threading.Thread(target=storm) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    connected = f"client {client_id} connected"
    deadline = time.monotonic() + TIMEOUT
    while server.log_since(mark).count(connected) < 180 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.log_since(mark).count(connected) == 180
    assert_broker_healthy(server, since=mark)
    _assert_clean_log(server, mark)

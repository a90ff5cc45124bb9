"""Clients of persistent sessions that leave at once: DISCONNECT and close without waiting for
the CONNACK, and a storm of connections taking one session over from each other. The broker,
on its SQLite store, holds the acknowledgements until they are committed; the socket is gone by
then, and that is normal: the log has no ERROR and no traceback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.clients import (
    DISCONNECT,
    TIMEOUT,
    assert_broker_healthy,
    connect_packet,
    unique,
    wait_for,
)

EXPIRY_HOUR = bytes((0x11,)) + (3600).to_bytes(4, "big")  # Session Expiry Interval 3600


def _assert_clean_log(server: Any, since: int) -> None:
    log = server.log_since(since)
    assert "Traceback" not in log, f"the broker logged a traceback:\n{log[-3000:]}"
    assert " ERROR " not in log, f"the broker logged an ERROR:\n{log[-3000:]}"


def _wait_count(server: Any, mark: int, texts: list[str], count: int) -> None:
    """Wait until the log (after ``mark``) has ``count`` lines containing one of ``texts``."""

    def seen() -> int:
        lines = server.log_since(mark).splitlines()
        return sum(any(text in line for text in texts) for line in lines)

    wait_for(lambda: seen() >= count, f"{count} lines of {texts}", TIMEOUT)
    assert seen() == count, server.log_since(mark)[-3000:]


def test_disconnect_and_close_at_once_logs_no_error(
    start_broker: Callable[..., Any],
) -> None:
    server = start_broker()  # the SQLite store
    mark = server.log_mark()
    ids = [unique("leaver") for _ in range(5)]
    for _round in range(4):
        for client_id in ids:
            with socket.create_connection((server.host, server.port)) as sock:
                sock.sendall(
                    connect_packet(client_id, clean=False, properties=EXPIRY_HOUR) + DISCONNECT
                )
    _wait_count(server, mark, [f"client {c} disconnected (reason 0x00)" for c in ids], 4 * len(ids))
    # A QoS 1 round trip on another client: it waits for a commit after the ones above.
    assert_broker_healthy(server, since=mark)
    _assert_clean_log(server, mark)


def test_takeover_storm_logs_no_error(start_broker: Callable[..., Any], tmp_path: Path) -> None:
    # Every connection's line is counted below: no rate limit on them (connection_log_rate).
    config = tmp_path / "every-line.toml"
    config.write_text("[broker]\nconnection_log_rate = 0\n")
    server = start_broker(extra_args=("--config", str(config)))
    mark = server.log_mark()
    client_id = unique("storm")

    def storm() -> None:
        open_socks: list[socket.socket] = []
        for _ in range(60):
            sock = socket.create_connection((server.host, server.port))
            sock.sendall(connect_packet(client_id, clean=False, properties=EXPIRY_HOUR))
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
    _wait_count(server, mark, [f"client {client_id} connected"], 180)
    assert_broker_healthy(server, since=mark)
    _assert_clean_log(server, mark)

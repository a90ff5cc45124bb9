"""A remote that takes the bridge's TCP connection and drops it before its CONNACK (a broker
at its connection limit or shutting down, a load balancer with no backend): the bridge says why
and goes on trying, with backoff, however the connection ended."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.clients import wait_for
from support.webhook_rig import write_config


class DroppingRemote:
    """A TCP listener on loopback that ends every connection it accepts: ``"close"`` once the
    CONNECT has arrived (an orderly close), ``"reset"`` at once (a reset)."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed: the test is over
                return
            self.accepted += 1
            with conn:
                if self.how == "close":
                    conn.recv(65536)
                else:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # (wakes the accept(): close alone does not)
        self.listener.close()
        self._thread.join(5)


@pytest.fixture(params=["close", "reset"])
def remote(request: pytest.FixtureRequest) -> Iterator[DroppingRemote]:
    server = DroppingRemote(request.param)
    yield server
    server.close()


def test_the_bridge_goes_on_trying_a_remote_that_drops_it(
    tmp_path: Path, start_broker: Callable[..., Any], remote: DroppingRemote
) -> None:
    config = (
        f'[[bridge]]\nname = "m"\naddress = "127.0.0.1:{remote.port}"\n'
        '[[bridge.topic]]\nfilter = "up/#"\ndirection = "out"\n'
    )
    ours = start_broker(extra_args=write_config(tmp_path / "b.toml", config))
    why = {
        "close": "the remote broker closed the connection",
        "reset": "(Connection reset by peer|the remote broker (closed|reset) the connection)",
    }[remote.how]
    assert ours.wait_for_log(rf"bridge m: cannot connect: {why} \(127\.0\.0\.1:", 20), (
        ours.log_text()
    )
    # (the first tries come within a few seconds: 0.5 s, doubling, randomised down to half)
    wait_for(lambda: remote.accepted >= 4, "the bridge's fourth try", timeout=30)
    assert "internal error" not in ours.log_text()
    assert "Traceback" not in ours.log_text()

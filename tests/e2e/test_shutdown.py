"""Stopping the broker with a signal: MQTT 5 clients are told (DISCONNECT 0x8B), everyone is
disconnected, and the process exits 0."""

from __future__ import annotations

import signal

import pytest
from support.clients import (
    MQTT_5,
    MQTT_311,
    PahoClient,
    RawClient,
    connect_packet,
    decode_vbi,
    parse_disconnect_v5,
    unique,
)

SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGINT, id="SIGINT")]
EXIT_TIMEOUT = 10.0  # a guard


@pytest.mark.parametrize("signum", SIGNALS)
def test_signal_disconnects_clients_with_0x8b_and_exits_0(fresh_broker, signum):
    """[MQTT-3.14.2-1] [MQTT-3.14.0-1] On SIGTERM/SIGINT an MQTT 5 client receives DISCONNECT
    0x8B (Server shutting down) and then the close; a 3.1.1 client is closed without a packet; a
    connection that has not sent CONNECT yet gets no DISCONNECT; the process exits with 0."""
    v5 = RawClient(fresh_broker.host, fresh_broker.port)
    v311 = RawClient(fresh_broker.host, fresh_broker.port)
    early = RawClient(fresh_broker.host, fresh_broker.port)
    paho = PahoClient(fresh_broker.host, fresh_broker.port, MQTT_5)
    try:
        v5.connect(unique("v5"), MQTT_5)
        v311.connect(unique("v311"), MQTT_311)
        paho.connect()
        # Half a CONNECT: the broker knows this connection but it is not connected yet.
        early.send(connect_packet(unique("early"), MQTT_5)[:5])
        fresh_broker.send_signal(signum)

        data = v5.read_until_closed()
        assert data[:1] == b"\xe0", f"expected a DISCONNECT, got {data.hex(' ')}"
        _, reason_at = decode_vbi(data, 1)
        assert data[reason_at] == 0x8B, f"expected reason 0x8B, got {data.hex(' ')}"
        code, props = parse_disconnect_v5(data)
        assert code == 0x8B

        assert v311.read_until_closed() == b"", "3.1.1 has no DISCONNECT from the server"
        assert early.read_until_closed() == b"", "no DISCONNECT before a CONNACK"
        gone = paho.wait_disconnected()
        assert gone.from_server and gone.reason_code == 0x8B, gone

        assert fresh_broker.wait_exit(EXIT_TIMEOUT) == 0
    finally:
        for raw in (v5, v311, early):
            raw.close()
        paho.close()
    log = fresh_broker.log_text()
    assert fresh_broker.wait_for_log(r"listening on 127\.0\.0\.1:\d+", 0), log
    assert fresh_broker.wait_for_log(r"\bstopped\b", 0), log
    assert "Traceback" not in log, log


def test_sigterm_right_after_the_listening_line_stops_cleanly(start_broker):
    """A SIGTERM sent as soon as the broker has logged that it listens (what a supervisor or a
    test does once the broker is ready) stops it cleanly: exit code 0, "stopped" logged, not
    killed by the signal's default action. Three brokers, to give a start-up race three chances
    to show."""
    for attempt in range(3):
        process = start_broker()
        process.send_signal(signal.SIGTERM)
        code = process.wait_exit(EXIT_TIMEOUT)
        log = process.log_text()
        assert code == 0, f"attempt {attempt}: exit code {code}; log:\n{log}"
        assert process.wait_for_log(r"\bstopped\b", 0), log
        assert "Traceback" not in log, log

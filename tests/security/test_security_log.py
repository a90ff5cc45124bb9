"""The broker's log as a security record, read from a real broker's stderr: client-supplied
strings cannot forge log lines, and logins, refusals and denials are logged with who, from where
and how."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from helpers import MQTT_5, TIMEOUT, RawClient, parse_connack, unique
from security_support import ITERATIONS, connect_bytes

from mqttbroker.logformat import escape
from mqttbroker.security.passwords import make_entry_line


def test_escape_writes_control_characters_out() -> None:
    assert escape("plain é") == "plain é"
    assert escape("a\nb\rc\td\x1b[31m\x00\x7f\x85\u2028") == (
        "a\\nb\\rc\\td\\x1b[31m\\x00\\x7f\\x85\\u2028"
    )


def test_client_strings_cannot_forge_log_lines(
    tmp_path: Path, start_broker: Callable[..., Any]
) -> None:
    """A client id and a user name with a newline: before authentication (a refused login) and
    after it (the "connected" line), nothing the client sent starts a line of its own."""
    passwords = tmp_path / "pw.txt"
    passwords.write_text(make_entry_line("alice", b"alice-pw", ITERATIONS) + "\n")
    config = tmp_path / "broker.toml"
    config.write_text(f"[security]\npassword_file = {str(passwords)!r}\nallow_anonymous = true\n")
    broker = start_broker(extra_args=("--config", str(config), "--memory"))
    mark = broker.log_mark()
    tag = unique("inj")
    attempts = [
        (f"{tag}\nFAKE ERROR mqttbroker: forged one", "alice", b"wrong", 0x86),
        (f"{tag}\r\nFAKE ERROR mqttbroker: forged two", "alice\nFAKE user", b"x", 0x86),
        (f"{tag}\nFAKE ERROR mqttbroker: forged three", None, None, 0),
    ]
    for client_id, username, password, expected in attempts:
        with RawClient(broker.host, broker.port) as raw:
            raw.send(connect_bytes(client_id, MQTT_5, username=username, password=password))
            _, code, _ = parse_connack(raw.read_packet(), MQTT_5)
            assert code == expected
    found = broker.wait_for_log(r"forged three.* connected from", TIMEOUT, since=mark)
    assert found is not None, broker.log_since(mark)
    log = broker.log_since(mark)
    lines = log.splitlines()
    assert not [line for line in lines if line.startswith("FAKE")], log
    assert sum(tag in line for line in lines) >= 3, log
    assert f"{tag}\\nFAKE ERROR" in log, log

"""The broker's log as a security record, read from a real broker's stderr: client-supplied
strings cannot forge log lines, and logins, refusals and denials are logged with who, from where
and how."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.clients import (
    MQTT_5,
    TIMEOUT,
    RawClient,
    connack_code,
    connect_packet,
    parse_connack,
    publish_packet,
    subscribe_packet,
    unique,
)
from support.password_files import password_file, security_config


def test_client_strings_cannot_forge_log_lines(
    tmp_path: Path, start_broker: Callable[..., Any]
) -> None:
    """A client id and a user name with a newline: before authentication (a refused login) and
    after it (the "connected" line), nothing the client sent starts a line of its own."""
    passwords = password_file(tmp_path / "pw.txt", {"alice": b"alice-pw"})
    broker = start_broker(
        extra_args=(*security_config(passwords, "allow_anonymous = true\n"), "--memory")
    )
    mark = broker.log_mark()
    tag = unique("inj")
    attempts = [
        (f"{tag}\nFAKE ERROR mqttbroker: forged one", "alice", b"wrong", 0x86),
        (f"{tag}\r\nFAKE ERROR mqttbroker: forged two", "alice\nFAKE user", b"x", 0x86),
        (f"{tag}\nFAKE ERROR mqttbroker: forged three", None, None, 0),
    ]
    for client_id, username, password, expected in attempts:
        with RawClient(broker.host, broker.port) as raw:
            raw.send(connect_packet(client_id, MQTT_5, username=username, password=password))
            _, code, _ = parse_connack(raw.read_packet(), MQTT_5)
            assert code == expected
    found = broker.wait_for_log(r"forged three.* connected from", TIMEOUT, since=mark)
    assert found is not None, broker.log_since(mark)
    log = broker.log_since(mark)
    lines = log.splitlines()
    assert not [line for line in lines if line.startswith("FAKE")], log
    assert sum(tag in line for line in lines) >= 3, log
    assert f"{tag}\\nFAKE ERROR" in log, log


# -- security events --------------------------------------------------------------------------


def secure_broker(tmp_path: Path, start_broker: Callable[..., Any]) -> Any:
    passwords = password_file(tmp_path / "pw.txt", {"alice": b"alice-pw"})
    acl = tmp_path / "acl.txt"
    acl.write_text("user alice\ntopic readwrite alice/#\n")
    more = f"acl_file = {str(acl)!r}\nallow_anonymous = false\n"
    return start_broker(extra_args=(*security_config(passwords, more), "--memory"))


def test_logins_and_refusals_name_user_client_and_address(
    tmp_path: Path, start_broker: Callable[..., Any]
) -> None:
    broker = secure_broker(tmp_path, start_broker)
    mark = broker.log_mark()
    good, bad, anonymous = unique("good"), unique("bad"), unique("anon")
    assert connack_code(broker, client_id=good, username="alice", password=b"alice-pw") == 0
    assert connack_code(broker, client_id=bad, username="alice", password=b"wrong") == 0x86
    assert connack_code(broker, client_id=anonymous) == 0x87
    address = r"127\.0\.0\.1:\d+"
    for pattern in (
        rf"INFO .*client {good} connected from {address} \(MQTT 5\.0 over TCP, user 'alice', ",
        rf"INFO .*client {bad} from 127\.0\.0\.1: bad password for known user 'alice'",
        rf"WARNING .*client {bad} from {address} \(user 'alice'\): authentication failed; "
        r"refused \(reason 0x86\)",
        rf"WARNING .*client {anonymous} from {address} \(user None\): .*refused \(reason 0x87\)",
    ):
        assert broker.wait_for_log(pattern, TIMEOUT, since=mark), (pattern, broker.log_since(mark))


def test_denied_publishes_and_subscriptions_are_logged_rate_limited(
    tmp_path: Path, start_broker: Callable[..., Any]
) -> None:
    """20 denied PUBLISHes and 20 denied SUBSCRIBEs on one connection: logged with user, client
    and address: the 1st, 2nd, 4th, 8th... of them (the count says how many so far)."""
    broker = secure_broker(tmp_path, start_broker)
    mark = broker.log_mark()
    client_id = unique("denied")
    with RawClient(broker.host, broker.port) as raw:
        raw.send(connect_packet(client_id, MQTT_5, username="alice", password=b"alice-pw"))
        assert parse_connack(raw.read_packet(), MQTT_5)[1] == 0
        for n in range(1, 21):
            raw.send(publish_packet("bob/secret", b"x", qos=1, packet_id=n))
            assert raw.read_packet()[0] == 0x40  # PUBACK (0x87)
            raw.send(subscribe_packet(n, [("bob/#", 0)]))
            assert raw.read_packet()[0] == 0x90  # SUBACK (0x87)
        assert broker.wait_for_log(r"\(32 refused so far\)", TIMEOUT, since=mark)
    log = broker.log_since(mark)
    lines = [line for line in log.splitlines() if "not authorized to" in line]
    prefix = rf"INFO .*client {client_id} from 127\.0\.0\.1:\d+ \(user 'alice'\): not authorized to"
    counts = []
    for line in lines:
        found = re.search(
            prefix + r" (publish to 'bob/secret'|subscribe to 'bob/#') \((\d+) refused", line
        )
        assert found is not None, line
        counts.append(int(found.group(2)))
    assert counts == [1, 2, 4, 8, 16, 32], log  # of 40

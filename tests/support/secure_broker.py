"""A secured broker for the session tests (ownership, limits, rules rechecked on restart): a
broker with a password file (alice, bob, admin), an ACL file and extra ``[broker]`` keys, run
as a real subprocess; persistent-session clients over paho and over raw sockets (for exact
CONNACK codes, 3.1.1 included)."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.clients import (
    MQTT_5,
    TIMEOUT,
    PahoClient,
    RawClient,
    connect_packet,
    parse_connack,
    prop,
    unique,
)
from support.password_files import password_file

PASSWORDS = {"alice": b"alice-pw", "bob": b"bob-pw", "admin": b"admin-pw"}

ACL = """\
topic readwrite anon/#

user alice
topic readwrite alice/#
topic read data/#

user bob
topic readwrite bob/#

user admin
topic readwrite #
"""

HOUR = 3600


class SecureBroker:
    """The files of a broker with users and rules, and a factory of its runs."""

    def __init__(self, tmp_path: Path, start_broker: Callable[..., Any]) -> None:
        self.dir = tmp_path
        self.start_broker = start_broker
        self.passwords = password_file(tmp_path / "pw.txt", PASSWORDS)
        self.acl = tmp_path / "acl.txt"
        self.acl.write_text(ACL)
        self.config = tmp_path / "broker.toml"
        self.data = tmp_path / "data"
        self.server: Any = None

    def start(self, broker_keys: str = "", memory: bool = True) -> Any:
        """Start the broker (``broker_keys``: lines of its [broker] table); on the SQLite
        store in the same data directory each time unless ``memory``."""
        self.config.write_text(
            "[security]\n"
            f"password_file = {str(self.passwords)!r}\n"
            f"acl_file = {str(self.acl)!r}\n"
            "allow_anonymous = true\n"
            "[broker]\n" + broker_keys + "\n"
        )
        args: tuple[str, ...] = ("--config", str(self.config))
        if memory:
            args += ("--memory",)
        self.server = self.start_broker(data_dir=self.data, extra_args=args)
        return self.server

    def sighup(self, *patterns: str) -> None:
        """SIGHUP, then wait for each pattern in the log."""
        mark = self.server.log_mark()
        self.server.send_signal(signal.SIGHUP)
        for pattern in patterns:
            found = self.server.wait_for_log(pattern, TIMEOUT, since=mark)
            assert found is not None, f"no {pattern!r} after SIGHUP:\n{self.server.log_text()}"


def assert_logged(server: Any, text: str, since: int) -> None:
    """Wait for a log line containing ``text`` (the log arrives through a pipe, after the
    client may already have seen the broker's answer)."""
    found = server.wait_for_log(re.escape(text), TIMEOUT, since=since)
    assert found is not None, f"no {text!r} in the log:\n{server.log_since(since)}"


def paho_client(
    server: Any,
    user: str | None,
    client_id: str,
    version: int = MQTT_5,
    expiry: int = HOUR,
    clean: bool = False,
) -> PahoClient:
    """A paho client of ``user`` on a persistent session (MQTT 5: Session Expiry Interval
    ``expiry``; 3.1.1: clean session 0), not yet connected."""
    client = PahoClient(server.host, server.port, version, client_id, clean=clean, expiry=expiry)
    if user is not None:
        client.client.username_pw_set(user, PASSWORDS[user])
    return client


def connack(
    server: Any,
    client_id: str,
    version: int = MQTT_5,
    user: str | None = None,
    clean: bool = False,
    expiry: int = HOUR,
) -> tuple[bool, int]:
    """Connect over a raw socket: (session present, CONNACK code). A refused client must be
    closed by the broker after its CONNACK; an accepted one disconnects normally."""
    with RawClient(server.host, server.port) as raw:
        raw.send(
            connect_packet(
                client_id,
                version,
                clean=clean,
                properties=prop(0x11, expiry.to_bytes(4, "big")) if expiry else b"",
                username=user,
                password=None if user is None else PASSWORDS[user],
            )
        )
        present, code, _ = parse_connack(raw.read_packet(), version)
        if code:
            assert raw.read_until_closed() == b"", "bytes after a refusing CONNACK"
        else:
            raw.send(b"\xe0\x00")
            raw.read_until_closed()
        return present, code


def offline_alice(server: Any, filters: list[str], topic: str, payload: bytes, version: int) -> str:
    """alice's persistent session, subscribed to ``filters`` and offline, with ``payload``
    published to ``topic`` by admin while she is away. Her client id."""
    client_id = unique("alice")
    alice = paho_client(server, "alice", client_id, version)
    try:
        alice.connect()
        for topic_filter in filters:
            assert alice.subscribe(topic_filter, 1) == [1]
    finally:
        alice.close()
    admin = paho_client(server, "admin", unique("admin"), clean=True, expiry=0)
    try:
        admin.connect()
        admin.publish(topic, payload, 1)
    finally:
        admin.close()
    return client_id

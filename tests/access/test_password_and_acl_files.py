"""End to end: the broker as a subprocess configured with a password file and an ACL file, paho
clients (MQTT 5 and 3.1.1) and raw sockets. Logins accepted and refused with the right codes,
SCRAM over TCP, ACL denials on PUBLISH, SUBSCRIBE, retained messages and wills, and SIGHUP
reloads (good and bad files) under live connections."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.clients import (
    MQTT_5,
    MQTT_311,
    TIMEOUT,
    PahoClient,
    RawClient,
    auth_packet,
    connack_code,
    connect_packet,
    parse_connack,
    parse_reason_and_properties,
    unique,
)
from support.launcher import run_broker
from support.password_files import ITERATIONS, mosquitto_pbkdf2_line
from support.scram_client import ScramClient

from mqttbroker.security.passwords import make_entry_line

ROOT = Path(__file__).resolve().parents[2]

ACL = """\
# anonymous clients
topic read public/#

user alice
topic readwrite alice/#
topic read sensors/#
topic deny sensors/secret/#
topic write sensors/alice/#

user admin
topic readwrite #

user roger
topic read public/#
"""


class Setup:
    """The files of one broker, and the broker."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.passwords = tmp_path / "pw.txt"
        self.acl = tmp_path / "acl.txt"
        self.config = tmp_path / "broker.toml"
        self.broker: Any = None

    def write_passwords(self, *lines: str) -> None:
        self.passwords.write_text("".join(line + "\n" for line in lines))

    def write_acl(self, text: str) -> None:
        self.acl.write_text(text)


USERS = [
    ("alice", b"alice-pw"),
    ("admin", b"admin-pw"),
]


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    s = Setup(tmp_path)
    s.write_passwords(
        *(make_entry_line(user, pw, ITERATIONS) for user, pw in USERS),
        mosquitto_pbkdf2_line("roger", b"roger-pw"),  # migrated from Mosquitto
    )
    s.write_acl(ACL)
    return s


@pytest.fixture
def secure_broker(setup: Setup, start_broker: Callable[..., Any]) -> Callable[[bool], Any]:
    def start(allow_anonymous: bool) -> Any:
        setup.config.write_text(
            "[security]\n"
            f"password_file = {str(setup.passwords)!r}\n"
            f"acl_file = {str(setup.acl)!r}\n"
            f"allow_anonymous = {'true' if allow_anonymous else 'false'}\n"
        )
        setup.broker = start_broker(extra_args=("--config", str(setup.config), "--memory"))
        return setup.broker

    return start


def publish_code(client: PahoClient, topic: str, payload: bytes) -> int:
    """QoS 1 PUBLISH; the PUBACK's reason code."""
    info = client.publish(topic, payload, 1, wait=False)
    return client.wait_published(info)


# -- logins -----------------------------------------------------------------------------------


def test_logins_accepted_and_refused(secure_broker: Any, paho: Any) -> None:
    broker = secure_broker(allow_anonymous=False)
    assert paho(broker, MQTT_5, "alice", b"alice-pw").connack[0] == 0
    assert paho(broker, MQTT_311, "alice", b"alice-pw").connack[0] == 0
    assert paho(broker, MQTT_5, "roger", b"roger-pw").connack[0] == 0  # Mosquitto $7$ entry
    # Bad user name or password: 0x86 in MQTT 5, return code 4 in 3.1.1.
    assert connack_code(broker, MQTT_5, username="alice", password=b"wrong") == 0x86
    assert connack_code(broker, MQTT_311, username="alice", password=b"wrong") == 4
    assert connack_code(broker, MQTT_5, username="nobody", password=b"alice-pw") == 0x86
    assert connack_code(broker, MQTT_5, username="alice") == 0x86  # no password
    assert connack_code(broker, MQTT_5, username="roger", password=b"Roger-pw") == 0x86
    # Anonymous access refused: 0x87 Not Authorized / 5.
    assert connack_code(broker, MQTT_5) == 0x87
    assert connack_code(broker, MQTT_311) == 5
    log = broker.log_text()
    assert "anonymous access refused" in log
    assert "alice-pw" not in log and "Roger-pw" not in log  # passwords are never logged
    assert "Traceback" not in log


@pytest.mark.parametrize("method", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_over_tcp(secure_broker: Any, method: str) -> None:
    broker = secure_broker(allow_anonymous=False)
    for password, expected in ((b"alice-pw", 0), (b"bad-pw", 0x86)):
        scram = ScramClient(method, "alice", password)
        with RawClient(broker.host, broker.port) as raw:
            raw.send(connect_packet(unique("scram"), auth_method=method, auth_data=scram.first()))
            code, props = parse_reason_and_properties(raw.read_packet(), 0xF0)
            assert code == 0x18
            assert props["AuthenticationMethod"] == method
            final = scram.final(props["AuthenticationData"])
            raw.send(auth_packet(0x18, method, final))
            code, props = parse_reason_and_properties(raw.read_packet(), 0x20)
            assert code == expected
            if expected == 0:
                assert scram.verify_server(props["AuthenticationData"])
            else:
                assert raw.read_until_closed() == b""


# -- ACL --------------------------------------------------------------------------------------


def test_publish_denied(secure_broker: Any, paho: Any) -> None:
    broker = secure_broker(allow_anonymous=True)
    admin = paho(broker, MQTT_5, "admin", b"admin-pw")
    assert admin.subscribe("sensors/#", 1) == [1]
    alice = paho(broker, MQTT_5, "alice", b"alice-pw")
    # QoS 1 to a topic alice may not write: PUBACK 0x87, nothing delivered.
    assert publish_code(alice, "sensors/bob/temp", b"denied-q1") == 0x87
    assert publish_code(alice, "sensors/secret/temp", b"denied-q1b") == 0x87
    assert publish_code(alice, "sensors/alice/temp", b"allowed-q1") == 0
    # QoS 0: dropped without a word; the connection stays.
    alice.publish("sensors/bob/temp", b"denied-q0", 0)
    alice.publish("sensors/alice/temp", b"allowed-q0", 0)
    # MQTT 3.1.1: no reason code in a PUBACK, but the message is dropped all the same.
    alice311 = paho(broker, MQTT_311, "alice", b"alice-pw")
    alice311.publish("sensors/bob/temp", b"denied-311", 1)
    alice311.publish("sensors/alice/temp", b"allowed-311", 1)
    got = admin.wait_payload(b"allowed-311")
    assert [m.payload for m in got] == [b"allowed-q1", b"allowed-q0", b"allowed-311"]
    # Anonymous clients may read public/# only.
    anonymous = paho(broker, MQTT_5)
    assert publish_code(anonymous, "public/news", b"x") == 0x87
    assert alice.disconnects == [] and alice311.disconnects == [] and anonymous.disconnects == []
    admin.sync()
    assert [m.payload for m in admin.received()] == [b"allowed-q1", b"allowed-q0", b"allowed-311"]


def test_subscribe_denied(secure_broker: Any, paho: Any) -> None:
    broker = secure_broker(allow_anonymous=True)
    alice = paho(broker, MQTT_5, "alice", b"alice-pw")
    expected = {
        "alice/#": 1,
        "sensors/public/#": 1,
        # reach sensors/secret/...: granted, those topics withheld (acl_partly_denied)
        "sensors/+/temp": 1,
        "sensors/#": 1,
        "$share/group/sensors/#": 1,
        "#": 0x87,  # no allowance covers it
        "sensors/secret/key": 0x87,  # denied whole
        "admin/x": 0x87,
        "$share/group/sensors/public/#": 1,
    }
    for topic_filter, code in expected.items():
        assert alice.subscribe(topic_filter, 1) == [code], topic_filter
    alice311 = paho(broker, MQTT_311, "alice", b"alice-pw")
    assert alice311.subscribe("sensors/secret/#", 1) == [0x80]
    assert alice311.subscribe("sensors/public/#", 1) == [1]
    anonymous = paho(broker, MQTT_5)
    assert anonymous.subscribe("public/#", 1) == [1]
    assert anonymous.subscribe("alice/#", 1) == [0x87]
    assert alice.disconnects == [] and anonymous.disconnects == []


def test_retained_message_not_delivered_to_a_client_that_may_not_read_it(
    secure_broker: Any, paho: Any
) -> None:
    broker = secure_broker(allow_anonymous=True)
    admin = paho(broker, MQTT_5, "admin", b"admin-pw")
    admin.publish("sensors/secret/key", b"s3cr3t", 1, retain=True)
    admin.publish("sensors/public/key", b"hello", 1, retain=True)
    # The control: someone allowed to read both gets both.
    watcher = paho(broker, MQTT_5, "admin", b"admin-pw")
    assert watcher.subscribe("sensors/+/key", 1) == [1]
    assert sorted(m.payload for m in watcher.wait_messages(2)) == [b"hello", b"s3cr3t"]
    alice = paho(broker, MQTT_5, "alice", b"alice-pw")
    assert alice.subscribe("sensors/secret/key", 1) == [0x87]
    assert alice.subscribe("sensors/+/key", 1) == [1]  # granted: the secret one withheld
    got = alice.wait_payload(b"hello")
    alice.sync()
    assert [(m.topic, m.payload, m.retain) for m in alice.received()] == [
        ("sensors/public/key", b"hello", True)
    ]
    assert got[0].payload == b"hello"


def test_will_not_published_to_a_denied_topic(secure_broker: Any, paho: Any) -> None:
    broker = secure_broker(allow_anonymous=True)
    admin = paho(broker, MQTT_5, "admin", b"admin-pw")
    assert admin.subscribe("sensors/#", 1) == [1]
    mark = broker.log_mark()
    for client_id, topic, payload in (
        ("will-denied", "sensors/bob/status", b"denied-will"),
        ("will-allowed", "sensors/alice/status", b"allowed-will"),
    ):
        raw = RawClient(broker.host, broker.port)
        raw.send(
            connect_packet(
                client_id,
                username="alice",
                password=b"alice-pw",
                will=(topic, payload),
                will_qos=1,
            )
        )
        assert parse_connack(raw.read_packet(), MQTT_5)[1] == 0
        raw.close()  # no DISCONNECT: the will is due
        if client_id == "will-denied":
            found = broker.wait_for_log(
                r"will of will-denied not published: not authorized", TIMEOUT, since=mark
            )
            assert found is not None, broker.log_since(mark)
    got = admin.wait_payload(b"allowed-will")
    admin.sync()
    assert [m.payload for m in admin.received()] == [b"allowed-will"]
    assert got[-1].topic == "sensors/alice/status"


# -- SIGHUP -----------------------------------------------------------------------------------


def reload(broker: Any, *patterns: str) -> None:
    """SIGHUP, then wait for each pattern in the log (after the signal)."""
    mark = broker.log_mark()
    broker.send_signal(signal.SIGHUP)
    for pattern in patterns:
        found = broker.wait_for_log(pattern, TIMEOUT, since=mark)
        assert found is not None, f"no {pattern!r} in the log:\n{broker.log_since(mark)}"


@pytest.fixture
def alice_writing(secure_broker: Any, paho: Any) -> tuple[Any, PahoClient]:
    """The broker (anonymous clients allowed) and alice on it, publishing to her own topic."""
    broker = secure_broker(allow_anonymous=True)
    alice = paho(broker, MQTT_5, "alice", b"alice-pw")
    assert publish_code(alice, "alice/x", b"1") < 0x80
    return broker, alice


def test_sighup_reload_changes_rules_without_dropping_connections(
    setup: Setup, alice_writing: tuple[Any, PahoClient], paho: Any
) -> None:
    broker, alice = alice_writing
    assert alice.subscribe("extra/#", 1) == [0x87]
    carol = paho(broker, MQTT_5, "carol", b"carol-pw", connect=False)
    assert carol.connect(expect_success=False) == 0x86

    setup.write_acl("user alice\ntopic readwrite extra/#\n")
    setup.write_passwords(
        *(make_entry_line(user, pw, ITERATIONS) for user, pw in [*USERS, ("carol", b"carol-pw")])
    )
    reload(broker, r"reloaded password file .*pw\.txt \(3 users\)", r"reloaded ACL file")

    # The same connection, the new rules (its cached answers are dropped).
    assert publish_code(alice, "alice/x", b"2") == 0x87
    assert alice.subscribe("extra/#", 1) == [1]
    assert publish_code(alice, "extra/y", b"3") < 0x80
    assert alice.wait_payload(b"3")[-1].topic == "extra/y"
    assert alice.disconnects == []
    assert paho(broker, MQTT_5, "carol", b"carol-pw").connack[0] == 0
    assert connack_code(broker, MQTT_5, username="roger", password=b"roger-pw") == 0x86  # gone


def test_bad_files_on_reload_keep_the_old_rules(
    setup: Setup, alice_writing: tuple[Any, PahoClient], paho: Any
) -> None:
    broker, alice = alice_writing
    setup.write_acl("user alice\ntopic readwrite #\n\ntopic read a/#/b\n")
    setup.write_passwords(make_entry_line("alice", b"new-pw", ITERATIONS), "bob:plaintext")
    reload(
        broker,
        r"acl\.txt:4: invalid topic filter 'a/#/b'; keeping the previous ACL rules",
        r"pw\.txt:2: user 'bob': not a password hash.*; keeping the previous password file",
    )
    # Old ACL: alice still may write alice/# and still may not write elsewhere.
    assert publish_code(alice, "alice/x", b"2") < 0x80
    assert publish_code(alice, "elsewhere/x", b"3") == 0x87
    # Old passwords.
    assert connack_code(broker, MQTT_5, username="alice", password=b"alice-pw") == 0
    assert connack_code(broker, MQTT_5, username="alice", password=b"new-pw") == 0x86
    assert alice.disconnects == []
    assert "Traceback" not in broker.log_text()


# -- startup ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acl", "password_file", "message"),
    [
        ("topic read ok\nuser\n", None, "acl.txt:2: 'user' needs a name"),
        ("topic read ok\n", "alice:$6$AAAA$AAAA\n", "pw.txt:1: the hash must be 64 bytes"),
        ("topic read ok\n", "missing", "security.password_file: file not found"),
    ],
)
def test_bad_files_at_startup_stop_the_broker(
    tmp_path: Path, acl: str, password_file: str | None, message: str
) -> None:
    (tmp_path / "acl.txt").write_text(acl)
    config = f"[security]\nacl_file = {str(tmp_path / 'acl.txt')!r}\n"
    if password_file is not None:
        path = tmp_path / "pw.txt"
        if password_file != "missing":
            path.write_text(password_file)
        config += f"password_file = {str(path)!r}\n"
    (tmp_path / "broker.toml").write_text(config)
    done = run_broker("--config", str(tmp_path / "broker.toml"), "--memory", cwd=tmp_path)
    assert done.returncode == 2, done
    assert "configuration error" in done.stderr
    assert message in done.stderr

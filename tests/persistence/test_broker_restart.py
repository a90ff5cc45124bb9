"""The broker as a real subprocess with a real SQLite file under --data-dir, killed (SIGKILL) or
stopped (SIGTERM) and started again on the same directory: nothing it acknowledged is lost.

Waiting is on events (log lines, CONNACK/SUBACK/PUBACK, arriving messages) with timeouts as
failure guards. To prove that no duplicate is still on its way, a test publishes a marker after
the messages it counts and waits for it: the session's queue is delivered in order, so anything
queued before the marker has arrived once the marker has.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.clients import MQTT_5, MQTT_311, PahoClient, RawClient, Received, parse_connack
from support.launcher import BrokerProcess, mosquitto_client

from mqttbroker.protocol import grammar
from mqttbroker.protocol import packets as pk
from mqttbroker.protocol.properties import PropertyId as Prop

N = 200
TIMEOUT = 15.0  # failure guard for anything that should happen promptly
Brokers = Callable[..., BrokerProcess]


def persistent(
    clients: list[PahoClient],
    broker: BrokerProcess,
    client_id: str,
    version: int,
    expiry: int = 300,
) -> PahoClient:
    """A client that resumes its session: MQTT 5 Clean Start 0 with a Session Expiry Interval, or
    MQTT 3.1.1 Clean Session 0."""
    client = PahoClient(broker.host, broker.port, version, client_id, clean=False, expiry=expiry)
    clients.append(client)
    return client


def resumed(client: PahoClient) -> bool:
    """Connect; whether the broker resumed the session (Session Present)."""
    client.connect()
    return client.session_present


def publish_matched(client: PahoClient, messages: list[tuple[str, bytes, int, bool]]) -> None:
    """Publish and wait for every PUBACK/PUBCOMP; all report success (MQTT 5: not "no
    matching subscribers")."""
    codes = client.publish_all(messages)
    assert set(codes) <= {0}, f"acknowledgements with reason codes {set(codes)}"


def plain(
    clients: list[PahoClient], broker: BrokerProcess, client_id: str, version: int = MQTT_5
) -> PahoClient:
    client = PahoClient(broker.host, broker.port, version, client_id)
    clients.append(client)
    client.connect()
    return client


def until_marker(
    client: PahoClient, publisher: PahoClient, topic: str, count: int
) -> list[Received]:
    """Wait for ``count`` messages, then publish a marker on ``topic`` and wait for it; everything
    received before the marker."""
    client.wait_messages(count, timeout=4 * TIMEOUT)
    publish_matched(publisher, [(topic, b"marker", 1, False)])
    got = client.wait_messages(count + 1)
    index = next(i for i, m in enumerate(got) if m.payload == b"marker")
    return got[:index]


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311], ids=["mqtt5", "mqtt311"])
def test_sigkill_loses_no_acknowledged_qos1_or_qos2_message(
    brokers: Brokers, clients: list[PahoClient], version: int
):
    first = brokers()
    sub = persistent(clients, first, f"crash-sub-{version}", version)
    assert not resumed(sub)
    assert sub.subscribe("crash/q1", 1) == [1]
    assert sub.subscribe("crash/q2", 2) == [2]
    sub.disconnect()

    pub = plain(clients, first, f"crash-pub-{version}", version)
    q1 = [b"q1-%03d" % i for i in range(N)]
    q2 = [b"q2-%03d" % i for i in range(N)]
    publish_matched(
        pub, [("crash/q1", p, 1, False) for p in q1] + [("crash/q2", p, 2, False) for p in q2]
    )  # every PUBACK and PUBCOMP received
    assert first.kill() == -9
    pub.close()

    second = brokers()
    restored = second.wait_for_log(r"restored (\d+) sessions, (\d+) queued", timeout=0)
    assert restored is not None and restored.groups() == ("1", str(2 * N)), second.log_text()
    sub = persistent(clients, second, f"crash-sub-{version}", version)
    assert resumed(sub), "the session was not resumed (Session Present 0)"
    pub = plain(clients, second, f"crash-pub2-{version}", version)
    got = until_marker(sub, pub, "crash/q1", 2 * N)
    assert [m.payload for m in got if m.topic == "crash/q1"] == q1
    assert [m.payload for m in got if m.topic == "crash/q2"] == q2  # exactly once, in order
    assert {m.qos for m in got if m.topic == "crash/q2"} == {2}
    assert {m.qos for m in got if m.topic == "crash/q1"} == {1}
    assert len(got) == 2 * N
    assert "Traceback" not in second.log_text()


def test_sigkill_while_publishing_loses_no_acknowledged_message(
    brokers: Brokers, clients: list[PahoClient], tmp_path: Path
):
    """The broker is killed in the middle of a stream of QoS 1 messages (from the publisher's
    network thread, the moment it has counted 1500 PUBACKs): every message the publisher got a
    PUBACK for, before or after that moment, is delivered after the restart."""
    config = tmp_path / "big-queues.toml"
    config.write_text("[broker]\nmax_queued_messages = 100000\n")
    first = brokers("--config", str(config))
    subscribed_offline(clients, first, "midstream-sub", MQTT_5, "mid/#", 1)

    pub = PahoClient(first.host, first.port, MQTT_5, "midstream-pub")
    clients.append(pub)
    pub.client.max_inflight_messages_set(100)
    pub.connect()
    assert first.proc is not None
    pid = first.proc.pid
    payload_of: dict[int, bytes] = {}
    acked: list[bytes] = []

    def on_publish(client: object, userdata: object, mid: int, rc: object, props: object) -> None:
        acked.append(payload_of[mid])
        if len(acked) == 1500:
            os.kill(pid, signal.SIGKILL)

    pub.client.on_publish = on_publish
    for i in range(4000):
        payload = b"mid-%05d" % i
        info = pub.client.publish("mid/x", payload, 1)
        payload_of[info.mid] = payload
    assert first.wait_exit() == -9
    pub.close()
    assert len(acked) >= 1500

    second = brokers("--config", str(config))
    sub = persistent(clients, second, "midstream-sub", MQTT_5)
    assert resumed(sub)
    marker = plain(clients, second, "midstream-marker")
    publish_matched(marker, [("mid/x", b"marker", 1, False)])
    sub.wait_payload(b"marker", 4 * TIMEOUT)
    received = [m.payload for m in sub.received()]
    missing = sorted(set(acked) - set(received))
    assert missing == [], f"{len(missing)} acknowledged messages lost, first {missing[:3]}"
    body = [p for p in received if p != b"marker"]
    assert body == sorted(body), "not in publishing order"
    assert len(body) == len(set(body)), "duplicates"


def test_sigkill_keeps_retained_messages_and_their_removal(
    brokers: Brokers, clients: list[PahoClient]
):
    first = brokers()
    pub = plain(clients, first, "ret-pub")
    pub.publish_all(
        [
            ("ret/kept", b"retained value", 1, True),
            ("ret/cleared", b"to be cleared", 1, True),
            ("ret/replaced", b"old", 2, True),
            ("ret/replaced", b"new", 2, True),
            ("ret/cleared", b"", 1, True),
        ]
    )
    assert first.kill() == -9
    pub.close()

    second = brokers()
    observer = plain(clients, second, "ret-observer")
    assert observer.subscribe("ret/#", 1) == [1]
    pub = plain(clients, second, "ret-pub2")
    got = until_marker(observer, pub, "ret/marker", 2)
    assert sorted((m.topic, m.payload, m.retain) for m in got) == [
        ("ret/kept", b"retained value", True),
        ("ret/replaced", b"new", True),
    ]


def subscribed_offline(
    clients: list[PahoClient],
    broker: BrokerProcess,
    client_id: str,
    version: int,
    topic_filter: str,
    qos: int,
) -> None:
    """A persistent session of ``client_id`` subscribed to ``topic_filter``, left offline."""
    client = persistent(clients, broker, client_id, version)
    client.connect()
    assert client.subscribe(topic_filter, qos) == [qos]
    client.disconnect()


def drop_with_delayed_will(broker: BrokerProcess, client_id: str, topic: str, delay: int) -> float:
    """A client with a will (Will Delay Interval ``delay``, Session Expiry 300) whose network
    connection fails; returns when the broker has seen it go, with the time it was dropped."""
    will = pk.Will(topic, b"%s went away" % client_id.encode(), 1, False)
    will.properties[Prop.WILL_DELAY_INTERVAL] = delay
    mark = broker.log_mark()
    connect = pk.Connect(
        client_id=client_id, keep_alive=0, will=will, properties={Prop.SESSION_EXPIRY_INTERVAL: 300}
    )
    raw = RawClient(broker.host, broker.port)
    raw.send(grammar.encode(connect, MQTT_5))
    assert parse_connack(raw.read_packet(), MQTT_5)[1] == 0
    sock = raw.sock
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()  # no DISCONNECT: the will waits out its delay
    dropped_at = time.time()
    assert broker.wait_for_log(rf"client {client_id}: connection lost", since=mark) is not None
    return dropped_at


def test_pending_delayed_will_published_after_the_delay_across_sigkill(
    brokers: Brokers, clients: list[PahoClient]
):
    delay = 3
    first = brokers()
    subscribed_offline(clients, first, "will-observer", MQTT_5, "will/dev", 1)

    dropped_at = drop_with_delayed_will(first, "will-dev", "will/dev", delay)
    # The observer's CONNACK is held until its session is committed, in a batch no earlier than
    # the one holding the pending will: once it arrives, the will is on disk.
    observer = persistent(clients, first, "will-observer", MQTT_5)
    assert resumed(observer)
    assert first.kill() == -9
    assert time.time() - dropped_at < delay, "too slow: the delay ran out before the kill"
    assert observer.messages == []
    observer.close()

    second = brokers()
    observer = persistent(clients, second, "will-observer", MQTT_5)
    assert resumed(observer)
    got = observer.wait_messages(1, timeout=delay + TIMEOUT)
    assert [(m.topic, m.payload) for m in got] == [("will/dev", b"will-dev went away")]
    assert got[0].at >= dropped_at + delay - 0.5, "the will was published before its delay"


def test_sigterm_restart_keeps_sessions_queues_retained_and_pending_wills(
    brokers: Brokers, clients: list[PahoClient]
):
    delay = 2
    first = brokers()
    subscribed_offline(clients, first, "term-sub", MQTT_5, "term/#", 2)
    subscribed_offline(clients, first, "term-watcher", MQTT_5, "lastwill/#", 1)
    dropped_at = drop_with_delayed_will(first, "term-dev", "lastwill/term-dev", delay)
    pub = plain(clients, first, "term-pub")
    sent = [(f"term/{i % 3}", b"term-%02d" % i, 1 + i % 2, i == 5) for i in range(30)]
    publish_matched(pub, sent)  # acknowledged: committed, and so is the pending will before them
    mark = first.log_mark()
    assert first.terminate() == 0
    assert first.wait_for_log("stopped", since=mark, timeout=0) is not None
    assert time.time() - dropped_at < delay, "too slow: the will delay ran out before the stop"
    pub.close()

    second = brokers()
    sub = persistent(clients, second, "term-sub", MQTT_5)
    assert resumed(sub)
    pub = plain(clients, second, "term-pub2")
    got = until_marker(sub, pub, "term/0", len(sent))
    # in order per QoS (paho hands a QoS 2 message over at PUBREL, so the two interleave)
    for qos in (1, 2):
        assert [(m.topic, m.payload) for m in got if m.qos == qos] == [
            (t, p) for t, p, q, _ in sent if q == qos
        ]
    assert len(got) == len(sent)
    observer = plain(clients, second, "term-observer")
    assert observer.subscribe("term/#", 0) == [0]
    retained = until_marker(observer, pub, "term/x", 1)
    assert [(m.topic, m.payload, m.retain) for m in retained] == [("term/2", b"term-05", True)]

    watcher = persistent(clients, second, "term-watcher", MQTT_5)
    assert resumed(watcher)
    wills = watcher.wait_messages(1, timeout=delay + TIMEOUT)
    assert [(m.topic, m.payload) for m in wills] == [("lastwill/term-dev", b"term-dev went away")]
    assert wills[0].at >= dropped_at + delay - 0.5, "the will was published before its delay"
    assert "Traceback" not in second.log_text()


def test_session_whose_expiry_passed_before_the_restart_is_gone(
    brokers: Brokers, clients: list[PahoClient]
):
    first = brokers()
    short = persistent(clients, first, "short-lived", MQTT_5, expiry=1)
    short.connect()
    assert short.subscribe("exp/#", 1) == [1]
    short.disconnect()
    gone_at = time.time()
    long = persistent(clients, first, "long-lived", MQTT_5, expiry=300)
    long.connect()
    assert long.subscribe("exp/#", 1) == [1]
    long.disconnect()
    pub = plain(clients, first, "exp-pub")
    publish_matched(pub, [("exp/a", b"queued", 1, False)])
    assert first.terminate() == 0
    pub.close()
    # the restart must come after the 1 s expiry: nothing to wait on but the time itself
    time.sleep(max(0.0, gone_at + 1.2 - time.time()))

    second = brokers()
    short = persistent(clients, second, "short-lived", MQTT_5, expiry=1)
    assert not resumed(short), "an expired session was resumed"
    long = persistent(clients, second, "long-lived", MQTT_5, expiry=300)
    assert resumed(long)
    assert [m.payload for m in long.wait_messages(1)] == [b"queued"]
    short_pub = plain(clients, second, "exp-pub2")
    publish_matched(short_pub, [("exp/b", b"after", 1, False)])
    assert [m.payload for m in long.wait_messages(2)] == [b"queued", b"after"]
    assert short.messages == []  # no old subscription came back with the new session


# ---------------------------------------------------------------------------------------------
# mosquitto_sub -c -i ID -x 300


def mosquitto_sub(broker: BrokerProcess, *args: str, timeout: float = TIMEOUT + 10) -> str:
    """What mosquitto_sub printed; a failure (``-W``'s timeout, say, which comes before
    ``timeout``) shows the broker's log."""
    common = ("-V", "mqttv5", "-c", "-i", "mosq-resume", "-x", "300", "-q", "1", "-t", "mosq/#")
    done = mosquitto_client(
        "mosquitto_sub", broker.host, broker.port, *common, *args, timeout=timeout, check=False
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr, broker.log_text())
    return done.stdout


def mosquitto_pub(broker: BrokerProcess, message: str) -> None:
    args = ("-q", "1", "-t", "mosq/t", "-m", message)
    mosquitto_client("mosquitto_pub", broker.host, broker.port, *args, timeout=TIMEOUT)


@pytest.mark.needs_mosquitto
def test_mosquitto_sub_resumes_its_session_across_restart_and_sigkill(brokers: Brokers):
    first = brokers()
    mosquitto_sub(first, "-E")  # subscribes, then exits: the session stays for 300 s
    for i in range(3):
        mosquitto_pub(first, f"while away {i}")
    assert first.terminate() == 0

    second = brokers()
    out = mosquitto_sub(second, "-C", "3", "-W", str(int(TIMEOUT)))
    # (Each broker's log with a failure: this test failed once in CI, cause unknown.)
    assert out.splitlines() == [f"while away {i}" for i in range(3)], (out, second.log_text())
    for i in range(3):
        mosquitto_pub(second, f"before the kill {i}")
    assert second.kill() == -9

    third = brokers()
    out = mosquitto_sub(third, "-C", "3", "-W", str(int(TIMEOUT)))
    expected = [f"before the kill {i}" for i in range(3)]
    assert out.splitlines() == expected, (out, second.log_text(), third.log_text())


# ---------------------------------------------------------------------------------------------
# damaged database


def test_damaged_database_is_moved_aside_and_the_broker_starts(
    brokers: Brokers, clients: list[PahoClient], data_dir: Path
):
    db = data_dir / "mqttbroker.db"
    garbage = b"this is not an sqlite database " * 500
    db.write_bytes(garbage)
    broker = brokers()
    line = broker.wait_for_log(
        r"STORE DAMAGED: (\S+) could not be used .* moved to (\S+) ", timeout=0
    )
    assert line is not None, broker.log_text()
    assert line.group(1) == str(db)
    moved = Path(line.group(2))
    assert moved.parent == data_dir and moved.name.startswith("mqttbroker.db.damaged-")
    assert moved.read_bytes() == garbage
    # it serves, with an empty store that works
    sub = persistent(clients, broker, "after-damage", MQTT_5)
    assert not resumed(sub)
    assert sub.subscribe("d/#", 1) == [1]
    pub = plain(clients, broker, "after-damage-pub")
    publish_matched(pub, [("d/x", b"fine", 1, False)])
    assert [m.payload for m in sub.wait_messages(1)] == [b"fine"]


def test_damaged_database_with_refuse_exits_naming_the_file(
    brokers: Brokers, data_dir: Path, tmp_path: Path
):
    db = data_dir / "mqttbroker.db"
    garbage = b"\x00\xffnot sqlite" * 1000
    db.write_bytes(garbage)
    config = tmp_path / "broker.toml"
    config.write_text('[storage]\non_corrupt = "refuse"\n')
    broker = brokers("--config", str(config), start=False)
    code = broker.wait_exit()
    text = broker.log_text()
    assert code != 0, text
    assert str(db) in text, text
    assert "Move it aside" in text, text
    assert "listening on" not in text
    assert db.read_bytes() == garbage
    assert not list(data_dir.glob("*.damaged-*"))

"""Cluster mode on a real redis-server: start errors, routes, QoS 0 and QoS 1/2 across nodes,
retained messages shared, Redis restarted during traffic. (``--workers``: test_workers.py.)"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from support.clients import PahoClient, unique, wait_for
from support.cluster_clients import (
    acknowledged,
    client,
    close_all,
    device,
    kill,
    payloads,
    resumed,
    routed,
    subscribed,
    subscriber,
    until_routed,
)
from support.launcher import free_port
from support.redis_server import RedisServer

pytestmark = pytest.mark.needs_redis

ROOT = Path(__file__).resolve().parent.parent.parent


def routes_in(redis_server, node_id: str) -> set[str]:
    with redis_server.client() as r:
        return {f.decode() for f in r.hkeys(f"mqttbroker:routes:{node_id}")}


# -- (1) start errors -----------------------------------------------------------------------


def test_a_url_that_is_not_redis_is_a_config_error_naming_the_key(start_broker) -> None:
    node = start_broker(extra_args=("--cluster", "http://127.0.0.1:6379"), wait=False)
    assert node.wait_exit() == 2
    assert "cluster.redis: expected a redis://" in node.log_text()


def test_an_unreachable_redis_stops_the_start_naming_the_key(start_node) -> None:

    node = start_node("a", url=f"redis://127.0.0.1:{free_port()}/0", wait=False)
    assert node.wait_exit(20) == 2
    text = node.log_text()
    assert "cannot start: cluster.redis: cannot reach Redis at redis://127.0.0.1:" in text, text


def test_a_second_node_with_the_same_node_id_is_refused(start_node) -> None:
    first = start_node("same")
    second = start_node("same", wait=False)
    assert second.wait_exit(20) == 2
    assert "cluster.node_id: node 'same' is already running" in second.log_text()
    assert first.returncode is None  # the first one serves on
    c = client(first)
    c.close()


def test_without_cluster_redis_is_never_imported() -> None:
    code = (
        "import sys; from mqttbroker.config import Config; from mqttbroker.server.app import "
        "Server; Server(Config()); assert 'redis' not in sys.modules, 'redis imported'"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60, capture_output=True
    )


# -- (2) routes, QoS 0 ----------------------------------------------------------------------


def test_qos0_reaches_the_node_with_a_subscriber_and_no_other(redis_server, start_node) -> None:
    a = start_node("a")
    b = start_node("b")
    start_node("c")  # a node without subscribers: nothing may go to it
    # What crosses to each node's QoS 0 channel, seen from Redis.
    watcher = redis_server.client().pubsub()
    watcher.psubscribe("mqttbroker:pub:*")
    watcher.get_message(timeout=5)  # the psubscribe confirmation
    topic = unique("q0")
    sub = subscriber(b, f"{topic}/+", 0)
    pub = client(a)
    until_routed(pub, sub, f"{topic}/x")
    for i in range(5):
        pub.publish(f"{topic}/x", f"m{i}".encode())
    wait_for(lambda: len(payloads(sub)) == 5, "5 messages")
    assert payloads(sub) == [f"m{i}".encode() for i in range(5)]
    channels = set()
    while (msg := watcher.get_message(timeout=0.5)) is not None:
        channels.add(msg["channel"].decode())
    assert channels == {"mqttbroker:pub:b"}  # not to c, which has no subscriber
    # Unsubscribed: the route goes, and nothing crosses any more once a has heard of it (the
    # route leaves Redis first, and a learns it through Redis a moment later).
    sub.unsubscribe(f"{topic}/+")
    wait_for(lambda: not routes_in(redis_server, "b"), "the route removed")

    def nothing_crosses() -> bool:
        while watcher.get_message(timeout=0.1) is not None:
            pass  # (what crossed before)
        pub.publish(f"{topic}/x", b"late")
        return watcher.get_message(timeout=0.5) is None

    wait_for(nothing_crosses, "a publish on a to stop crossing to b")
    sub.sync()
    assert b"late" not in payloads(sub)
    close_all(pub, sub)
    watcher.close()


# -- (3) QoS 1/2 through the streams --------------------------------------------------------


def test_qos1_and_qos2_cross_nodes_and_wait_in_the_stream_while_the_node_is_down(
    start_node, tmp_path: Path
) -> None:
    a = start_node("a")
    b_data = tmp_path / "b-data"
    b = start_node("b", data_dir=b_data, memory=False)
    topic = unique("q1")
    sub = subscribed(b, unique("persist"), topic, 2)
    pub = client(a)
    until_routed(pub, sub, topic)
    # Live: QoS 1 and 2 arrive, once each.
    info = pub.publish(topic, b"one", qos=1)
    assert pub.acked[info.mid] == 0  # not 0x10: b has a matching subscriber
    pub.publish(topic, b"two", qos=2)
    wait_for(lambda: payloads(sub) == [b"one", b"two"], "the QoS 1 and 2 messages")
    assert {m.qos for m in sub.received() if m.payload != b"probe"} == {1, 2}
    # b stops (its persistent session's route stays in Redis); a goes on accepting for it.
    sub.close()
    b.stop()
    for i in range(50):
        info = pub.publish(topic, f"m{i}".encode(), qos=1)
        assert pub.acked[info.mid] == 0  # acknowledged: in b's stream
    b2 = start_node("b", data_dir=b_data, memory=False)
    again = resumed(b2, sub.client_id)
    wait_for(lambda: len(payloads(again)) >= 50, "the 50 queued messages", timeout=20)
    assert payloads(again) == [f"m{i}".encode() for i in range(50)]
    close_all(again, pub)


# -- (5) retained messages ------------------------------------------------------------------


def retained_on(node, topic_filter: str, payload: bytes | None) -> None:
    """Subscribe on ``node`` until its retained message for ``topic_filter`` is ``payload``
    (None: no retained message)."""

    def check() -> bool:
        c = client(node)
        try:
            c.subscribe(topic_filter)
            c.sync()
            got = [m.payload for m in c.received() if m.retain]
        finally:
            c.close()
        return got == ([] if payload is None else [payload])

    wait_for(check, f"retained {payload!r} on {node}")


def test_a_retained_message_set_on_one_node_is_seen_on_the_others(start_node) -> None:
    a = start_node("a")
    b = start_node("b")
    topic = unique("retained")
    pub = client(a)
    pub.publish(topic, b"kept", qos=1, retain=True)
    retained_on(b, topic, b"kept")  # b was running: told through Redis
    c = start_node("c")
    retained_on(c, topic, b"kept")  # c started later: read from Redis at start
    pub.publish(topic, b"", qos=1, retain=True)  # cleared on a: cleared everywhere
    retained_on(b, topic, None)
    retained_on(c, topic, None)
    pub.close()


# -- (8) Redis down -------------------------------------------------------------------------


def test_redis_down_during_qos1_traffic_publishers_are_acknowledged_and_nothing_is_lost(
    tmp_path: Path, start_broker
) -> None:

    directory = tmp_path / "redis-aof"
    directory.mkdir()
    server = RedisServer(directory, aof=True).start()
    try:
        args = ("--cluster", server.url, "--node-id")
        a = start_broker(extra_args=(*args, "a"))  # its own store: the messages wait there
        b = start_broker(extra_args=(*args, "b", "--memory"))
        topic = unique("down")
        sub = subscriber(b, topic, 1)
        pub = client(a)
        until_routed(pub, sub, topic)
        for i in range(20):
            pub.publish(topic, f"m{i}".encode(), qos=1)
        mark = a.log_mark()
        server.kill()
        # Redis is down: a acknowledges its publisher all the same (the messages for b are in
        # a's store), and serves its own clients.
        local = subscriber(a, topic, 1)
        for i in range(20, 40):
            assert pub.wait_published(pub.publish(topic, f"m{i}".encode(), qos=1, wait=False)) == 0
        local.wait_payload(b"m39")
        assert a.wait_for_log("Redis at .* unreachable", since=mark) is not None
        assert len(re.findall("unreachable", a.log_since(mark))) == 1  # once per episode
        server.start()  # same port, same append-only file
        for i in range(40, 60):
            pub.publish(topic, f"m{i}".encode(), qos=1)
        sent = [f"m{i}".encode() for i in range(60)]
        wait_for(lambda: set(sent) <= set(payloads(sub)), "every acknowledged message", 30)
        # (at least once: a message b read before Redis went down may come twice)
        assert list(dict.fromkeys(payloads(sub))) == sent
        back = a.wait_for_log(r"reachable again; .* (\d+) messages sent from", since=mark)
        assert back is not None and int(back.group(1)) > 0
        assert a.returncode is None and b.returncode is None
        close_all(pub, sub, local)
    finally:
        server.stop()


def established(pid: int, port: int) -> int:
    """How many TCP connections the process ``pid`` has open to 127.0.0.1:``port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:  # (closed meanwhile)
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if int(remote.split(":")[1], 16) == port and state == "01" and inode in inodes:
            count += 1
    return count


def test_publishers_are_acknowledged_while_a_try_to_reach_redis_hangs(
    redis_server, start_broker
) -> None:
    """A Redis that accepts connections and never answers (a frozen host) holds the node's
    tries to reach it again for the socket timeout: the node keeps acknowledging meanwhile."""
    args = ("--cluster", redis_server.url, "--node-id")
    a = start_broker(extra_args=(*args, "a", "--memory"), log_level="debug")
    b = start_broker(extra_args=(*args, "b", "--memory"))
    topic = unique("hang")
    sub = subscriber(b, topic, 1)
    pub = client(a)
    until_routed(pub, sub, topic)
    mark = a.log_mark()
    redis_server.kill()
    assert a.wait_for_log("Redis at .* unreachable", since=mark) is not None
    with socket.socket() as frozen:
        frozen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        frozen.bind(("127.0.0.1", redis_server.port))
        frozen.listen(64)  # (the kernel completes the handshakes; nothing ever answers)
        wait_for(lambda: established(a.proc.pid, redis_server.port) > 0, "a try that hangs")
        hung = a.log_mark()
        sent = [f"h{i}".encode() for i in range(10)]
        acknowledged(pub, topic, sent)  # one at a time: each waits for the one before
        # (all acknowledged while that try still hung: it has not failed yet)
        assert "resync failed" not in a.log_since(hung)
        assert established(a.proc.pid, redis_server.port) > 0
    redis_server.start()
    wait_for(lambda: set(payloads(sub)) >= set(sent), "the messages kept while Redis hung", 30)
    close_all(pub, sub)


# -- (4) client ownership and takeover ------------------------------------------------------


def test_a_connect_claims_a_free_client_id_in_one_round_trip(start_node, redis_server) -> None:
    """The commands the node sends Redis about a client id nobody owns: one script, which reads
    and sets the owner (not a GET, then a SET)."""
    node = start_node("a")
    client_id = unique("claim")
    key = f"mqttbroker:client:{client_id}"
    seen: list[dict] = []
    watching = threading.Event()

    def watch() -> None:
        r = redis_server.client()
        with r.monitor() as monitor:
            watching.set()
            for command in monitor.listen():
                if command["command"] == "ECHO end-of-test":
                    return
                seen.append(command)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert watching.wait(10)  # MONITOR is on: Redis has answered it
    c = client(node, client_id=client_id)
    stopper = redis_server.client()
    stopper.echo("end-of-test")
    watcher.join(10)
    stopper.close()
    c.close()
    sent = [x["command"] for x in seen if key in x["command"] and x["client_type"] != "lua"]
    assert len(sent) == 1 and sent[0].startswith("EVAL"), sent
    in_script = [x["command"] for x in seen if key in x["command"] and x["client_type"] == "lua"]
    assert in_script == [f"GET {key}", f"SET {key} a"], in_script


def test_a_client_taking_over_on_another_node_moves_its_session(start_node) -> None:
    a = start_node("a")
    b = start_node("b")
    c = start_node("c")
    client_id, topic, first, pub = routed(a, c, 1, "mover")
    # Away: QoS 1 messages queue on a.
    first.close()
    for i in range(5):
        pub.publish(topic, f"q{i}".encode(), qos=1)
    # Back on a, then taken over from b: the old connection gets 0x8E, the session moves.
    again = resumed(a, client_id)
    wait_for(lambda: payloads(again) == [f"q{i}".encode() for i in range(5)], "queued on a")
    again.close()
    for i in range(5, 8):
        pub.publish(topic, f"q{i}".encode(), qos=1)
    old = resumed(a, client_id)
    wait_for(lambda: len(payloads(old)) == 3, "queued while away")
    moved = resumed(b, client_id)
    assert old.wait_disconnected().reason_code == 0x8E
    # The subscription came along: new messages reach b, not a.
    for i in range(8, 11):
        pub.publish(topic, f"q{i}".encode(), qos=1)
    wait_for(lambda: payloads(moved)[-3:] == [b"q8", b"q9", b"q10"], "messages on b")
    assert not [p for p in payloads(moved) if p in (b"q0", b"q1")]  # acknowledged on a earlier
    # Clean Start on a third node: no session present, and the old one is gone from b.
    fresh = client(c, client_id=client_id)
    assert not fresh.session_present
    assert moved.wait_disconnected().reason_code == 0x8E
    close_all(pub, fresh)


def test_queued_messages_move_with_a_session_taken_over_while_away(start_node) -> None:
    a = start_node("a")
    b = start_node("b")
    client_id, topic, first, pub = routed(a, b, 2, "away")
    first.close()
    for i in range(20):
        pub.publish(topic, f"w{i}".encode(), qos=2 if i % 2 else 1)
    moved = resumed(b, client_id)
    wait_for(lambda: len(payloads(moved)) >= 20, "the 20 queued messages")
    got = payloads(moved)
    # In order per QoS (paho hands a QoS 2 message over at PUBREL, later than a QoS 1 one).
    assert [p for p in got if int(p[1:]) % 2 == 0] == [f"w{i}".encode() for i in range(0, 20, 2)]
    assert [p for p in got if int(p[1:]) % 2] == [f"w{i}".encode() for i in range(1, 20, 2)]
    close_all(moved, pub)


# -- (7) shared subscriptions ---------------------------------------------------------------


def test_a_shared_group_with_members_on_two_nodes_gets_each_message_once(start_node) -> None:
    a = start_node("a")
    b = start_node("b")
    c = start_node("c")
    topic = unique("shared")
    members = [client(node) for node in (a, a, b)]
    for m in members:
        m.subscribe(f"$share/g/{topic}/+", qos=1)
    plain = subscriber(b, f"{topic}/#", 1)
    pub = client(c)
    until_routed(pub, plain, f"{topic}/x")
    # a's members are routed too by now? Their SUBACKs waited for Redis: yes.
    sent = [f"s{i}".encode() for i in range(30)]
    acknowledged(pub, f"{topic}/x", sent)
    wait_for(lambda: len(payloads(plain)) == 30, "the plain subscriber's 30")
    wait_for(lambda: sum(len(payloads(m)) for m in members) >= 30, "30 shared deliveries")
    time.sleep(0.3)  # (a duplicate would arrive about now)
    got = [p for m in members for p in payloads(m)]
    assert sorted(got) == sorted(sent)  # each once, in the whole cluster
    on_a = len(payloads(members[0])) + len(payloads(members[1]))
    assert on_a and len(payloads(members[2]))  # both nodes took turns
    assert payloads(plain) == sent  # plain subscribers are not affected
    close_all(*members, plain, pub)


def with_will(node, client_id: str, will_topic: str, clean: bool = True) -> PahoClient:
    """A device whose will (``gone``, QoS 1) is due a second after it is lost, not yet
    connected."""
    will_props = Properties(PacketTypes.WILLMESSAGE)
    will_props.WillDelayInterval = 1
    c = device(node, client_id, clean=clean)
    c.client.will_set(will_topic, b"gone", qos=1, properties=will_props)
    return c


def test_the_will_of_a_session_taken_over_is_published_once_by_its_new_node(start_node) -> None:
    a = start_node("a")
    b = start_node("b")
    c = start_node("c")
    client_id = unique("willing")
    will_topic = unique("will")
    watcher = subscriber(c, will_topic, 1)
    probe = client(a)
    until_routed(probe, watcher, will_topic)
    first = with_will(a, client_id, will_topic, clean=False)
    first.connect()
    moved = with_will(b, client_id, will_topic, clean=False)
    moved.connect()
    assert first.wait_disconnected().reason_code == 0x8E
    # The client vanishes without DISCONNECT: after the will delay its node publishes the will.
    moved.client.socket().shutdown(socket.SHUT_RDWR)
    wait_for(lambda: b"gone" in payloads(watcher), "the will")
    probe.publish(will_topic, b"after", qos=1)
    wait_for(lambda: b"after" in payloads(watcher), "the message after the will")
    time.sleep(1.5)  # a second will (from a, the session's former node) would be due by now
    assert payloads(watcher).count(b"gone") == 1
    close_all(first, moved, watcher, probe)


def test_a_client_that_came_back_with_clean_start_is_still_owned_by_its_node(start_node) -> None:
    a = start_node("a")
    b = start_node("b")
    client_id = unique("again")
    first = client(a, client_id=client_id)
    second = client(a, client_id=client_id)  # Clean Start, same node
    assert first.wait_disconnected().reason_code == 0x8E
    second.sync()
    # The first session's end must not have freed the id: a third connection, on b, takes over.
    third = client(b, client_id=client_id)
    assert second.wait_disconnected().reason_code == 0x8E
    close_all(first, second, third)


def test_a_node_killed_mid_flight_loses_no_acknowledged_message(start_node, tmp_path: Path) -> None:
    a = start_node("a")
    b_data = tmp_path / "b-killed"
    config = "[cluster]\nnode_ttl = 1.0\n"
    b = start_node("b", data_dir=b_data, memory=False, config=config)
    client_id, topic, sub, pub = routed(b, a, 1, "survivor")
    sub.close()  # away: b queues the messages in its store
    sent = [f"k{i}".encode() for i in range(300)]
    infos = []
    for i, payload in enumerate(sent):
        if i == 100:
            b.send_signal(signal.SIGKILL)  # mid-flight: some read, some queued, some not yet
        infos.append(pub.publish(topic, payload, qos=1, wait=False))
    for info in infos:
        assert pub.wait_published(info, timeout=30) == 0  # acknowledged: in b's stream
    before = set(payloads(sub))
    b.wait_exit()
    # b back on its data once its lease has run out (node_ttl 1 s): nothing acknowledged is lost.
    deadline = time.monotonic() + 20
    while True:
        b2 = start_node("b", data_dir=b_data, memory=False, config=config, wait=False)
        if b2.wait_for_log(r"listening on \S+:\d+ \(MQTT over TCP\)", 20, stop_on_exit=True):
            break
        assert "cluster.node_id" in b2.log_text() and time.monotonic() < deadline, b2.log_text()
        time.sleep(0.3)
    match = b2.wait_for_log(r"listening on (\S+):(\d+) \(MQTT over TCP\)", 1)
    b2.host, b2.port = match.group(1), int(match.group(2))
    again = resumed(b2, client_id)
    wait_for(lambda: before | set(payloads(again)) >= set(sent), "every acknowledged message", 30)
    close_all(again, pub)


def test_a_persistent_session_outlives_the_loss_of_its_node(start_node) -> None:

    a = start_node("a")
    b = start_node("b", config="[cluster]\nnode_ttl = 1.0\n")  # memory store: state in Redis
    client_id = unique("orphan")
    topic = unique("orphan")
    sub = subscribed(b, client_id, topic, 1)
    remote = client(a)  # its messages cross to b through b's stream
    local = client(b)  # its messages are queued on b directly
    until_routed(remote, sub, topic)
    sub.close()
    sent = [f"o{i}".encode() for i in range(500)]
    infos = [
        (remote if i % 2 else local).publish(topic, p, qos=1, wait=False)
        for i, p in enumerate(sent)
    ]
    for i, info in enumerate(infos):
        assert (remote if i % 2 else local).wait_published(info, 30) == 0
    # Every message acknowledged; b is lost for good.
    kill(b)
    again = resumed(a, client_id)
    assert a.wait_for_log(r"node 'b' adopted: 1 sessions") is not None
    wait_for(lambda: set(payloads(again)) >= set(sent), "the 500 queued messages", 30)
    # In order per publisher (at least once: a message b read and had not acknowledged may
    # come twice).
    got = list(dict.fromkeys(payloads(again)))
    assert [p for p in got if int(p[1:]) % 2] == sent[1::2]
    assert [p for p in got if not int(p[1:]) % 2] == sent[::2]
    # The session lives on a now: new messages reach it there.
    remote.publish(topic, b"after", qos=1)
    wait_for(lambda: b"after" in payloads(again), "a message after the move")
    close_all(again, remote)


def test_readyz_reports_redis_unreachable_and_healthz_stays_ok(redis_server, start_broker) -> None:
    import json
    import urllib.error
    import urllib.request

    port = free_port()
    args = ("--cluster", redis_server.url, "--node-id", "a", "--memory")
    node = start_broker(extra_args=(*args, "--admin-port", str(port)))

    def get(path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def answers() -> bool:  # (the admin server starts after the listeners)
        try:
            return get("/healthz")[0] == 200
        except urllib.error.URLError:
            return False

    wait_for(answers, "the admin server")
    assert get("/readyz") == (200, {"ready": True})
    mark = node.log_mark()
    redis_server.kill()
    assert node.wait_for_log("Redis at .* unreachable", since=mark) is not None
    status, body = get("/readyz")
    assert status == 503 and not body["ready"]
    assert f"Redis at {redis_server.url} unreachable" in body["reason"]
    assert get("/healthz")[0] == 200
    redis_server.start()
    assert node.wait_for_log("reachable again", 20, since=mark) is not None, node.log_since(mark)
    assert get("/readyz") == (200, {"ready": True})


def test_a_session_on_a_frozen_node_is_adopted_and_the_node_gives_it_up(start_node) -> None:
    a = start_node("a")
    b = start_node("b", config="[cluster]\nnode_ttl = 1.0\n")
    client_id, topic, first, pub = routed(b, a, 1, "frozen")
    b.send_signal(signal.SIGSTOP)  # b answers nothing now, and its lease runs out
    try:
        sent = [f"f{i}".encode() for i in range(10)]
        acknowledged(pub, topic, sent)  # acknowledged: in b's stream
        # b does not hand the session over: once its lease ran out, a adopts it.
        moved = resumed(a, client_id)
        wait_for(lambda: set(payloads(moved)) >= set(sent), "the messages b had not delivered")
    finally:
        b.send_signal(signal.SIGCONT)
    # b wakes up: the client still connected there is told the session went (0x8E).
    assert first.wait_disconnected(20).reason_code == 0x8E
    pub.publish(topic, b"after", qos=1)
    wait_for(lambda: b"after" in payloads(moved), "a message after the move")
    assert b"after" not in payloads(first)
    close_all(moved, first, pub)


def test_a_node_gone_for_adopt_after_is_adopted_without_its_clients(
    redis_server, start_node
) -> None:

    a = start_node("a", config="[cluster]\nnode_ttl = 1.0\nadopt_after = 1.0\n")
    b = start_node("b", config="[cluster]\nnode_ttl = 1.0\nadopt_after = 0\n")
    client_id, topic, sub, pub = routed(b, a, 1, "swept")
    sub.close()
    sent = [f"s{i}".encode() for i in range(20)]
    acknowledged(pub, topic, sent)
    kill(b)
    # No client of b comes back: a adopts b once it has been gone for adopt_after.
    assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 20) is not None
    with redis_server.client() as r:
        assert b"b" not in r.smembers("mqttbroker:nodes")
        assert not r.exists("mqttbroker:routes:b", "mqttbroker:stream:b")
    pub.publish(topic, b"after", qos=1)  # queued on a, for the session it adopted
    again = resumed(a, client_id)
    wait_for(lambda: set(payloads(again)) >= {*sent, b"after"}, "the messages, on a")
    close_all(again, pub)


def test_the_will_of_a_client_of_a_lost_node_is_published_by_the_node_adopting_it(
    start_node,
) -> None:
    a = start_node("a", config="[cluster]\nnode_ttl = 1.0\nadopt_after = 1.0\n")
    b = start_node("b", config="[cluster]\nnode_ttl = 1.0\nadopt_after = 0\n")
    will_topic = unique("lostwill")
    watcher = subscriber(a, will_topic, 1)
    doomed = with_will(b, unique("doomed"), will_topic)
    doomed.connect()
    probe = client(b)
    until_routed(probe, watcher, will_topic)  # b routes to a (the will's way, were b alive)
    probe.close()
    b.send_signal(signal.SIGKILL)  # the client's connection is gone with b: its will is due
    b.wait_exit()
    assert a.wait_for_log(r"node 'b' adopted: 1 sessions", 20) is not None
    wait_for(lambda: b"gone" in payloads(watcher), "the will, published by a")
    time.sleep(1.5)  # (a second one would come about now)
    assert payloads(watcher).count(b"gone") == 1
    close_all(watcher, doomed)


def test_a_redis_restarted_empty_gets_the_sessions_back_from_their_nodes(
    redis_server, start_node
) -> None:
    a = start_node("a")
    b = start_node("b", config="[cluster]\nnode_ttl = 1.0\n")
    client_id = unique("rewritten")
    topic = unique("rewritten")
    sub = subscribed(b, client_id, topic, 1)
    local = client(b)
    local.publish(topic, b"probe")  # (b routes its own clients' messages at once)
    sub.wait_payload(b"probe")
    sub.close()
    sent = [f"r{i}".encode() for i in range(30)]
    acknowledged(local, topic, sent)  # queued on b, and in its session's hash in Redis
    mark = b.log_mark()
    redis_server.kill()
    redis_server.start()  # no persistence: empty
    assert b.wait_for_log("reachable again", 20, since=mark) is not None, b.log_since(mark)
    with redis_server.client() as r:
        wait_for(lambda: len(r.hkeys(f"mqttbroker:session:{client_id}")) > 30, "the hash back")
    b.send_signal(signal.SIGKILL)  # and now b is lost: a adopts its session from Redis
    b.wait_exit()
    again = resumed(a, client_id)
    wait_for(lambda: set(payloads(again)) >= set(sent), "the queued messages, on a")
    close_all(again, local)


def test_messages_kept_while_redis_was_down_survive_their_node_and_go_on_restart(
    redis_server, start_node, tmp_path: Path
) -> None:

    a_data = tmp_path / "a-outbox"
    a = start_node("a", data_dir=a_data, memory=False)
    b = start_node("b")
    topic = unique("outbox")
    sub = subscriber(b, topic, 1)
    pub = client(a)
    until_routed(pub, sub, topic)
    redis_server.kill()
    sent = [f"k{i}".encode() for i in range(10)]
    acknowledged(pub, topic, sent)  # acknowledged: in a's outbox, on disk
    kill(a)
    mark = b.log_mark()
    redis_server.start()
    assert b.wait_for_log("reachable again", 20, since=mark) is not None, b.log_text()
    a2 = start_node("a", data_dir=a_data, memory=False)
    assert a2.wait_for_log("messages kept while Redis was unreachable sent") is not None
    wait_for(lambda: set(payloads(sub)) >= set(sent), "the messages a kept")
    sub.close()

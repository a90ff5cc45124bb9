"""The bridge against a real Mosquitto (and against another of our brokers): both directions with
MQTT 5 and 3.1.1, properties carried, a remote restart while 1,000 QoS 1 messages flow, our
broker killed with messages queued, no loops, TLS."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from support.certs import make_certificates
from support.clients import wait_for
from support.launcher import Mosquitto, free_port
from support.webhook_rig import Rig, write_config

pytestmark = pytest.mark.needs_mosquitto

CONNECTED = r"bridge {name}: connected to"
SUBSCRIBED = r"bridge {name}: subscribed on the remote broker"


def bridge_toml(
    name: str, port: int, protocol: str = "5", rules: str = "", extra: str = "", head: str = ""
) -> str:
    return (
        head + "[[bridge]]\n"
        f'name = "{name}"\n'
        f'address = "127.0.0.1:{port}"\n'
        f'protocol = "{protocol}"\n' + extra + rules
    )


RULES = """
[[bridge.topic]]
filter = "up/#"
direction = "out"
qos = 1
remote_prefix = "site-a/"

[[bridge.topic]]
filter = "down/#"
direction = "in"
qos = 1
local_prefix = "cloud/"
"""

OUT_QOS2 = """
[[bridge.topic]]
filter = "up/#"
direction = "out"
qos = 2
remote_prefix = "site-a/"
"""


def bridged(
    tmp_path: Path, start_broker: Callable[..., Any], remote: Mosquitto, rules: str = RULES
) -> Any:
    """Our broker with a bridge "m" (MQTT 5, ``rules``) to ``remote``, once it is connected."""
    args = write_config(tmp_path / "b.toml", bridge_toml("m", remote.port, "5", rules))
    ours = start_broker(extra_args=args)
    assert ours.wait_for_log(CONNECTED.format(name="m"), 20)
    return ours


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_both_directions_with_properties(rig: Rig, protocol: str) -> None:
    remote = rig.mosquitto()
    head = "[broker]\nsys_interval = 0.2\n\n"
    args = write_config(
        rig.tmp_path / "b.toml", bridge_toml("m", remote.port, protocol, RULES, head=head)
    )
    ours = rig.start_broker(extra_args=args)
    assert ours.wait_for_log(SUBSCRIBED.format(name="m"), 20), ours.log_text()  # type: ignore[attr-defined]
    far = rig.collect(remote.port, ["site-a/#"])
    near = rig.collect(ours.port, ["cloud/#"])  # type: ignore[attr-defined]

    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("k", "v")]
    props.ContentType = "text/plain"
    props.ResponseTopic = "reply/here"
    props.CorrelationData = b"\x01\x02"
    props.MessageExpiryInterval = 300
    local = rig.paho(ours)
    info = local.publish("up/temp", b"21.5", 1, properties=props)
    info.wait_for_publish(10)
    far.wait_count(1)
    got = far.messages[0]
    assert got.topic == "site-a/up/temp" and bytes(got.payload) == b"21.5"
    if protocol == "5":
        assert ("k", "v") in got.properties.UserProperty
        assert got.properties.ContentType == "text/plain"
        assert got.properties.ResponseTopic == "reply/here"
        assert got.properties.CorrelationData == b"\x01\x02"
        assert 0 < got.properties.MessageExpiryInterval <= 300

    cloud = rig.paho(remote)
    cloud_props = Properties(PacketTypes.PUBLISH)
    cloud_props.UserProperty = [("from", "cloud")]
    cloud.publish("down/cmd", b"on", 1, properties=cloud_props).wait_for_publish(10)
    near.wait_count(1)
    got = near.messages[0]
    assert got.topic == "cloud/down/cmd" and bytes(got.payload) == b"on"
    if protocol == "5":
        assert ("from", "cloud") in got.properties.UserProperty
    # what is not covered by a rule stays where it is
    local.publish("elsewhere/x", b"no", 1).wait_for_publish(10)
    cloud.publish("up/temp", b"not-in", 1).wait_for_publish(10)
    local.publish("up/temp", b"last", 1).wait_for_publish(10)
    far.wait_count(1, b"last")
    assert far.payloads() == [b"21.5", b"last"]
    assert near.payloads() == [b"on"]
    # the bridge's status in $SYS
    status = rig.collect(ours.port, ["$SYS/broker/bridges/m/#"], qos=0)  # type: ignore[attr-defined]

    def figure(name: str) -> bytes | None:
        found = [m for m in status.received() if m.topic == f"$SYS/broker/bridges/m/{name}"]
        return found[-1].payload if found else None

    wait_for(lambda: figure("forwarded_out") == b"2", "$SYS forwarded_out 2")
    assert figure("connected") == b"1"
    assert figure("forwarded_in") == b"1"
    assert figure("remote") == f"127.0.0.1:{remote.port}".encode()
    assert figure("queued") == b"0"
    for client in (local, cloud):
        client.close()


def test_remote_restarted_while_1000_qos1_messages_flow(rig: Rig) -> None:
    remote = rig.mosquitto(persistence=True)
    ours = bridged(rig.tmp_path, rig.start_broker, remote)
    far = rig.collect(remote.port, ["site-a/#"], persistent=True, client_id="far-collector")
    local = rig.paho(ours)
    payloads = [b"m%04d" % n for n in range(1000)]
    local.publish_all(("up/flow", p, 1, False) for p in payloads[:300])
    far.wait_count(1)
    remote.restart()  # SIGTERM: Mosquitto saves its sessions, then starts on the same port
    local.publish_all(("up/flow", p, 1, False) for p in payloads[300:])
    # QoS 1 across a restart may bring duplicates: wait for every distinct payload.
    far.wait_until(lambda: set(far.payloads(b"m")) >= set(payloads), 60, "all 1000 messages")
    assert set(far.payloads(b"m")) == set(payloads)
    local.close()


def test_outbound_flow_keeps_within_the_remote_receive_maximum(rig: Rig) -> None:
    """[MQTT-3.3.4-9] The remote's CONNACK says Receive Maximum 2 (Mosquitto's
    max_inflight_messages); the bridge keeps at most 2 QoS 2 messages unacknowledged there, so
    Mosquitto, which disconnects a client past it (0x93), keeps the bridge's one connection while
    300 messages queued at once all pass."""
    remote = rig.mosquitto(extra="max_inflight_messages 2\n")
    ours = bridged(rig.tmp_path, rig.start_broker, remote, OUT_QOS2)
    far = rig.collect(remote.port, ["site-a/#"], qos=2)
    local = rig.paho(ours)
    payloads = [b"w%04d" % n for n in range(300)]
    local.publish_all(("up/window", p, 2, False) for p in payloads)
    far.wait_until(lambda: len(far.payloads(b"w")) >= len(payloads), 30, "all 300 messages")
    assert sorted(far.payloads(b"w")) == payloads
    log = ours.log_text()
    assert len(re.findall(CONNECTED.format(name="m"), log)) == 1, log
    local.close()


def test_our_broker_killed_with_outbound_messages_queued(rig: Rig) -> None:
    remote = rig.mosquitto(start=False)  # down: everything published waits in our store
    args = write_config(rig.tmp_path / "b.toml", bridge_toml("m", remote.port, "5", RULES))
    data = rig.tmp_path / "ours"
    ours = rig.start_broker(data_dir=data, extra_args=args)
    local = rig.paho(ours)
    payloads = [b"k%03d" % n for n in range(200)]
    local.publish_all(("up/queued", p, 1, False) for p in payloads)  # acknowledged: committed
    local.client.loop_stop()
    ours.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
    ours.wait_exit()  # type: ignore[attr-defined]
    remote.start()
    far = rig.collect(remote.port, ["site-a/#"])
    again = rig.start_broker(data_dir=data, extra_args=args)
    far.wait_count(200, b"k")
    assert sorted(far.payloads(b"k")) == payloads
    assert "restored 1 sessions, 200 queued" in again.log_text()  # type: ignore[attr-defined]


def test_two_of_our_brokers_bridged_both_ways_no_loops(rig: Rig) -> None:
    """One bridge with direction "both": each message once on each side. Then a chain of
    bridges through several brokers: the marks against loops do not stop a message that has
    not been somewhere before."""
    rules = '\n[[bridge.topic]]\nfilter = "chat/#"\ndirection = "both"\nqos = 1\n'
    b2 = rig.start_broker()
    args = write_config(rig.tmp_path / "b1.toml", bridge_toml("to-b2", b2.port, "5", rules))  # type: ignore[attr-defined]
    b1 = rig.start_broker(extra_args=args)
    assert b1.wait_for_log(SUBSCRIBED.format(name="to-b2"), 20)  # type: ignore[attr-defined]
    on1 = rig.collect(b1.port, ["chat/#"])  # type: ignore[attr-defined]
    on2 = rig.collect(b2.port, ["chat/#"])  # type: ignore[attr-defined]
    p1 = rig.paho(b1)
    p2 = rig.paho(b2)
    p1.publish("chat/a", b"from-1", 1).wait_for_publish(10)
    p2.publish("chat/b", b"from-2", 1).wait_for_publish(10)
    for side in (on1, on2):
        side.wait_count(1, b"from-1")
        side.wait_count(1, b"from-2")
    # a marker sent after them arrives after any echo would have
    p1.publish("chat/z", b"marker-1", 1).wait_for_publish(10)
    p2.publish("chat/z", b"marker-2", 1).wait_for_publish(10)
    for side in (on1, on2):
        side.wait_count(1, b"marker-1")
        side.wait_count(1, b"marker-2")
    for side in (on1, on2):
        assert sorted(side.payloads(b"from")) == [b"from-1", b"from-2"], side.payloads()

    # More brokers: b3 bridges to b2 and b4 to b3 (b3 listens on a second, known port).
    port = free_port()
    head = f"[[listener]]\nport = 0\n\n[[listener]]\nport = {port}\n\n"
    args3 = write_config(
        rig.tmp_path / "b3.toml",
        head + bridge_toml("b3-to-b2", b2.port, "5", rules),  # type: ignore[attr-defined]
    )
    b3 = rig.start_broker(extra_args=args3)
    args4 = write_config(rig.tmp_path / "b4.toml", bridge_toml("to-b3", port, "5", rules))
    b4 = rig.start_broker(extra_args=args4)
    # a chain b4 -> b3 -> b2 <- b1: a message crosses three bridges
    for proc, name in ((b3, "b3-to-b2"), (b4, "to-b3")):
        assert proc.wait_for_log(SUBSCRIBED.format(name=name), 20)  # type: ignore[attr-defined]
    on4 = rig.collect(b4.port, ["chat/#"])  # type: ignore[attr-defined]
    p4 = rig.paho(b4)
    p4.publish("chat/c", b"from-4", 1).wait_for_publish(10)
    on1.wait_count(1, b"from-4")
    on4.wait_count(1, b"from-4")
    p1.publish("chat/z", b"marker-3", 1).wait_for_publish(10)
    for side in (on1, on2, on4):
        side.wait_count(1, b"marker-3")
    # every broker saw it once: it did not come back around
    for side in (on1, on2, on4):
        assert side.payloads(b"from-4") == [b"from-4"], side.payloads()
    for client in (p1, p2, p4):
        client.close()


def test_mutual_bridges_do_not_loop(rig: Rig) -> None:
    """Each of two brokers has a bridge to the other, both ways on the same topics: two paths,
    so a message may reach the far side twice, but it never circulates."""
    rules = '\n[[bridge.topic]]\nfilter = "loop/#"\ndirection = "both"\nqos = 1\n'
    port_a, port_b = free_port(), free_port()

    def config(name: str, own: int, peer: int) -> tuple[str, ...]:
        head = f"[[listener]]\nport = 0\n\n[[listener]]\nport = {own}\n\n"
        text = head + bridge_toml(f"to-{peer}", peer, "5", rules)
        return write_config(rig.tmp_path / f"{name}.toml", text)

    a = rig.start_broker(extra_args=config("a", port_a, port_b))
    b = rig.start_broker(extra_args=config("b", port_b, port_a))
    for proc, peer in ((a, port_b), (b, port_a)):
        assert proc.wait_for_log(SUBSCRIBED.format(name=f"to-{peer}"), 20)  # type: ignore[attr-defined]
    on_a = rig.collect(a.port, ["loop/#"])  # type: ignore[attr-defined]
    on_b = rig.collect(b.port, ["loop/#"])  # type: ignore[attr-defined]
    pa = rig.paho(a)
    for n in range(5):
        pa.publish("loop/x", b"once-%d" % n, 1).wait_for_publish(10)
    on_b.wait_count(5, b"once")
    # markers after them, both ways: anything still going round would show before these
    for marker in (b"marker-1", b"marker-2"):
        pa.publish("loop/x", marker, 1).wait_for_publish(10)
        on_b.wait_count(1, marker)
        on_a.wait_count(1, marker)
    for n in range(5):
        assert on_a.payloads(b"once-%d" % n) == [b"once-%d" % n], on_a.payloads()
        assert 1 <= len(on_b.payloads(b"once-%d" % n)) <= 2, on_b.payloads()
    pa.close()


def test_tls_to_a_mosquitto_tls_listener(rig: Rig) -> None:
    certs = make_certificates(rig.tmp_path / "certs")
    tls_port = free_port()
    remote = rig.mosquitto(
        extra=(
            f"listener {tls_port} 127.0.0.1\n"
            f"cafile {certs.ca}\ncertfile {certs.server_cert}\nkeyfile {certs.server_key}\n"
            "require_certificate true\n"
        )
    )
    tls = (
        f'tls_ca_file = "{certs.ca}"\ntls_server_name = "localhost"\n'
        f'tls_cert_file = "{certs.client_cert}"\ntls_key_file = "{certs.client_key}"\n'
    )
    good = bridge_toml("secure", tls_port, "5", RULES, tls)
    wrong_ca = bridge_toml(
        "untrusted",
        tls_port,
        "5",
        RULES.replace("site-a/", "site-b/"),
        f'tls_ca_file = "{certs.rogue_cert}"\ntls_server_name = "localhost"\n',
    )
    args = write_config(rig.tmp_path / "b.toml", good + "\n" + wrong_ca)
    ours = rig.start_broker(extra_args=args)
    assert ours.wait_for_log(CONNECTED.format(name="secure"), 20), ours.log_text()  # type: ignore[attr-defined]
    failed = ours.wait_for_log(r"bridge untrusted: cannot connect: .*(certificate|CERTIFICATE)", 20)  # type: ignore[attr-defined]
    assert failed, ours.log_text()  # type: ignore[attr-defined]
    far = rig.collect(remote.port, ["site-a/#", "site-b/#"])
    local = rig.paho(ours)
    local.publish("up/secret", b"over-tls", 1).wait_for_publish(10)
    far.wait_count(1)
    assert far.messages[0].topic == "site-a/up/secret"
    wait_for(lambda: far.payloads() == [b"over-tls"], "the message over TLS")
    local.close()


def test_remote_keeps_the_bridge_session_across_our_outage(rig: Rig) -> None:
    """MQTT 5, Clean Start 0 and a Session Expiry Interval: while our broker is down the remote
    keeps the bridge's subscription and queues for it; it all comes in after our restart."""
    remote = rig.mosquitto()
    args = write_config(rig.tmp_path / "b.toml", bridge_toml("m", remote.port, "5", RULES))
    data = rig.tmp_path / "ours"
    first = rig.start_broker(data_dir=data, extra_args=args)
    assert first.wait_for_log(SUBSCRIBED.format(name="m"), 20)  # type: ignore[attr-defined]
    near = rig.collect(first.port, ["cloud/#"], persistent=True, client_id="near")  # type: ignore[attr-defined]
    near.close()
    first.stop()  # type: ignore[attr-defined]
    cloud = rig.paho(remote)
    payloads = [b"while-away-%02d" % n for n in range(50)]
    cloud.publish_all(("down/cmd", p, 1, False) for p in payloads)
    second = rig.start_broker(data_dir=data, extra_args=args)
    assert second.wait_for_log("remote session resumed", 20)  # type: ignore[attr-defined]
    back = rig.collect(second.port, ["cloud/#"], persistent=True, client_id="near")  # type: ignore[attr-defined]
    back.wait_count(50, b"while-away")
    assert sorted(back.payloads(b"while-away")) == payloads
    cloud.close()


def test_mqtt311_remote_echo_is_dropped(rig: Rig) -> None:
    """MQTT 3.1.1 has no No Local: with direction "both" the remote sends the bridge its own
    messages back, and the bridge recognises and drops them (one copy here, one there)."""
    remote = rig.mosquitto()
    rules = '\n[[bridge.topic]]\nfilter = "both/#"\ndirection = "both"\nqos = 1\n'
    args = write_config(rig.tmp_path / "b.toml", bridge_toml("m", remote.port, "3.1.1", rules))
    ours = rig.start_broker(extra_args=args)
    assert ours.wait_for_log(SUBSCRIBED.format(name="m"), 20)  # type: ignore[attr-defined]
    near = rig.collect(ours.port, ["both/#"])  # type: ignore[attr-defined]
    far = rig.collect(remote.port, ["both/#"])
    local = rig.paho(ours)
    cloud = rig.paho(remote)
    local.publish_all(("both/a", p, 1, False) for p in [b"here-1", b"here-2"])
    cloud.publish("both/b", b"there-1", 1)
    local.publish("both/z", b"marker", 1)
    far.wait_count(1, b"marker")  # the remote had all ours sent, and sent its echoes back
    # The remote's own marker follows there-1 and those echoes on the bridge's link: once it is
    # here, an echo not dropped would be too.
    cloud.publish("both/y", b"marker-back", 1)
    near.wait_count(1, b"marker-back")
    far.wait_count(1, b"marker-back")
    expected = [b"here-1", b"here-2", b"marker", b"marker-back", b"there-1"]
    assert sorted(near.payloads()) == expected
    assert sorted(far.payloads()) == expected
    for client in (local, cloud):
        client.close()

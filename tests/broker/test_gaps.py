"""Behaviours a broader suite checks: broker-sent topic aliases after a reconnect, expiry of
messages held back by the client's Receive Maximum, the Server Keep Alive enforced, and a
session's expiry bracketed in time (the harness clock makes the brackets exact)."""

from __future__ import annotations

from typing import Any

from support.harness import Harness, Prop, pk


def test_server_keep_alive_enforced(make_harness: Any) -> None:
    """With max_keepalive 10 a client asking for 0 (or 60) is told Server Keep Alive 10 and is
    held to it (MQTT-3.1.2-22 at the server's value): still connected a little before 1.5 x 10
    s of silence, gone after."""
    h: Harness = make_harness(max_keepalive=10)
    for asked in (0, 60):
        c = h.connect(f"c{asked}", keep_alive=asked)
        assert c.connack is not None
        assert c.connack.properties[Prop.SERVER_KEEP_ALIVE] == 10
        start = h.clock.now
        h.tick(14.5)
        assert not c.link.closed
        h.tick(1.0)
        assert c.link.closed
        packets = c.receive()
        assert isinstance(packets[-1], pk.Disconnect) and packets[-1].reason_code == 0x8D
        h.clock.now = start


def test_session_expiry_bracketed(h: Harness) -> None:
    """Session Expiry Interval 30: the session is there just before 30 s, gone just after; a
    DISCONNECT raising it to 100 keeps it past 30 s (MQTT-3.1.2-23)."""
    props = {Prop.SESSION_EXPIRY_INTERVAL: 30}
    h.connect("a", properties=props).lose()
    h.tick(29.9)
    h.connect("a", clean_start=False, properties=props, expect_present=True).lose()
    h.tick(30.1)
    h.connect("a", clean_start=False, properties=props, expect_present=False).disconnect()
    b = h.connect("b", properties=props)
    b.disconnect(properties={Prop.SESSION_EXPIRY_INTERVAL: 100})
    h.tick(99.0)
    h.connect("b", clean_start=False, properties=props, expect_present=True).lose()
    h.tick(100.5)
    h.connect("b", clean_start=False, properties=props, expect_present=False)


def test_session_expiry_never(h: Harness) -> None:
    """0xFFFFFFFF: the session does not expire (a year later it is still there)."""
    props = {Prop.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF}
    h.connect("forever", properties=props).lose()
    h.tick(366 * 86400.0)
    h.connect("forever", clean_start=False, properties=props, expect_present=True)


def test_session_expiry_set_on_disconnect_after_0_is_a_protocol_error(h: Harness) -> None:
    """CONNECT with Session Expiry Interval 0 then DISCONNECT with a non-zero one: a Protocol
    Error (section 3.14.2.2.2): DISCONNECT 0x82, and the will is published as after any
    error."""
    watcher = h.connect("w")
    watcher.subscribe("will/#")
    c = h.connect("c", will=pk.Will("will/c", b"gone"))
    c.disconnect(properties={Prop.SESSION_EXPIRY_INTERVAL: 10})
    packets = c.receive()
    assert isinstance(packets[-1], pk.Disconnect) and packets[-1].reason_code == 0x82
    assert [p.topic for p in watcher.publishes()] == ["will/c"]
    h.connect("c", clean_start=False, expect_present=False)

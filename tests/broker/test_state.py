"""broker/state.py: the connection state machine: the tables are complete and consistent, and a
real connection walks every transition they list, each by the event the table names, and answers a
packet its state does not accept as that state says (a first packet that is not CONNECT, a second
CONNECT)."""

from __future__ import annotations

from typing import Any

import pytest
from support.codec import encoded_connect
from support.harness import (
    METHOD,
    MQTT_5,
    Harness,
    Offload,
    Prop,
    RecordingBackplane,
    ToyAuthenticator,
    pk,
)

from mqttbroker.broker import state as st
from mqttbroker.broker.auth import LoginRequest
from mqttbroker.protocol import grammar
from mqttbroker.protocol.packets import PacketType

ALL_STATES = (st.AWAIT_CONNECT, st.AUTHENTICATING, st.CONNECTED, st.CLOSED)


class _Authenticator(ToyAuthenticator):
    """The toy challenge/response method and passwords; clients without a user name too."""

    def check_password(self, login: LoginRequest) -> int:
        return 0 if login.username is None else super().check_password(login)


@pytest.fixture
def ha(make_harness: Any) -> Harness:
    harness: Harness = make_harness()
    harness.broker.authenticator = _Authenticator()
    return harness


def _auth_connect() -> pk.Connect:
    return pk.Connect(client_id="a", properties={Prop.AUTHENTICATION_METHOD: METHOD})


def test_the_tables_cover_every_state_and_closed_is_final() -> None:
    assert set(st.TRANSITIONS) == set(ALL_STATES) == set(st.RECEIVES) == set(st.State)
    assert st.TRANSITIONS[st.CLOSED] == {} and st.RECEIVES[st.CLOSED] == frozenset()
    for state in ALL_STATES:
        if state != st.CLOSED:  # every live state can close
            assert st.TRANSITIONS[state][st.Event.CLOSE] == st.CLOSED
        for event in st.Event:
            if event in st.TRANSITIONS[state]:
                assert st.next_state(state, event) == st.TRANSITIONS[state][event]
            else:
                with pytest.raises(st.IllegalTransition, match=st.State(state).name):
                    st.next_state(state, event)
    # every state is reachable from the first one
    seen, todo = {st.AWAIT_CONNECT}, [st.AWAIT_CONNECT]
    while todo:
        for target in st.TRANSITIONS[todo.pop()].values():
            if target not in seen:
                seen.add(target)
                todo.append(target)
    assert seen == set(ALL_STATES)
    # what a client may never send, in any state
    never = {PacketType.CONNACK, PacketType.SUBACK, PacketType.UNSUBACK, PacketType.PINGRESP}
    assert not any(never & accepted for accepted in st.RECEIVES.values())


def test_a_connection_walks_every_transition(ha: Harness) -> None:
    walked: set[tuple[int, int]] = set()

    def step(client: Any, event: st.Event, action: Any) -> None:
        before = client.conn.state
        action()
        assert client.conn.state == st.TRANSITIONS[before][event], (st.State(before), event)
        walked.add((before, event))

    # AWAIT_CONNECT -ACCEPT-> CONNECTED -CLOSE-> CLOSED
    plain = ha.client()
    step(plain, st.Event.ACCEPT, lambda: plain.send(pk.Connect(client_id="p")))
    step(plain, st.Event.CLOSE, lambda: plain.disconnect())
    # AWAIT_CONNECT -CLOSE-> CLOSED: the first packet is not a CONNECT
    stranger = ha.client()
    step(stranger, st.Event.CLOSE, lambda: stranger.send(pk.Pingreq()))
    # AWAIT_CONNECT -AUTHENTICATE-> AUTHENTICATING -ACCEPT-> CONNECTED (enhanced auth)
    exchange = ha.client()
    step(exchange, st.Event.AUTHENTICATE, lambda: exchange.send(_auth_connect()))
    answer = {Prop.AUTHENTICATION_METHOD: METHOD, Prop.AUTHENTICATION_DATA: b"ecnon"}
    step(exchange, st.Event.ACCEPT, lambda: exchange.send(pk.Auth(0x18, answer)))
    # AUTHENTICATING -CLOSE-> CLOSED: the client gives up
    quitter = ha.client()
    step(quitter, st.Event.AUTHENTICATE, lambda: quitter.send(_auth_connect()))
    step(quitter, st.Event.CLOSE, lambda: quitter.disconnect())
    # the same two through a password check run off the event loop
    offload = ha.broker.offload = Offload()
    checked = ha.client()
    step(
        checked,
        st.Event.AUTHENTICATE,
        lambda: checked.send(pk.Connect(client_id="c", username="alice", password=b"secret")),
    )
    step(checked, st.Event.ACCEPT, offload.run_all)
    # a cluster node claims the client id before CONNACK, after the password check too
    claims = ha.broker.router.backplane = RecordingBackplane()
    claimed = ha.client()
    step(
        claimed,
        st.Event.AUTHENTICATE,
        lambda: claimed.send(pk.Connect(client_id="k", username="alice", password=b"secret")),
    )
    step(claimed, st.Event.AUTHENTICATE, offload.run_all)  # checked: now the claim
    step(claimed, st.Event.ACCEPT, claims.grant_all)
    assert walked == {(s, e) for s, events in st.TRANSITIONS.items() for e in events}


def test_each_state_answers_a_packet_it_does_not_accept(ha: Harness) -> None:
    # before CONNECT: closed without a word (MQTT-3.1.0-1)
    first = ha.client()
    first.send(pk.Subscribe(1, [pk.SubscriptionRequest("a")]))
    assert first.closed and first.link.data == b""
    # authenticating: a CONNACK with 0x82 (MQTT-3.1.2-30)
    authenticating = ha.client()
    authenticating.send(_auth_connect())
    assert authenticating.one(pk.Auth).reason_code == 0x18
    authenticating.send(pk.Pingreq())
    assert authenticating.one(pk.Connack).reason_code == 0x82
    assert authenticating.conn.state == st.CLOSED
    # connected: a second CONNECT is a protocol error, DISCONNECT 0x82 (MQTT-3.1.0-2)
    connected = ha.connect("twice")
    connected.send(pk.Connect(client_id="twice"))
    assert connected.one(pk.Disconnect).reason_code == 0x82
    # closed: nothing more is read (MQTT-3.1.4-6)
    connected.send(pk.Pingreq())
    assert connected.receive() == []


@pytest.mark.parametrize(
    "first_packet",
    [
        pytest.param(b"\xc0\x00", id="PINGREQ"),
        pytest.param(grammar.encode(pk.Publish("t", b"x"), MQTT_5), id="PUBLISH"),
        pytest.param(
            grammar.encode(pk.Subscribe(1, [pk.SubscriptionRequest("t")]), MQTT_5), id="SUBSCRIBE"
        ),
        pytest.param(b"\xe0\x00", id="DISCONNECT"),
    ],
)
def test_first_packet_not_connect(h: Harness, first_packet: bytes) -> None:
    """[MQTT-3.1.0-1] [MQTT-4.13.1-1] A first packet other than CONNECT closes the connection. No
    CONNACK: there is no CONNECT to acknowledge (a CONNACK may only answer an error in a CONNECT,
    section 4.13.1), and the client's protocol version is not even known."""
    client = h.client()
    client.send_raw(first_packet)
    h.broker.scheduler.flush()
    assert client.closed
    assert client.link.data == b""
    assert h.broker.sessions == {}


def test_second_connect_is_a_protocol_error(h: Harness) -> None:
    """[MQTT-3.1.0-2] A second CONNECT gets DISCONNECT 0x82 and the connection is closed."""
    client = h.connect("c1")
    client.send_raw(encoded_connect("c1"))
    received = client.receive()
    assert len(received) == 1 and isinstance(received[0], pk.Disconnect), received
    assert received[0].reason_code == 0x82
    assert client.closed

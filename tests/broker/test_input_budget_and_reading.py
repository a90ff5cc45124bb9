"""The input budget (``input_budget`` packets per connection per event-loop pass): what is left
is parsed on later passes, intact and in order, and the loop is woken for it even when there is
no output to flush; reading resumes after a password check answered off the event loop."""

from __future__ import annotations

from typing import Any

from support.harness import Harness, Offload, ToyAuthenticator, pk

PINGREQ = b"\xc0\x00"


def test_input_past_the_budget_is_parsed_on_later_passes(make_harness: Any) -> None:
    h: Harness = make_harness(input_budget=3)
    client = h.connect("c")
    client.send_raw(PINGREQ * 7)
    answers: list[Any] = []
    for _ in range(5):  # one flush per receive(): three packets per pass
        answers += client.receive()
    assert [type(p) for p in answers] == [pk.Pingresp] * 7
    assert not client.closed and not client.link.reading_paused
    client.send_raw(PINGREQ)  # nothing was left behind to spoil what comes next
    assert client.one(pk.Pingresp)


def test_a_packet_split_at_the_budget_is_joined(make_harness: Any) -> None:
    h: Harness = make_harness(input_budget=2)
    sub = h.connect("sub")
    sub.subscribe("t")
    pub = h.connect("pub")
    raw = PINGREQ * 2 + b"\x30\x07\x00\x01t\x00abc"  # the PUBLISH waits for the next pass
    pub.send_raw(raw[:-2])
    pub.send_raw(raw[-2:])
    for _ in range(3):
        pub.receive()
    assert [p.payload for p in sub.publishes()] == [b"abc"]
    assert not pub.closed


def test_deferred_input_wakes_the_loop_without_output(make_harness: Any) -> None:
    """Input left over when nothing is to be written: the broker asks the edge for another
    pass (``wake``), or the rest would wait for some unrelated event."""
    h: Harness = make_harness(input_budget=2)
    client = h.connect("c")
    h.broker.flush()
    wakes: list[int] = []
    h.broker.wake = lambda: wakes.append(1)
    raw = b"\x30\x04\x00\x01t\x00" * 5  # QoS 0, nobody subscribed
    client.send_raw(raw)
    assert wakes == [1]
    assert client.link.reading_paused and not client.closed


def test_reading_resumes_after_an_off_loop_password_check(make_harness: Any) -> None:
    """While the check runs, reading pauses; once the CONNECT is accepted it resumes, also
    when nothing else was sent meanwhile."""
    h: Harness = make_harness()
    h.broker.authenticator = ToyAuthenticator()
    offload = h.broker.offload = Offload()
    client = h.client()
    client.send(pk.Connect(client_id="c", username="alice", password=b"secret"))
    assert client.link.reading_paused
    offload.run_all()
    assert client.one(pk.Connack).reason_code == 0
    assert not client.link.reading_paused
    client.send_raw(PINGREQ)
    assert client.one(pk.Pingresp)

"""The pass scheduler (broker/passes.py): output buffered during a pass is written once per
connection when the pass is flushed, the loop is asked for that flush once per pass, input past
its budget waits for the next pass, and a transport that frames its own passes is flushed at
their end. How a read's output is written early is tested with the TCP protocol in
tests/transports/test_write_passes.py."""

from __future__ import annotations

from support.harness import Client, Harness, pk

from mqttbroker.protocol import grammar
from mqttbroker.protocol.packets import MQTT_5


def _wakes(h: Harness) -> list[int]:
    wakes: list[int] = []
    h.broker.scheduler.wake = lambda: wakes.append(1)
    return wakes


def _quiet(h: Harness, *clients: Client) -> None:
    """End the pass that connected ``clients`` and forget what was written so far."""
    h.broker.scheduler.flush()
    for client in clients:
        client.link.writes.clear()


def test_output_of_a_pass_is_written_once_per_connection_and_the_loop_woken_once(
    h: Harness,
) -> None:
    a = h.connect("a")
    b = h.connect("b")
    _quiet(h, a, b)
    scheduler = h.broker.scheduler
    wakes = _wakes(h)
    passes = scheduler.passes

    a.conn.send(b"1")
    b.conn.send(b"2")
    a.conn.send(b"3")
    assert wakes == [1]  # the first output of the pass asks for the flush; the rest does not
    assert a.link.writes == [] and b.link.writes == []  # nothing before the flush
    scheduler.flush()
    assert a.link.writes == [b"13"] and b.link.writes == [b"2"]
    assert scheduler.passes == passes + 1

    scheduler.flush()  # a pass without output writes nothing
    assert a.link.writes == [b"13"] and b.link.writes == [b"2"]
    a.conn.send(b"4")  # the next pass's first output asks again
    assert wakes == [1, 1]
    scheduler.flush()
    assert a.link.writes == [b"13", b"4"]


def test_input_past_its_budget_waits_for_the_next_pass(make_harness: object) -> None:
    h: Harness = make_harness(input_budget=2)  # type: ignore[operator]
    client = h.connect("c")
    _quiet(h, client)
    scheduler = h.broker.scheduler
    wakes = _wakes(h)
    stats = h.broker.stats
    received = stats.received_q0
    publish = grammar.encode(pk.Publish("t", b"m", 0), MQTT_5)

    client.send_raw(publish * 5)
    assert stats.received_q0 == received + 2  # the budget of this pass
    assert client.link.reading_paused
    assert wakes == [1]  # deferred input alone asks for the flush
    scheduler.flush()  # the next pass resumes it, with a budget of its own
    assert stats.received_q0 == received + 4
    scheduler.flush()
    assert stats.received_q0 == received + 5
    assert not client.link.reading_paused
    scheduler.flush()
    assert stats.received_q0 == received + 5


def test_a_framed_pass_asks_for_no_wake_and_is_flushed_at_its_end(h: Harness) -> None:
    client = h.connect("c")
    _quiet(h, client)
    scheduler = h.broker.scheduler
    wakes = _wakes(h)
    passes = scheduler.passes

    scheduler.pass_begin()
    client.conn.send(b"1")
    client.conn.send(b"2")
    assert wakes == [] and client.link.writes == []
    scheduler.pass_end()
    assert client.link.writes == [b"12"]
    assert scheduler.passes == passes + 1

    scheduler.pass_begin()
    scheduler.pass_end()  # nothing due: no flush
    assert scheduler.passes == passes + 1
    client.conn.send(b"3")  # outside a framed pass the loop is asked, as before
    assert wakes == [1]

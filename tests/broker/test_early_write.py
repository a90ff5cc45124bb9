"""Broker.handle_read: while the event loop is not under load, the output of a pass's first read
goes out at once; later reads of the pass, and every read after a crowded pass, leave theirs
for the flush at the end of the pass (one write per connection per pass under load)."""

from __future__ import annotations

from support.harness import Client, Harness, pk

from mqttbroker.protocol import grammar


def read(h: Harness, client: Client, payload: bytes) -> None:
    """One transport read from ``client``: a QoS 0 PUBLISH to "t"."""
    h.broker.handle_read(client.conn, grammar.encode(pk.Publish(topic="t", payload=payload), 5))


def test_first_read_of_an_idle_pass_is_written_at_once_later_ones_at_the_flush(
    h: Harness,
) -> None:
    sub = h.connect("sub")
    sub.subscribe("t")
    a, b = h.connect("a"), h.connect("b")
    h.broker.flush()

    def written() -> list[bytes]:
        return [p.payload for p in sub.unread()]

    read(h, a, b"1")  # the first read of an idle pass: out before the flush
    assert written() == [b"1"]
    read(h, b, b"2")  # a second read in the same pass: waits for the pass's flush
    assert written() == []
    h.broker.flush()
    assert written() == [b"2"]
    read(h, a, b"3")  # that pass was crowded: even the next pass's first read waits
    assert written() == []
    h.broker.flush()
    assert written() == [b"3"]
    read(h, a, b"4")  # a pass of one read is not crowded: the next one is idle again
    assert written() == [b"4"]


def test_the_broker_counts_each_byte_read_and_written_once(h: Harness) -> None:
    """The broker's byte totals are the sums of its connections' counts, which are what the
    links carried (the transports do not count again)."""
    sub = h.connect("sub")
    sub.subscribe("t")
    pub = h.connect("pub")
    read(h, pub, b"x" * 100)
    h.broker.flush()
    clients = [sub, pub]
    assert h.broker.bytes_sent == sum(len(c.link.data) for c in clients)
    assert h.broker.bytes_sent == sum(c.conn.bytes_sent for c in clients) > 100
    assert h.broker.bytes_received == sum(c.conn.bytes_received for c in clients) > 100

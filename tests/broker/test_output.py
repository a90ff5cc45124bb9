"""broker/output.py: one write per flush, output held back until the store commits (in order,
what came later waiting behind), the transport's pause and the bound past it, and an idle
output keeping no list."""

from __future__ import annotations

from support.harness import FakeLink

from mqttbroker.broker.output import Output


def output() -> tuple[Output, FakeLink]:
    return Output(), FakeLink()


def test_the_first_packet_since_a_flush_asks_for_one() -> None:
    out, link = output()
    assert out.append(b"a") is True
    assert out.append(b"b") is False
    assert link.writes == []  # nothing is written before the flush
    assert out.flush(link) == 2
    assert link.writes == [b"ab"] and out.chunks is None and out.sent == 2
    assert out.flush(link) == 0 and out.append(b"c") is True


def test_held_output_waits_for_its_commit_and_later_output_behind_it() -> None:
    out, link = output()
    out.append(b"ack1")
    out.hold()  # the store's batch must commit first
    out.append(b"ack2")
    out.hold()  # a second batch
    out.append(b"x")
    assert out.held() and out.flush(link) == 0 and link.writes == []
    assert out.release() is True  # the first batch committed: its output may go
    assert out.flush(link) == 4 and link.writes == [b"ack1"]
    assert out.chunks == [b"ack2", b"x"]  # behind the second batch
    assert out.release() is True  # nothing waits any more: the rest goes in one write
    out.flush(link)
    assert link.writes == [b"ack1", b"ack2x"] and out.chunks is None


def test_output_after_the_last_hold_goes_once_everything_held_is_committed() -> None:
    out, link = output()
    out.append(b"ack")
    out.hold()
    assert out.release() is True
    out.append(b"late")
    out.flush(link)
    assert link.writes == [b"acklate"]  # nothing waits any more: one write


def test_a_release_after_the_close_flushed_everything_does_nothing() -> None:
    out, link = output()
    out.append(b"ack")
    out.hold()
    out.flush_all(link)  # the close writes it all
    assert link.writes == [b"ack"] and not out.held()
    assert out.release() is False


def test_nothing_is_written_once_the_transport_is_gone() -> None:
    out, link = output()
    out.append(b"a")
    out.drop()
    assert out.flush(link) == 0 and link.writes == []


def test_the_bound_counts_only_while_the_transport_is_paused() -> None:
    out, link = output()
    link.unread = 5000
    assert not out.over(link, 1000)  # not paused: the transport is below its high-water mark
    out.paused = True
    assert out.over(link, 1000)
    assert not out.over(link, 0)  # 0: no bound
    assert not out.over(link, 5000)

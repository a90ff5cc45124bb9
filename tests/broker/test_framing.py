"""broker/framing.py: packets cut out of the bytes read (the Remaining Length, 1 to 4 bytes),
an incomplete packet kept across reads until the bytes it needs are there, the size limits
refused from the fixed header, the per-pass work budget, and reading paused and resumed."""

from __future__ import annotations

import pytest
from support.harness import FakeLink

from mqttbroker.broker.framing import Framing
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.protocol import fastpath
from mqttbroker.protocol.errors import MalformedPacket, PacketTooLarge

OPTIONS = BrokerOptions()


def framing() -> Framing:
    return Framing()


def packet(body_size: int, first: int = 0x30) -> bytes:
    return bytes([first]) + fastpath.encode_vbi(body_size) + b"x" * body_size


def cut(f: Framing, data: bytes, opts: BrokerOptions = OPTIONS) -> list[bytes]:
    """The bodies of the whole packets in ``data``, as the connection's loop cuts them."""
    bodies = []
    pos = 0
    while pos < len(data):
        stop = f.split(data, pos, len(data), opts, True)
        if stop < 0:
            break
        bodies.append(data[f.body : stop])
        pos = stop
    return bodies


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 200_000])
def test_split_finds_the_body_after_a_remaining_length_of_any_width(size: int) -> None:
    f = framing()
    data = packet(size) + packet(3)
    assert [len(body) for body in cut(f, data, BrokerOptions(max_packet_size=300_000))] == [
        size,
        3,
    ]


def test_an_incomplete_packet_says_how_many_bytes_it_needs() -> None:
    f = framing()
    data = packet(300)
    assert f.split(data[:100], 0, 100, OPTIONS, True) == -1
    assert f.need == len(data)


def test_an_incomplete_fixed_header_needs_any_byte_more() -> None:
    f = framing()
    data = packet(300)  # two bytes of Remaining Length
    assert f.split(data[:2], 0, 2, OPTIONS, True) == -1
    assert f.need == 0
    assert f.split(data[:1], 0, 1, OPTIONS, True) == -1


@pytest.mark.parametrize(
    "header",
    [b"\x30\x80\x00", b"\x30\xff\x80\x00", b"\x30\xff\xff\xff\xff\x01"],
    ids=["not-minimal", "not-minimal-3", "five-bytes"],
)
def test_a_malformed_remaining_length_is_refused(header: bytes) -> None:
    f = framing()
    with pytest.raises(MalformedPacket):
        f.split(header + b"x" * 10, 0, len(header) + 10, OPTIONS, True)


def test_size_limits_are_checked_from_the_fixed_header() -> None:
    """Past max_connect_size before the client is connected, past max_packet_size always:
    refused before the body has arrived."""
    f = framing()
    opts = BrokerOptions(max_connect_size=100, max_packet_size=1000)
    head = packet(200)[:3]
    with pytest.raises(PacketTooLarge, match="max_connect_size"):
        f.split(head, 0, len(head), opts, False)
    assert f.split(head, 0, len(head), opts, True) == -1  # connected: within max_packet_size
    big = packet(2000)[:3]
    with pytest.raises(PacketTooLarge, match="maximum of 1000"):
        f.split(big, 0, len(big), opts, True)
    assert [len(b) for b in cut(f, packet(997), opts)] == [997]  # 1000 bytes with its header


def test_an_incomplete_packet_is_kept_until_the_bytes_it_needs_are_there() -> None:
    f = framing()
    data = packet(300) + packet(5)
    first = data[:50]
    assert f.split(first, 0, len(first), OPTIONS, True) == -1
    f.leave(first)
    assert not f.whole()
    assert f.take(data[50:200]) is None  # still short of the 303 bytes it needs
    joined = f.take(data[200:])
    assert joined == data and f.pending is None and f.need == 0
    assert [len(body) for body in cut(f, joined)] == [300, 5]


def test_input_kept_for_later_is_read_whole_with_what_comes_next() -> None:
    """What a pass's budget left (or an awaited answer held) is read at once when resumed."""
    f = framing()
    f.keep(b"")
    assert f.pending is None  # nothing to keep
    f.keep(b"ab")
    f.keep(b"cd")
    assert f.whole() and f.take(b"") == b"abcd"
    assert f.take(b"ef") == b"ef"


def test_the_work_budget_counts_per_pass() -> None:
    f = framing()
    f.begin_pass(1)
    f.work += 5
    f.begin_pass(1)
    assert f.work == 5
    f.begin_pass(2)
    assert f.work == 0


def test_reading_is_paused_and_resumed_once() -> None:
    f = framing()
    link = FakeLink()
    f.resume(link)
    assert not link.reading_paused
    f.pause(link)
    link.reading_paused = False  # a second pause asks nothing more of the transport
    f.pause(link)
    assert f.paused and not link.reading_paused
    f.resume(link)
    assert not f.paused and not link.reading_paused
    link.reading_paused = True
    f.resume(link)  # a second resume neither
    assert link.reading_paused

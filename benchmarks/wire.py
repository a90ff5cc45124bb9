"""MQTT bytes for the load generator, built by hand: CONNECT, SUBSCRIBE, PUBLISH, the acks and
DISCONNECT for MQTT 5 (protocol level 5) and 3.1.1 (level 4), plus the frame walking the receivers
use. Nothing here imports the broker under test, so the suite measures any broker.

Receivers do not decode PUBLISH packets: they walk fixed headers, and :func:`count_publishes`
checks a whole chunk of same-sized frames with two strided slices (C speed) instead of a Python
loop per packet.
"""

from __future__ import annotations

MQTT_5 = 5
MQTT_311 = 4

CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBACK = 9
PINGRESP = 13
DISCONNECT = 14

PROP_RECEIVE_MAXIMUM = 0x21
PROP_SESSION_EXPIRY = 0x11

PAYLOAD_SIZE = 64


def vbi(value: int) -> bytes:
    """Variable Byte Integer (MQTT 1.5.5)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def s16(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + vbi(len(body)) + body


def connect(
    client_id: str,
    version: int = MQTT_5,
    keep_alive: int = 0,
    clean_start: bool = True,
    session_expiry: int = 0,
) -> bytes:
    """CONNECT, no will, no credentials. By default Clean Start (3.1.1: Clean Session) and no
    properties; ``clean_start=False`` resumes or keeps a session, which in MQTT 5 lives on after
    the connection for ``session_expiry`` seconds (sent as Session Expiry Interval)."""
    flags = 0x02 if clean_start else 0x00
    body = b"\x00\x04MQTT" + bytes([version, flags]) + keep_alive.to_bytes(2, "big")
    if version == MQTT_5:
        if session_expiry:
            body += b"\x05" + bytes([PROP_SESSION_EXPIRY]) + session_expiry.to_bytes(4, "big")
        else:
            body += b"\x00"
    return _packet(0x10, body + s16(client_id))


def subscribe(packet_id: int, filters: list[tuple[str, int]], version: int = MQTT_5) -> bytes:
    body = packet_id.to_bytes(2, "big")
    if version == MQTT_5:
        body += b"\x00"
    for topic, qos in filters:
        body += s16(topic) + bytes([qos])
    return _packet(0x82, body)


def publish(
    topic: str, payload: bytes, qos: int = 0, packet_id: int = 0, version: int = MQTT_5
) -> bytes:
    body = s16(topic)
    if qos:
        body += packet_id.to_bytes(2, "big")
    if version == MQTT_5:
        body += b"\x00"
    return _packet(0x30 | (qos << 1), body + payload)


def disconnect(version: int = MQTT_5, end_session: bool = False) -> bytes:
    """Normal DISCONNECT (0x00). ``end_session`` (MQTT 5 only): also set Session Expiry
    Interval 0, so a persistent session ends with the connection."""
    if end_session and version == MQTT_5:
        return b"\xe0\x07\x00\x05" + bytes([PROP_SESSION_EXPIRY]) + b"\x00\x00\x00\x00"
    return b"\xe0\x00"


def payload(seed: int = 0, size: int = PAYLOAD_SIZE) -> bytes:
    """A payload of ``size`` bytes; the first 8 are free for a timestamp or sequence number."""
    return seed.to_bytes(8, "big") + b"x" * (size - 8)


# -- receiving ------------------------------------------------------------------------------------


def read_remaining_length(data: bytes, pos: int, end: int) -> tuple[int, int] | None:
    """Remaining Length of the frame starting at ``pos``: (length, body position), or None when
    more bytes are needed. Raises ValueError on a malformed length."""
    value = 0
    shift = 0
    p = pos + 1
    for _ in range(4):
        if p >= end:
            return None
        byte = data[p]
        p += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, p
        shift += 7
    raise ValueError("Remaining Length longer than 4 bytes")


def next_frame(data: bytes, pos: int = 0) -> tuple[int, int, int] | None:
    """(first byte, body position, end position) of the frame at ``pos``, or None if incomplete."""
    end = len(data)
    if pos + 2 > end:
        return None
    header = read_remaining_length(data, pos, end)
    if header is None:
        return None
    length, body = header
    if body + length > end:
        return None
    return data[pos], body, body + length


def count_publishes(
    data: bytes, frame_len: int, first: int, second: int, others: list[tuple[int, bytes]]
) -> tuple[int, int]:
    """Count complete PUBLISH frames in ``data``; returns (count, position of the first byte not
    consumed). ``frame_len``/``first``/``second`` describe the expected frame (all the same size,
    as in every throughput scenario): a run of them is verified with two strided slices, which
    check the fixed header of every frame at C speed. Anything else is walked frame by frame;
    frames that are not PUBLISH are appended to ``others`` as (first byte, body)."""
    end = len(data)
    pos = 0
    count = 0
    if frame_len > 1 and second >= 0:
        k = end // frame_len
        if k:
            stop = k * frame_len
            if (
                data[0:stop:frame_len].count(first) == k
                and data[1:stop:frame_len].count(second) == k
            ):
                count = k
                pos = stop
    # The tail (an incomplete frame), or a chunk holding anything else: walk it.
    while pos < end:
        header = read_remaining_length(data, pos, end)
        if header is None:
            break
        length, body = header
        stop = body + length
        if stop > end:
            break
        b0 = data[pos]
        if b0 >> 4 == PUBLISH:
            count += 1
        else:
            others.append((b0, data[body:stop]))
        pos = stop
    return count, pos


def connack_result(body: bytes, version: int) -> tuple[int, dict[int, int]]:
    """(reason code, the integer properties we care about) of a CONNACK body."""
    code = body[1] if len(body) > 1 else 255
    props: dict[int, int] = {}
    if version == MQTT_5 and len(body) > 2:
        header = read_remaining_length(body, 1, len(body))  # property length is a VBI at 2
        if header is not None:
            length, pos = header
            stop = min(pos + length, len(body))
            while pos < stop:
                pid = body[pos]
                pos += 1
                if pid in (0x24, 0x25, 0x28, 0x29, 0x2A, 0x01, 0x17, 0x19):  # byte
                    props[pid] = body[pos]
                    pos += 1
                elif pid in (0x21, 0x13, 0x22):  # two-byte integer
                    props[pid] = int.from_bytes(body[pos : pos + 2], "big")
                    pos += 2
                elif pid in (0x11, 0x27, 0x02):  # four-byte integer
                    props[pid] = int.from_bytes(body[pos : pos + 4], "big")
                    pos += 4
                elif pid == 0x26:  # user property: two strings
                    for _ in range(2):
                        pos += 2 + int.from_bytes(body[pos : pos + 2], "big")
                elif pid in (0x12, 0x1A, 0x1C, 0x1F, 0x15, 0x16):  # string / binary
                    pos += 2 + int.from_bytes(body[pos : pos + 2], "big")
                else:
                    break  # unknown: stop reading properties
    return code, props


def suback_codes(body: bytes, version: int) -> list[int]:
    pos = 2
    if version == MQTT_5:
        header = read_remaining_length(body, pos - 1, len(body))
        if header is None:
            return []
        length, pos = header
        pos += length
    return list(body[pos:])


_ACK_KEY = b"\x40\x02\x00\x00"  # a PUBACK without reason code: the identifier is filled in
SHORT_RUN = 4  # up to this many 5-byte PUBACKs, puback_keys checks them one by one


def puback_keys(data: bytes) -> tuple[bytes | bytearray, int] | None:
    """A chunk of successful PUBACKs as 4-byte frames ``40 02 hi lo``, one per PUBACK, and how
    many bytes of ``data`` they cover (an incomplete frame after them is left out); None when
    the chunk does not start with such a run.

    Brokers send a successful PUBACK either without reason code (4 bytes, as this broker does)
    or with reason code 0x00 (5 bytes, as Mosquitto does); either way the answer is 4 bytes per
    PUBACK, to be read as native uint32s (``memoryview(keys).cast("I")``) and looked up in a
    table: a 4-byte chunk is returned as is, unchecked (an unknown key is the caller's sign that
    it was something else), a 5-byte one only when every frame's header and reason code (below
    0x80) check out, with strided slices at C speed."""
    size = len(data)
    if size < 4 or data[0] != 0x40:
        return None
    if data[1] == 2:
        whole = size & -4
        return (data if whole == size else data[:whole]), whole
    if data[1] != 3:
        return None
    k = size // 5
    if not k:
        return None
    whole = k * 5
    if k == 1:  # the most common chunk from Mosquitto, which writes its PUBACKs one by one
        return (b"\x40\x02" + data[2:4], 5) if data[4] < 0x80 else None
    if k <= SHORT_RUN:  # a few: a short loop costs less than the strided checks
        keys = bytearray()
        for p in range(0, whole, 5):
            if data[p] != 0x40 or data[p + 1] != 3 or data[p + 4] >= 0x80:
                return None
            keys += data[p : p + 4]
        keys[1::4] = b"\x02" * k
        return keys, whole
    if (
        data[0:whole:5].count(0x40) != k
        or data[1:whole:5].count(3) != k
        or max(data[4:whole:5]) >= 0x80
    ):
        return None
    keys = bytearray(_ACK_KEY) * k
    keys[2::4] = data[2:whole:5]
    keys[3::4] = data[3:whole:5]
    return keys, whole


def count_pubacks(data: bytes, others: list[tuple[int, bytes]]) -> tuple[int, int, int]:
    """Count the PUBACKs in ``data``: (acks, of which failed (reason code >= 0x80), position of
    the first byte not consumed). A run of successful ones is counted at C speed (see
    :func:`puback_keys`); anything else is walked frame by frame, other packets going to
    ``others`` as (first byte, body)."""
    acks = failed = pos = 0
    found = puback_keys(data)
    if found is not None:
        keys, whole = found
        k = len(keys) >> 2
        if keys[0::4].count(0x40) == k and keys[1::4].count(2) == k:
            acks, pos = k, whole
    end = len(data)
    while (frame := next_frame(data, pos)) is not None:
        first, body, stop = frame
        if first >> 4 == PUBACK:
            acks += 1
            if stop - body > 2 and data[body + 2] >= 0x80:
                failed += 1
        else:
            others.append((first, data[body:stop]))
        pos = stop
    return acks, failed, min(pos, end)

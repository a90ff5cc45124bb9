"""The machine's floor for scenario 5: a forwarder that knows just enough MQTT to be measured.

    python -m benchmarks.floor PORT

It is not a broker. It answers CONNECT with a CONNACK, SUBSCRIBE with a SUBACK granting QoS 0,
PINGREQ with a PINGRESP, closes on DISCONNECT, and copies every PUBLISH as received to every
connection that has subscribed to anything: no topic matching, no session, no checks. It runs on
plain non-blocking sockets in one loop with nothing in between: after any traffic it spins (a
``recv`` on each socket per pass) for :data:`SPIN_NS`, twice the gap between scenario 5's
messages, so it never sleeps during a run; once traffic stops it sleeps in ``select`` (so it is
idle between runs, as the runner requires of every broker on the core).

So its latency is what this machine and the probe charge a Python process that reads a packet
and writes it again, on a core that never sleeps. Any broker in Python does at least that per
message, so the floor's latency is about the least one can show here, and the ratio of a peer's
latency to the floor's about the best ratio to that peer one could show in the same run. The
runner starts it beside the brokers when scenario 5 is selected (benchmarks/README.md).
"""

from __future__ import annotations

import select
import socket
import sys
import time

from . import wire

SPIN_NS = 2_000_000
SLEEP_S = 1.0

CONNECT, SUBSCRIBE, PUBLISH, PINGREQ, DISCONNECT = 1, 8, 3, 12, 14
CONNACK_5 = b"\x20\x03\x00\x00\x00"  # accepted, no session, no properties
CONNACK_311 = b"\x20\x02\x00\x00"


class Peer:
    __slots__ = ("sock", "buf", "out", "version", "subscribed")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.out = b""  # what the socket did not take yet
        self.version = 5
        self.subscribed = False


def frames(buf: bytes) -> tuple[list[tuple[int, int, int]], int]:
    """The whole packets at the start of ``buf``: (start, body start, end) each, and where the
    incomplete rest starts. ValueError on a malformed Remaining Length."""
    found = []
    pos = 0
    while (frame := wire.next_frame(buf, pos)) is not None:
        _, body, end = frame
        found.append((pos, body, end))
        pos = end
    return found, pos


def suback(body: bytes, version: int) -> bytes:
    """A SUBACK granting QoS 0 to each filter of the SUBSCRIBE ``body``."""
    pos = 2
    if version == wire.MQTT_5:  # skip the properties (their length is a Variable Byte Integer)
        props = wire.read_remaining_length(body, pos - 1, len(body))
        if props is None:
            raise ValueError("SUBSCRIBE cut short")
        pos = props[1] + props[0]
    count = 0
    while pos + 2 <= len(body):
        pos += 2 + int.from_bytes(body[pos : pos + 2], "big") + 1
        count += 1
    reply = body[:2] + (b"\x00" if version == wire.MQTT_5 else b"") + b"\x00" * count
    return bytes([0x90, len(reply)]) + reply  # fewer than 126 filters: one length byte


class Floor:
    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.peers: list[Peer] = []

    def serve(self) -> None:
        listener = self.listener
        peers = self.peers
        clock = time.monotonic_ns
        spin_until = 0
        passes = 0
        while True:
            passes += 1
            if clock() >= spin_until:
                select.select([listener, *(p.sock for p in peers)], [], [], SLEEP_S)
                passes = 0
            if not passes & 255:  # while it spins, it looks for new connections every 256 passes
                try:
                    sock, _ = listener.accept()
                except BlockingIOError:
                    pass
                else:
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    peers.append(Peer(sock))
                    spin_until = clock() + SPIN_NS
            for peer in peers:
                if peer.out:
                    self.send(peer, b"")
                try:
                    data = peer.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                spin_until = clock() + SPIN_NS
                if not data:
                    self.close(peer)
                    break  # the list changed
                if not self.received(peer, data):
                    break

    def received(self, peer: Peer, data: bytes) -> bool:
        """Act on the whole packets in ``data`` (and what came before); False once ``peer`` is
        closed."""
        buf = peer.buf + data if peer.buf else data
        try:
            return self.act(peer, buf)
        except (ValueError, IndexError):  # not the MQTT the probe sends
            self.close(peer)
            return False

    def act(self, peer: Peer, buf: bytes) -> bool:
        found, rest = frames(buf)
        for start, body, end in found:
            kind = buf[start] >> 4
            if kind == PUBLISH:
                packet = buf[start:end]
                for other in self.peers:
                    if other.subscribed:
                        self.send(other, packet)
            elif kind == CONNECT:
                peer.version = buf[body + 6]
                self.send(peer, CONNACK_5 if peer.version == 5 else CONNACK_311)
            elif kind == SUBSCRIBE:
                peer.subscribed = True
                self.send(peer, suback(buf[body:end], peer.version))
            elif kind == PINGREQ:
                self.send(peer, b"\xd0\x00")
            elif kind == DISCONNECT:
                self.close(peer)
                return False
        peer.buf = buf[rest:]
        return True

    def send(self, peer: Peer, data: bytes) -> None:
        out = peer.out + data if peer.out else data
        try:
            sent = peer.sock.send(out)
        except BlockingIOError:
            sent = 0
        except OSError:
            sent = len(out)  # gone: its recv will say so
        peer.out = out[sent:]

    def close(self, peer: Peer) -> None:
        peer.sock.close()
        self.peers.remove(peer)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(argv[0])))
    listener.listen(128)
    listener.setblocking(False)
    Floor(listener).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

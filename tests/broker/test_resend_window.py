"""Resending on a resumed session: original order, each packet once, never past the client's
Receive Maximum, even when some messages no longer fit its Maximum Packet Size; and
acknowledgements held for the store even when the same read closes the connection."""

from __future__ import annotations

from support.harness import GatedStore, Harness, pk, split_packets


def test_ack_waits_for_the_commit_when_the_same_read_disconnects() -> None:
    """A PUBLISH that changed the store, then DISCONNECT (or an error) in the same read: the
    PUBACK still waits for the commit; then it goes out and the connection closes."""
    for tail in (pk.Disconnect(0), pk.Connect(client_id="again")):
        h = Harness()
        store = GatedStore()
        h.broker.store = store
        h.broker.router.store = store
        h.broker.router.retained._store = store
        client = h.connect("p")
        client.send(pk.Publish("r", b"x", 1, True, False, 1, {}), tail)
        h.broker.flush()
        assert split_packets(client.link.data[client._read :], 5) == []
        store.commit()
        h.broker.flush()
        got = split_packets(client.link.data[client._read :], 5)
        assert isinstance(got[0], pk.Puback) and got[0].packet_id == 1
        assert client.link.closed

"""A session as Redis keeps it (handover.from_hash): a node adopting it gives new packet ids
past those the node gone may have used without writing them (its client holds the QoS 2 ones
it did not see released, and would take a new message under one of them for a copy)."""

from __future__ import annotations

from mqttbroker.cluster.handover import PACKET_ID_MARGIN, from_hash


def test_new_packet_ids_start_past_the_last_written_next_one() -> None:
    fields = {b"s": b'["u", 3600]', b"p": b"500"}
    assert from_hash("dev", fields)["next_packet_id"] == 500 + PACKET_ID_MARGIN
    wrapped = from_hash("dev", {**fields, b"p": b"65000"})["next_packet_id"]
    assert wrapped == (65000 + PACKET_ID_MARGIN - 1) % 65535 + 1
    assert 1 <= wrapped < 65000


def test_a_hash_without_it_starts_after_its_messages() -> None:
    assert from_hash("dev", {b"s": b'["u", 3600]'})["next_packet_id"] == 1

"""A session as Redis keeps it (handover.from_hash): a node adopting it gives new packet ids
past those the node gone may have used without writing them (its client holds the QoS 2 ones
it did not see released, and would take a new message under one of them for a copy); and the
age of a queued message handed over."""

from __future__ import annotations

import json

from support.harness import Harness, queued_while_away

from mqttbroker.cluster.handover import PACKET_ID_MARGIN, from_hash, restore, serialise
from mqttbroker.ops.alerts import oldest_queued_age


def test_new_packet_ids_start_past_the_last_written_next_one() -> None:
    fields = {b"s": b'["u", 3600]', b"p": b"500"}
    assert from_hash("dev", fields)["next_packet_id"] == 500 + PACKET_ID_MARGIN
    wrapped = from_hash("dev", {**fields, b"p": b"65000"})["next_packet_id"]
    assert wrapped == (65000 + PACKET_ID_MARGIN - 1) % 65535 + 1
    assert 1 <= wrapped < 65000


def test_a_hash_without_it_starts_after_its_messages() -> None:
    assert from_hash("dev", {b"s": b'["u", 3600]'})["next_packet_id"] == 1


def test_a_queued_message_keeps_its_age_across_a_hand_over() -> None:
    """The nodes' clocks differ: the age goes with the message, not its time. A session
    handed over after its messages waited 30 s shows them 30 s old on the new node (the
    stuck-session alarm and the API read it), and a session built from Redis counts from
    then, as one put back from the store after a restart does."""
    old, new = Harness(), Harness()
    queued_while_away(old)
    old.clock.advance(30.0)
    session = old.broker.sessions["s"]
    assert [round(oldest_queued_age(session, old.clock()), 3)] == [30.0]
    new.clock.advance(5_000.0)
    moved = restore(new.broker, "s", serialise(session, old.clock()))
    assert [d.message.payload for d in moved.queue] == [b"fresh"]  # (the other expired)
    assert round(oldest_queued_age(moved, new.clock()), 3) == 30.0
    state = json.loads(serialise(session, old.clock()))
    for entry in state["deliveries"]:
        del entry[7:]  # (as a session read from Redis has them: no age)
    rebuilt = restore(new.broker, "s", state)
    assert round(oldest_queued_age(rebuilt, new.clock()), 3) == 0.0

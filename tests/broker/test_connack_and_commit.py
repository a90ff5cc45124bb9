"""A CONNACK accepted after an off-loop password check waits for the store's commit only when
the CONNECT changed the store (a persistent session), as every acknowledgement does: a clean
session's CONNACK goes out at once."""

from __future__ import annotations

from typing import Any

import pytest
from support.harness import (
    GatedStore,
    Harness,
    Offload,
    Prop,
    ToyAuthenticator,
    pk,
    split_packets,
)

from mqttbroker.broker.core import Broker


@pytest.mark.parametrize(("expiry", "waits"), [(0, False), (60, True)])
def test_connack_after_password_check(make_harness: Any, expiry: int, waits: bool) -> None:
    h: Harness = make_harness()
    store = GatedStore()
    h.broker = Broker(h.options, clock=h.clock, store=store)
    h.broker.authenticator = ToyAuthenticator()
    offload = h.broker.offload = Offload()
    client = h.client()
    props = {Prop.SESSION_EXPIRY_INTERVAL: expiry} if expiry else {}
    client.send(pk.Connect(client_id="c", username="alice", password=b"secret", properties=props))
    offload.run_all()
    h.broker.flush()
    sent = split_packets(client.link.data, 5)
    if waits:
        assert sent == []
        store.commit()
        h.broker.flush()
        sent = split_packets(client.link.data, 5)
    assert [type(p) for p in sent] == [pk.Connack]

"""broker/policy.py: ListenerPolicy: a listener's rule for anonymous clients, applied at CONNECT."""

from __future__ import annotations

import pytest
from support.harness import Harness, pk

from mqttbroker.broker.policy import ListenerPolicy


@pytest.mark.parametrize(("allowed", "code"), [(False, 0x87), (True, 0)])
def test_anonymous_access_per_listener(ha: Harness, allowed: bool, code: int) -> None:
    """A listener's own anonymous rule decides for clients without a user name (the toy
    authenticator alone would refuse them with 0x87); named users are still checked."""
    policy = ListenerPolicy(allow_anonymous=allowed)
    anonymous = ha.client(policy=policy)
    anonymous.send(pk.Connect(client_id="anon"))
    assert anonymous.one(pk.Connack).reason_code == code
    named = ha.client(policy=policy)
    named.send(pk.Connect(client_id="named", username="alice", password=b"wrong"))
    assert named.one(pk.Connack).reason_code == 0x86

"""A read right removed from the ACL also stops what was persisted under it: the subscriptions
and the queued messages of sessions that are offline, when the broker restarts on the changed
file and when it reloads it on SIGHUP."""

from __future__ import annotations

from typing import Any

from support.clients import MQTT_5, unique
from support.secure_broker import ACL, SecureBroker, offline_alice, paho_client

REVOKED = ACL.replace("topic read data/#\n", "")


def offline_reader(server: Any) -> str:
    """alice's persistent session, subscribed to data/# and alice/#, offline, with data/1
    queued for it."""
    return offline_alice(
        server, ["data/#", "alice/#"], "data/1", b"queued before the change", MQTT_5
    )


def assert_nothing_from_data(server: Any, client_id: str) -> None:
    """alice resumes her session and gets neither the queued data/1 nor a new data/2; alice/#
    still flows."""
    alice = paho_client(server, "alice", client_id)
    admin = paho_client(server, "admin", unique("admin"), clean=True, expiry=0)
    try:
        alice.connect()
        assert alice.connack is not None and alice.connack[1], "the session is gone"
        admin.connect()
        admin.publish("data/2", b"after the change", 1)
        admin.publish("alice/end", b"end", 1)
        got = alice.wait_payload(b"end")
        assert [(m.topic, m.payload) for m in got] == [("alice/end", b"end")]
    finally:
        alice.close()
        admin.close()


def test_revoked_right_is_applied_on_restart(secure: SecureBroker) -> None:
    server = secure.start(memory=False)
    client_id = offline_reader(server)
    server.stop()
    secure.acl.write_text(REVOKED)
    server = secure.start(memory=False)
    log = server.log_text()
    assert f"session {client_id}: subscription 'data/#' removed: no longer authorized" in log
    assert f"session {client_id}: 1 queued messages dropped: no longer authorized" in log
    assert_nothing_from_data(server, client_id)
    # The removal was stored: after another restart, nothing to remove any more.
    server.stop()
    server = secure.start(memory=False)
    assert "no longer authorized" not in server.log_text()
    assert_nothing_from_data(server, client_id)


def test_revoked_right_is_applied_to_offline_sessions_on_sighup(secure: SecureBroker) -> None:
    server = secure.start()
    client_id = offline_reader(server)
    secure.acl.write_text(REVOKED)
    secure.sighup(
        f"session {client_id}: subscription 'data/#' removed",
        f"session {client_id}: 1 queued messages dropped",
    )
    assert_nothing_from_data(server, client_id)

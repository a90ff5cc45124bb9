"""A session belongs to the user that created it: another user reusing its client id is refused
(or, if so configured, gets a fresh session), may not kick the owner's live connection, and may
not take it after a restart either; client ids can be bound to user names."""

from __future__ import annotations

from typing import Any

import pytest
from support.clients import MQTT_5, MQTT_311, unique
from support.secure_broker import SecureBroker, assert_logged, connack, offline_alice, paho_client

NOT_AUTHORIZED = {MQTT_5: 0x87, MQTT_311: 0x05}
ID_NOT_VALID = {MQTT_5: 0x85, MQTT_311: 0x02}


def alice_session_with_a_queued_message(server: Any, version: int) -> str:
    """alice's persistent session, subscribed to alice/# and offline, with one message queued."""
    return offline_alice(server, ["alice/#"], "alice/inbox", b"for alice only", version)


def assert_alice_resumes(server: Any, client_id: str, version: int) -> None:
    alice = paho_client(server, "alice", client_id, version)
    try:
        alice.connect()
        assert alice.connack is not None and alice.connack[1], "alice's session is gone"
        got = alice.wait_messages(1)
        assert [(m.topic, m.payload) for m in got] == [("alice/inbox", b"for alice only")]
    finally:
        alice.close()


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311])
def test_another_user_cannot_resume_a_session(secure: SecureBroker, version: int) -> None:
    server = secure.start()
    client_id = alice_session_with_a_queued_message(server, version)
    mark = server.log_mark()
    present, code = connack(server, client_id, version, "bob")
    assert (present, code) == (False, NOT_AUTHORIZED[version])
    assert_logged(server, "client id taken by a session of another user", mark)
    # Neither did anonymous; and bob's attempts left alice's session as it was.
    assert connack(server, client_id, version, None) == (False, NOT_AUTHORIZED[version])
    assert_alice_resumes(server, client_id, version)


def test_another_user_cannot_take_over_a_live_connection(secure: SecureBroker) -> None:
    server = secure.start()
    client_id = unique("alice")
    alice = paho_client(server, "alice", client_id)
    try:
        alice.connect()
        assert alice.subscribe("alice/#", 1) == [1]
        assert connack(server, client_id, MQTT_5, "bob") == (False, 0x87)
        alice.publish("alice/still-here", b"yes", 1)
        assert [m.payload for m in alice.wait_messages(1)] == [b"yes"]
        assert alice.disconnects == []
        # The owner itself still takes over its own session, as always.
        assert connack(server, client_id, MQTT_5, "alice") == (True, 0)
        assert alice.wait_disconnected().reason_code == 0x8E
    finally:
        alice.close()


def test_anonymous_sessions_resume_anonymously(secure: SecureBroker) -> None:
    server = secure.start()
    client_id = unique("anon")
    assert connack(server, client_id, MQTT_5, None) == (False, 0)
    assert connack(server, client_id, MQTT_5, None) == (True, 0)
    assert connack(server, client_id, MQTT_5, "alice") == (False, 0x87)


def test_new_policy_gives_a_fresh_session_and_discards_the_old(secure: SecureBroker) -> None:
    server = secure.start('session_owner_mismatch = "new"')
    client_id = alice_session_with_a_queued_message(server, MQTT_5)
    mark = server.log_mark()
    bob = paho_client(server, "bob", client_id)
    try:
        bob.connect()
        assert bob.connack is not None and not bob.connack[1], "bob got Session Present"
        bob.publish("bob/sync", b"sync", 1)
        bob.sync()
        assert bob.received() == [], "bob received alice's messages"
    finally:
        bob.close()
    assert_logged(
        server,
        f"session {client_id} of user 'alice' discarded: its client id was taken by user 'bob'",
        mark,
    )


def test_takeover_by_another_user_when_allowed(secure: SecureBroker) -> None:
    server = secure.start("allow_takeover_by_other_user = true")
    client_id = unique("alice")
    alice = paho_client(server, "alice", client_id)
    try:
        alice.connect()
        assert alice.subscribe("alice/#", 1) == [1]
        assert connack(server, client_id, MQTT_5, "bob") == (False, 0)  # a fresh session
        assert alice.wait_disconnected().reason_code == 0x8E
    finally:
        alice.close()


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311])
def test_client_id_pattern_binds_ids_to_users(secure: SecureBroker, version: int) -> None:
    server = secure.start('client_id_pattern = "%u-*"')
    assert connack(server, "alice-phone", version, "alice") == (False, 0)
    assert connack(server, "alice-", version, "alice", clean=True) == (False, 0)
    mark = server.log_mark()
    assert connack(server, "bob-phone", version, "alice") == (False, ID_NOT_VALID[version])
    assert_logged(server, "client id does not match client_id_pattern for user 'alice'", mark)
    assert connack(server, "alice.phone", version, "alice")[1] == ID_NOT_VALID[version]
    assert connack(server, "xalice-phone", version, "alice")[1] == ID_NOT_VALID[version]
    # Without a user name a client's own id matches nothing; one the broker assigns is fine.
    assert connack(server, "alice-phone", version, None)[1] == ID_NOT_VALID[version]
    if version == MQTT_5:
        assert connack(server, "", version, None, clean=True, expiry=0) == (False, 0)


def test_owner_survives_a_restart(secure: SecureBroker) -> None:
    server = secure.start(memory=False)
    client_id = alice_session_with_a_queued_message(server, MQTT_5)
    server.stop()
    server = secure.start(memory=False)
    assert connack(server, client_id, MQTT_5, "bob") == (False, 0x87)
    assert connack(server, client_id, MQTT_5, None) == (False, 0x87)
    assert_alice_resumes(server, client_id, MQTT_5)

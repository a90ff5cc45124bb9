"""The dynamic security's model without a broker: Mosquitto's dynamic-security.json (a file
written by Mosquitto's own ``mosquitto_ctrl dynsec init`` is read and its admin password
works), the order ACLs are tried in, and the errors of malformed commands, worded as Mosquitto
words them (observed against Mosquitto 2.0.11 with its plugin)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.external_tools import program

from mqttbroker.broker.auth import LoginRequest
from mqttbroker.security.authenticator import FileAuthenticator, KdfBudget, LoginFailures
from mqttbroker.security.dynsec import (
    COMMAND_TOPIC,
    Dynsec,
    DynsecAuthenticator,
    DynsecError,
    PasswordHash,
    load_state,
    save_state,
)
from mqttbroker.security.passwords import MAX_ITERATIONS


def run(state: Dynsec, *commands: dict[str, Any]) -> list[dict[str, Any]]:
    payload, _ = state.handle(json.dumps({"commands": list(commands)}).encode())
    responses: list[dict[str, Any]] = json.loads(payload)["responses"]
    return responses


def ok(state: Dynsec, **command: Any) -> dict[str, Any]:
    (response,) = run(state, command)
    assert "error" not in response, response
    return response


def mosquitto_init(tmp_path: Path) -> Path:
    path = tmp_path / "dynamic-security.json"
    subprocess.run(
        [program("mosquitto_ctrl"), "dynsec", "init", str(path), "admin", "adminpw"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return path


@pytest.mark.needs_mosquitto
def test_mosquitto_init_file_is_accepted_and_its_admin_password_works(tmp_path: Path) -> None:
    state = load_state(mosquitto_init(tmp_path))
    assert state.login("any-id", "admin", b"adminpw") == 0
    assert state.login("any-id", "admin", b"wrong") == 0x86
    assert state.login("any-id", "nobody", b"adminpw") is None  # not ours to answer
    # its admin role: commands and answers, nothing else
    assert state.can_publish("admin", COMMAND_TOPIC)
    assert state.can_subscribe("admin", COMMAND_TOPIC + "/response")
    assert not state.can_publish("admin", "some/topic")
    assert not state.can_publish("someone-else", COMMAND_TOPIC)
    assert not state.can_publish(None, COMMAND_TOPIC)


def test_export_import_round_trip(tmp_path: Path) -> None:
    state = load_state(mosquitto_init(tmp_path), iterations=1000)
    ok(state, command="createRole", rolename="r", textname="R")
    ok(state, command="addRoleACL", rolename="r", acltype="publishClientSend", topic="a/#",
       allow=True, priority=4)  # fmt: skip
    ok(state, command="createClient", username="u", password="pw", clientid="c", textname="T")
    ok(state, command="createGroup", groupname="g")
    ok(state, command="addGroupClient", groupname="g", username="u", priority=2)
    ok(state, command="addGroupRole", groupname="g", rolename="r", priority=1)
    ok(state, command="setAnonymousGroup", groupname="g")
    ok(state, command="disableClient", username="u")
    ok(state, command="setDefaultACLAccess", acls=[{"acltype": "subscribe", "access": "allow"}])
    out = tmp_path / "exported.json"
    save_state(out, state)
    again = load_state(out)
    assert again.to_json() == state.to_json()
    assert again.login("c", "admin", b"adminpw") == 0
    assert again.clients["u"].disabled and again.clients["u"].password is not None
    assert again.clients["u"].password.verify(b"pw")
    assert again.anonymous_group == "g" and again.default_access["subscribe"]
    assert list(out.parent.glob("*.tmp")) == []  # the temporary file was renamed, not left


def test_a_malformed_state_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"clients": [{"textName": "no user name"}]}')
    with pytest.raises(DynsecError):
        load_state(path)


def test_acls_are_tried_by_priority_and_the_first_match_decides() -> None:
    state = Dynsec(iterations=1000)
    ok(state, command="createRole", rolename="low")
    ok(state, command="createRole", rolename="high")
    ok(state, command="addRoleACL", rolename="low", acltype="publishClientSend",
       topic="a/#", allow=True)  # fmt: skip
    ok(state, command="addRoleACL", rolename="high", acltype="publishClientSend",
       topic="a/secret", allow=False)  # fmt: skip
    ok(state, command="createClient", username="u", password="pw")
    ok(state, command="addClientRole", username="u", rolename="low", priority=1)
    ok(state, command="addClientRole", username="u", rolename="high", priority=5)
    assert state.can_publish("u", "a/b")
    assert not state.can_publish("u", "a/secret")
    assert not state.can_publish("u", "b")  # default: publishClientSend deny
    # within a role too: a higher-priority allow beats a lower deny
    ok(state, command="addRoleACL", rolename="high", acltype="publishClientSend",
       topic="a/secret/#", allow=True, priority=9)  # fmt: skip
    assert state.can_publish("u", "a/secret/x")
    # subscribe: literal ACLs compare the filter as written, patterns cover it
    ok(state, command="addRoleACL", rolename="low", acltype="subscribeLiteral",
       topic="s/+", allow=True)  # fmt: skip
    ok(state, command="addRoleACL", rolename="low", acltype="subscribePattern",
       topic="p/#", allow=True)  # fmt: skip
    assert state.can_subscribe("u", "s/+")
    assert not state.can_subscribe("u", "s/x")
    assert state.can_subscribe("u", "p/x/+")
    assert not state.can_subscribe("u", "q")
    # receive: default allow, a deny withholds and marks subscriptions that reach it
    assert state.can_receive("u", "x/y") and not state.needs_read_check("u", "x/#")
    ok(state, command="addRoleACL", rolename="low", acltype="publishClientReceive",
       topic="x/hidden", allow=False)  # fmt: skip
    assert not state.can_receive("u", "x/hidden") and state.needs_read_check("u", "x/#")
    assert not state.needs_read_check("u", "y/#")
    # nobody receives the commands themselves (they carry passwords)
    assert not state.can_receive("u", COMMAND_TOPIC)


def test_groups_and_anonymous_group() -> None:
    state = Dynsec(iterations=1000)
    ok(state, command="createRole", rolename="r")
    ok(state, command="addRoleACL", rolename="r", acltype="publishClientSend", topic="g/#",
       allow=True)  # fmt: skip
    ok(state, command="createGroup", groupname="g", roles=[{"rolename": "r"}])
    ok(state, command="createClient", username="u", password="pw", groups=[{"groupname": "g"}])
    assert state.can_publish("u", "g/1")
    assert not state.can_publish(None, "g/1")
    ok(state, command="setAnonymousGroup", groupname="g")
    assert state.can_publish(None, "g/1")
    (refused,) = run(state, {"command": "deleteGroup", "groupname": "g"})
    assert refused["error"] == "Deleting the anonymous group is forbidden"
    ok(state, command="removeGroupClient", groupname="g", username="u")
    assert not state.can_publish("u", "g/1")


def test_logins() -> None:
    state = Dynsec(iterations=1000)
    ok(state, command="createClient", username="u", password="pw", clientid="only")
    assert state.login("only", "u", b"pw") == 0
    assert state.login("other", "u", b"pw") == 0x87  # bound to its client id
    assert state.login("only", "u", None) == 0x86
    # the password first: only its owner learns of the client id or the disabled client
    assert state.login("other", "u", b"wrong") == 0x86
    ok(state, command="disableClient", username="u")
    assert state.login("only", "u", b"pw") == 0x87
    assert state.login("only", "u", b"wrong") == 0x86
    ok(state, command="enableClient", username="u")
    ok(state, command="setClientPassword", username="u", password="new")
    assert state.login("only", "u", b"new") == 0 and state.login("only", "u", b"pw") == 0x86
    ok(state, command="createClient", username="nopw")
    assert state.login("x", "nopw", b"") == 0x86


def test_logins_have_the_password_files_limits() -> None:
    """Failed dynsec logins count per address and user as the password file's do, and their
    hashing is taken from the same budget."""
    state = Dynsec(iterations=1000)
    ok(state, command="createClient", username="u", password="pw")
    ok(state, command="createClient", username="off", password="pw")
    ok(state, command="disableClient", username="off")
    frozen = KdfBudget(clock=lambda: 0.0)  # failures do not drain away meanwhile
    files = FileAuthenticator(None, False, frozen, failures=LoginFailures(5, 300.0))
    logins = DynsecAuthenticator(state, files)
    codes = [
        logins.check_password(LoginRequest("c", "u", f"guess{n}".encode(), address="192.0.2.1"))
        for n in range(8)
    ]
    assert codes == [0x86] * 5 + [0x9F] * 3  # the address is locked out, without a check
    assert logins.check_password(LoginRequest("c", "u", b"pw", address="192.0.2.1")) == 0x9F
    # the owner, elsewhere
    assert logins.check_password(LoginRequest("c", "u", b"pw", address="192.0.2.2")) == 0
    # not ours
    assert logins.check_password(LoginRequest("c", "nobody", b"pw", address="192.0.2.2")) is None
    # a disabled client's wrong passwords are failed logins like any other
    files = FileAuthenticator(None, False, KdfBudget(clock=lambda: 0.0), failures=LoginFailures(2))
    other = DynsecAuthenticator(state, files)
    codes = [
        other.check_password(LoginRequest("c", "off", b"guess", address="192.0.2.3"))
        for _ in range(3)
    ]
    assert codes == [0x86, 0x86, 0x9F]
    assert other.check_password(LoginRequest("c", "off", b"pw", address="192.0.2.4")) == 0x87
    # past the hashing budget: Server Busy, the password unchecked
    spent = FileAuthenticator(None, False, budget=KdfBudget(rate=0.0, burst=0.0))
    busy = DynsecAuthenticator(state, spent)
    assert busy.check_password(LoginRequest("c", "u", b"pw", address="192.0.2.5")) == 0x89
    assert spent.budget.refused == 1


def test_a_state_file_with_a_huge_iteration_count_is_refused(tmp_path: Path) -> None:
    state = Dynsec(iterations=1000)
    ok(state, command="createClient", username="slow", password="pw")
    data = state.to_json()
    data["clients"][0]["iterations"] = MAX_ITERATIONS + 1
    path = tmp_path / "dynamic-security.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DynsecError) as raised:
        load_state(path)
    message = str(raised.value)
    assert str(path) in message and "'slow'" in message and str(MAX_ITERATIONS) in message
    data["clients"][0]["iterations"] = MAX_ITERATIONS
    path.write_text(json.dumps(data))
    assert load_state(path).clients["slow"].password is not None


def test_save_state_is_the_password_files_atomic_write(tmp_path: Path) -> None:
    """A new file is its owner's only; an existing one keeps its mode (an operator's choice)."""
    state = Dynsec(iterations=1000)
    path = tmp_path / "dynamic-security.json"
    save_state(path, state)
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o640)
    ok(state, command="createRole", rolename="r")
    save_state(path, state)
    assert path.stat().st_mode & 0o777 == 0o640
    assert "r" in load_state(path).roles
    assert [p.name for p in tmp_path.iterdir()] == ["dynamic-security.json"]  # no temporaries


def test_password_hash_is_mosquittos() -> None:
    made = PasswordHash.make("secret", 101)
    import hashlib

    assert made.hash == hashlib.pbkdf2_hmac("sha512", b"secret", made.salt, 101)


# Payload -> response, as Mosquitto 2.0.11's plugin answered them.
MALFORMED = [
    (b"not json", [{"command": "Unknown command", "error": "Payload not valid JSON"}]),
    (b"{}", [{"command": "Unknown command", "error": "Invalid/missing commands"}]),
    (b'{"commands":5}', [{"command": "Unknown command", "error": "Invalid/missing commands"}]),
    (b'{"commands":[]}', []),
    (b'{"commands":[5]}', [{"command": "Unknown command", "error": "Command not an object"}]),
    (b'{"commands":[{}]}', [{"command": "Unknown command", "error": "Missing command"}]),
    (b'{"commands":[{"command":5}]}', [{"command": "Unknown command", "error": "Missing command"}]),
    (b'{"commands":[{"command":"nosuch"}]}', [{"command": "nosuch", "error": "Unknown command"}]),
    (
        b'{"commands":[{"command":"createClient"}]}',
        [{"command": "createClient", "error": "Invalid/missing username"}],
    ),
    (
        b'{"commands":[{"command":"createClient","username":"u","roles":[{"rolename":"x"}],'
        b'"correlationData":"abc"}]}',
        [{"command": "createClient", "error": "Role not found", "correlationData": "abc"}],
    ),
    (
        b'{"commands":[{"command":"addRoleACL","rolename":"r","acltype":"bogus","topic":"a"}]}',
        [{"command": "addRoleACL", "error": "Unknown acltype"}],
    ),
    (
        b'{"commands":[{"command":"addRoleACL","rolename":"r","acltype":"publishClientSend",'
        b'"topic":"a/#/b"}]}',
        [{"command": "addRoleACL", "error": "Invalid ACL topic"}],
    ),
    (
        b'{"commands":[{"command":"addRoleACL","rolename":"r","acltype":"publishClientSend"}]}',
        [{"command": "addRoleACL", "error": "Invalid/missing topic"}],
    ),
    (
        b'{"commands":[{"command":"removeRoleACL","rolename":"r","acltype":"publishClientSend",'
        b'"topic":"nope"}]}',
        [{"command": "removeRoleACL", "error": "ACL not found"}],
    ),
    (
        b'{"commands":[{"command":"setDefaultACLAccess"}]}',
        [{"command": "setDefaultACLAccess", "error": "Missing/invalid actions array"}],
    ),
    (
        b'{"commands":[{"command":"getClient","username":"nobody","correlationData":"x"},'
        b'{"command":"getRole","rolename":"nobody"}]}',
        [
            {"command": "getClient", "error": "Client not found", "correlationData": "x"},
            {"command": "getRole", "error": "Role not found"},
        ],
    ),
]


@pytest.mark.parametrize(("payload", "expected"), MALFORMED)
def test_malformed_commands_get_mosquittos_errors(
    payload: bytes, expected: list[dict[str, Any]]
) -> None:
    state = Dynsec(iterations=1000)
    ok(state, command="createRole", rolename="r")
    before = state.to_json()
    answer, _ = state.handle(payload)
    assert json.loads(answer) == {"responses": expected}
    assert state.to_json() == before

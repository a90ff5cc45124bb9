"""The password file: our SCRAM-verifier format, Mosquitto's formats, malformed files, and the
authenticator's password checks (anonymous access, reason codes, the remembered-login cache, the
key-derivation budget)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
from pathlib import Path

import pytest
from support.harness import FakeClock
from support.password_files import ITERATIONS, mosquitto_pbkdf2_line, mosquitto_sha512_line

from mqttbroker.broker.auth import LoginRequest
from mqttbroker.config import ListenerConfig
from mqttbroker.security import SecurityFileError, anonymous_default, is_loopback, local_only
from mqttbroker.security.authenticator import FileAuthenticator, KdfBudget
from mqttbroker.security.passwords import (
    PasswordFile,
    ScramCredential,
    make_entry_line,
    write_atomically,
)
from mqttbroker.security.saslprep import normalize_password, saslprep


def load(text: str) -> PasswordFile:
    return PasswordFile.parse(text.encode(), "pw.txt")


# -- our format -------------------------------------------------------------------------------


def test_round_trip_and_wrong_password() -> None:
    line = make_entry_line("alice", b"correct horse", ITERATIONS)
    entry = load(line).get("alice")
    assert entry is not None
    assert entry.verify(b"correct horse")
    assert not entry.verify(b"correct hors")
    assert not entry.verify(b"correct horse ")
    assert not entry.verify(b"")
    assert {c.mechanism for c in entry.scram} == {"SCRAM-SHA-256", "SCRAM-SHA-512"}


def test_entry_holds_rfc_5802_verifiers_not_the_password() -> None:
    """StoredKey = H(HMAC(SaltedPassword, "Client Key")), ServerKey = HMAC(SaltedPassword,
    "Server Key"), SaltedPassword = PBKDF2(password, salt, i): recomputed here from the RFC."""
    line = make_entry_line("alice", b"pencil", ITERATIONS)
    assert "pencil" not in line
    entry = load(line).get("alice")
    assert entry is not None
    for cred in entry.scram:
        h = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[cred.mechanism]
        assert cred.iterations == ITERATIONS
        assert len(cred.salt) >= 16
        salted = hashlib.pbkdf2_hmac(h, b"pencil", cred.salt, ITERATIONS)
        assert cred.stored_key == hashlib.new(h, hmac.digest(salted, b"Client Key", h)).digest()
        assert cred.server_key == hmac.digest(salted, b"Server Key", h)


def test_salts_differ_between_entries() -> None:
    one = load(make_entry_line("a", b"same", ITERATIONS)).get("a")
    two = load(make_entry_line("a", b"same", ITERATIONS)).get("a")
    assert one is not None and two is not None
    assert one.scram[0].salt != two.scram[0].salt
    assert one.scram[0].stored_key != two.scram[0].stored_key


def test_default_iterations_are_high() -> None:
    line = make_entry_line("slow", b"pw")
    entry = load(line).get("slow")
    assert entry is not None
    counts = {c.mechanism: c.iterations for c in entry.scram}
    assert counts == {"SCRAM-SHA-512": 210_000, "SCRAM-SHA-256": 600_000}


def test_saslprep_normalizes_passwords() -> None:
    """RFC 4013: non-ASCII spaces map to SPACE, soft hyphens vanish, NFKC applies; control
    characters are prohibited (the raw bytes are then used, the same way on both sides)."""
    assert saslprep("I\u00adX") == "IX"
    assert saslprep("user\u00a0name") == "user name"
    assert saslprep("\u2168") == "IX"
    with pytest.raises(ValueError):
        saslprep("a\u0007b")
    assert normalize_password("I\u00adX".encode()) == b"IX"
    assert normalize_password(b"\xff\xfe") == b"\xff\xfe"
    entry = load(make_entry_line("n", "p\u00e4ss\u00a0word".encode(), ITERATIONS)).get("n")
    assert entry is not None
    assert entry.verify(b"p\xc3\xa4ss word")  # the same password, prepared


# -- Mosquitto's format -----------------------------------------------------------------------


def test_mosquitto_pbkdf2_and_sha512_entries() -> None:
    text = "\n".join(
        [
            "# migrated from mosquitto",
            mosquitto_pbkdf2_line("roger", b"sekrit", 101),
            "",
            mosquitto_pbkdf2_line("many", b"rounds", 1000),
            mosquitto_sha512_line("old", b"legacy"),
        ]
    )
    passwords = load(text)
    assert sorted(passwords.entries) == ["many", "old", "roger"]
    roger, many, old = passwords.get("roger"), passwords.get("many"), passwords.get("old")
    assert roger is not None and many is not None and old is not None
    assert roger.verify(b"sekrit") and not roger.verify(b"Sekrit")
    assert many.verify(b"rounds") and not many.verify(b"round")
    assert old.verify(b"legacy") and not old.verify(b"legacy2")
    assert roger.credential("SCRAM-SHA-256") is None  # cannot do SCRAM


def test_a_file_written_by_mosquitto_passwd() -> None:
    """Lines as mosquitto_passwd 2.0 wrote them (password "secret" and "hunter2")."""
    text = (
        "alice:$7$101$7f9TGK3gbuvdP/Os$Kmyuq6qrAeDBTSXprMhf5Ifs1W+3afvVI8wmIfYSQN6iujZXuEKE3tfNN"
        "tyy1u+Cx4qbe+SZ3Tzhhv2c3SZbTQ==\n"
        "bob:$6$T756513ZgTTLdqlJ$ltfeQttFVU8I0RFk6MeV693X7HYQcV7z2tqueQgO1C78cAfw+xkGVxhQVfcApJJX"
        "WB5sES2uhvnzcw4TW2E76Q==\n"
    )
    passwords = load(text)
    alice, bob = passwords.get("alice"), passwords.get("bob")
    assert alice is not None and bob is not None
    assert alice.verify(b"secret") and not alice.verify(b"hunter2")
    assert bob.verify(b"hunter2") and not bob.verify(b"secret")


def test_argon2_entries_are_kept_but_refused() -> None:
    text = "new:$argon2id$v=19$m=65536,t=3,p=1$c2FsdA$aGFzaA\n" + make_entry_line(
        "ok", b"pw", ITERATIONS
    )
    passwords = load(text)
    new = passwords.get("new")
    assert new is not None and new.unsupported
    assert not new.verify(b"anything")
    assert len(passwords.warnings) == 1
    assert passwords.warnings[0].startswith("pw.txt:1: user 'new'")


# -- malformed files --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("alice", "expected NAME:HASH"),
        ("alice:secret", "plain-text passwords are not accepted"),
        (":$6$c2FsdA==$aGFzaA==", "the user name is empty"),
        ("alice:", "has no password hash"),
        ("alice:$5$abc$def", "unknown hash scheme '5'"),
        ("alice:$7$x$c2FsdA==$aGFzaA==", "iteration count 'x' is not a number"),
        ("alice:$7$101$c2FsdA==", "expected $7$<iterations>$<salt>$<hash>"),
        ("alice:$6$c2FsdA==$aGFzaA==", "the hash must be 64 bytes"),
        ("alice:$6$not*base64$aGFzaA==", "not valid base64"),
        ("alice:SCRAM-SHA-1$4096:c2FsdA==$aGFzaA==:aGFzaA==", "unknown mechanism 'SCRAM-SHA-1'"),
        ("alice:SCRAM-SHA-256$4096:c2FsdA==$aGFzaA==", "expected SCRAM-SHA-256$"),
        ("alice:SCRAM-SHA-256$4096:c2FsdA==$aGFzaA==:aGFzaA==", "keys must be 32 bytes"),
        ("alice:SCRAM-SHA-256$0:c2FsdA==$aGFzaA==:aGFzaA==", "out of range"),
    ],
)
def test_malformed_lines_name_file_and_line(line: str, message: str) -> None:
    good = make_entry_line("good", b"pw", ITERATIONS)
    text = f"# header\n{good}\n{line}\n"
    with pytest.raises(SecurityFileError) as info:
        load(text)
    assert str(info.value).startswith("pw.txt:3: ")
    assert message in str(info.value)
    assert info.value.line == 3


def test_white_space_around_lines_is_ignored() -> None:
    text = "  " + mosquitto_sha512_line("padded", b"pw") + "  \r\n\t\n   # comment\n"
    entry = load(text).get("padded")
    assert entry is not None and entry.verify(b"pw")


def test_duplicate_user_names_both_lines() -> None:
    first = make_entry_line("twice", b"a", ITERATIONS)
    second = mosquitto_sha512_line("twice", b"b")
    with pytest.raises(
        SecurityFileError, match=r"pw.txt:3: user 'twice' is already defined on line 1"
    ):
        load(f"{first}\n\n{second}\n")


def test_invalid_utf8_is_reported_with_its_line() -> None:
    with pytest.raises(SecurityFileError, match=r"pw.txt:2: not valid UTF-8"):
        PasswordFile.parse(b"# ok\n\xffuser:$6$x$y\n", "pw.txt")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SecurityFileError, match="nothere.txt: file not found"):
        PasswordFile.load(tmp_path / "nothere.txt")


def test_atomic_write_keeps_permissions(tmp_path: Path) -> None:
    path = tmp_path / "pw.txt"
    write_atomically(path, b"one\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # a new file: owner only
    os.chmod(path, 0o640)
    write_atomically(path, b"two\n")
    assert path.read_bytes() == b"two\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pw.txt"]  # no temporary left


# -- the authenticator's password check -------------------------------------------------------


def authenticator(
    allow_anonymous: bool = False, budget: KdfBudget | None = None
) -> FileAuthenticator:
    text = "\n".join(
        [
            make_entry_line("alice", b"alice-pw", ITERATIONS),
            mosquitto_pbkdf2_line("roger", b"roger-pw"),
        ]
    )
    return FileAuthenticator(load(text), allow_anonymous, budget)


@pytest.mark.parametrize(
    ("username", "password", "code"),
    [
        ("alice", b"alice-pw", 0),
        ("roger", b"roger-pw", 0),
        ("alice", b"roger-pw", 0x86),
        ("alice", None, 0x86),
        ("mallory", b"alice-pw", 0x86),
        ("ALICE", b"alice-pw", 0x86),
        (None, None, 0x87),
        (None, b"alice-pw", 0x87),
    ],
)
def test_check_password_codes(username: str | None, password: bytes | None, code: int) -> None:
    assert authenticator().check_password(LoginRequest("c1", username, password)) == code


def test_anonymous_allowed_but_user_names_still_checked() -> None:
    auth = authenticator(allow_anonymous=True)
    assert auth.check_password(LoginRequest("c1", None, None)) == 0
    # no fallback to anonymous
    assert auth.check_password(LoginRequest("c1", "alice", b"wrong")) == 0x86


def test_without_password_file_user_names_are_not_checked() -> None:
    assert FileAuthenticator(None, True).check_password(LoginRequest("c", "anyone", b"x")) == 0
    assert FileAuthenticator(None, False).check_password(LoginRequest("c", "anyone", b"x")) == 0x86
    assert FileAuthenticator(None, False).check_password(LoginRequest("c", None, None)) == 0x87


def test_the_listeners_rule_decides_for_names_nothing_can_check() -> None:
    """Without a password file a named client is as anonymous as one without a name: the
    listener's own rule (``anonymous``) decides for it, whatever the broker-wide default. A
    password file still decides for the names it can check."""
    allowing, refusing = FileAuthenticator(None, True), FileAuthenticator(None, False)
    assert allowing.check_password(LoginRequest("c", "anyone", b"x", False)) == 0x86
    assert allowing.check_password(LoginRequest("c", None, None, False)) == 0x87
    assert refusing.check_password(LoginRequest("c", "anyone", b"x", True)) == 0
    assert authenticator().check_password(LoginRequest("c1", "alice", b"wrong", True)) == 0x86


def test_budget_refuses_with_server_busy_but_remembers_good_logins() -> None:
    clock = FakeClock()
    budget = KdfBudget(rate=0.5, burst=0.5, clock=clock)
    auth = authenticator(budget=budget)
    assert auth.check_password(LoginRequest("c", "alice", b"alice-pw")) == 0
    budget.spend(10.0)  # as if many failed logins had used it up
    # remembered: no derivation
    assert auth.check_password(LoginRequest("c", "alice", b"alice-pw")) == 0
    assert auth.check_password(LoginRequest("c", "alice", b"wrong")) == 0x89
    assert auth.check_password(LoginRequest("c", "roger", b"roger-pw")) == 0x89
    assert budget.refused == 2
    clock.now += 30.0  # the budget refills
    assert auth.check_password(LoginRequest("c", "roger", b"roger-pw")) == 0
    assert auth.check_password(LoginRequest("c", "alice", b"wrong")) == 0x86


def test_reload_forgets_remembered_logins() -> None:
    auth = authenticator()
    assert auth.check_password(LoginRequest("c", "alice", b"alice-pw")) == 0
    auth.replace_passwords(load(make_entry_line("alice", b"new-pw", ITERATIONS)))
    assert auth.check_password(LoginRequest("c", "alice", b"alice-pw")) == 0x86
    assert auth.check_password(LoginRequest("c", "alice", b"new-pw")) == 0
    # gone from the new file
    assert auth.check_password(LoginRequest("c", "roger", b"roger-pw")) == 0x86


def test_scram_credential_text_round_trip() -> None:
    cred = ScramCredential.derive("SCRAM-SHA-256", b"pw", ITERATIONS, salt=b"0123456789abcdef")
    again = ScramCredential.parse(cred.text())
    assert again == cred
    assert cred.text().startswith(
        "SCRAM-SHA-256$4096:" + base64.b64encode(b"0123456789abcdef").decode() + "$"
    )


# -- anonymous default ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hosts", "allowed"),
    [
        (["127.0.0.1"], True),
        (["127.0.0.1", "::1", "localhost", "127.1.2.3"], True),
        (["127.0.0.1", "0.0.0.0"], False),
        (["::"], False),
        ([""], False),
        (["192.168.1.10"], False),
        (["broker.example.com"], False),
        ([], False),
    ],
)
def test_anonymous_default_follows_the_listeners(hosts: list[str], allowed: bool) -> None:
    assert anonymous_default([ListenerConfig(host=host) for host in hosts]) is allowed


def test_a_loopback_listener_behind_a_reverse_proxy_is_not_local() -> None:
    """It binds to 127.0.0.1, but the proxy in front of it serves the internet: clients without
    a user name are not let in by default."""
    proxied = ListenerConfig(host="127.0.0.1", protocol="ws", ws_trusted_proxies="127.0.0.1")
    assert not local_only(proxied)
    assert not anonymous_default([ListenerConfig(), proxied])
    assert local_only(ListenerConfig(host="127.0.0.1", protocol="ws"))


def test_is_loopback_forms() -> None:
    assert is_loopback("[::1]")
    assert not is_loopback("10.0.0.1")

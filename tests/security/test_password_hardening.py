"""User enumeration and weak password entries: the SCRAM answer for an unknown user looks like a
real user's and stays the same across restarts; weak hashes are reported at load, and
``security.min_iterations`` refuses them (file, line and user named)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.clients import TIMEOUT, RawClient, connect_packet, parse_reason_and_properties, unique
from support.password_files import (
    ITERATIONS,
    mosquitto_pbkdf2_line,
    mosquitto_sha512_line,
    password_file,
    security_config,
)
from support.scram_client import ScramClient

from mqttbroker.security import SecurityFileError
from mqttbroker.security.authenticator import FileAuthenticator, load_secret
from mqttbroker.security.passwords import PasswordFile, ScramCredential, make_entry_line

METHOD = "SCRAM-SHA-256"


def server_first(broker: Any, username: str) -> dict[str, str]:
    """The broker's server-first-message to a SCRAM client-first for ``username``, parsed."""
    scram = ScramClient(METHOD, username, b"guess")
    with RawClient(broker.host, broker.port) as raw:
        raw.send(connect_packet(unique("enum"), auth_method=METHOD, auth_data=scram.first()))
        code, props = parse_reason_and_properties(raw.read_packet(), 0xF0)
    assert code == 0x18
    data = props["AuthenticationData"]
    assert isinstance(data, bytes)
    return dict(part.split("=", 1) for part in data.decode().split(","))


def test_unknown_users_scram_answer_is_stable_across_restarts_and_looks_real(
    tmp_path: Path, start_broker: Callable[..., Any]
) -> None:
    config = security_config(password_file(tmp_path / "pw.txt", {"alice": b"pw", "bob": b"pw"}))
    data = tmp_path / "data"  # the SQLite store's data directory: the secret is kept there
    answers = []
    for _ in range(2):
        broker = start_broker(data_dir=data, extra_args=config)
        answers.append((server_first(broker, "mallory"), server_first(broker, "alice")))
        broker.stop()
    (unknown1, alice1), (unknown2, alice2) = answers
    assert unknown1["s"] == unknown2["s"]  # the same after a restart
    assert alice1["s"] == alice2["s"]
    assert unknown1["i"] == alice1["i"] == str(ITERATIONS)  # the file's usual count
    assert len(base64.b64decode(unknown1["s"])) == len(base64.b64decode(alice1["s"]))
    assert (data / "auth-secret").stat().st_mode & 0o077 == 0


def test_stand_ins_cost_what_the_files_usual_entry_costs(tmp_path: Path) -> None:
    lines = [make_entry_line(f"u{i}", b"pw", 5000 + (i > 0)) for i in range(3)]
    lines.append(mosquitto_pbkdf2_line("roger", b"pw", 7000))
    passwords = PasswordFile.parse("\n".join(lines).encode(), "pw.txt")
    assert passwords.usual_cost() == ("SCRAM-SHA-512", 5001)
    assert passwords.usual_iterations("SCRAM-SHA-256") == 5001
    auth = FileAuthenticator(passwords, False, secret=load_secret(tmp_path / "secret"))
    stand_in = auth._stand_in_entry(passwords)
    assert stand_in.cost == ("SCRAM-SHA-512", 5001)


def test_secret_file_is_kept_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "secret"
    first = load_secret(path)
    assert load_secret(path) == first and len(first) >= 32
    path.write_text("not hex\n")
    with pytest.raises(SecurityFileError, match="secret: expected at least 32 bytes in hex"):
        load_secret(path)


# -- weak entries -----------------------------------------------------------------------------


def weak_file() -> str:
    one = ScramCredential.derive("SCRAM-SHA-256", b"pw", 1)
    return "\n".join(
        [
            make_entry_line("strong", b"pw", ITERATIONS),
            f"scram1:{one.text()}",
            mosquitto_sha512_line("sha", b"pw"),
            mosquitto_pbkdf2_line("pbkdf", b"pw", 101),
        ]
    )


def test_weak_entries_are_warned_about_naming_the_user() -> None:
    warnings = PasswordFile.parse(weak_file().encode(), "pw.txt").warnings
    assert [w.split(":")[1] + ":" + w.split("'")[1] for w in warnings] == [
        "2:scram1",
        "3:sha",
        "4:pbkdf",
    ]
    assert "SCRAM-SHA-256 with 1 iterations" in warnings[0]
    assert "one round of SHA-512" in warnings[1]
    assert "Mosquitto $7$ with 101 iterations" in warnings[2]
    assert all("weak password hash" in w and "mqttbroker passwd" in w for w in warnings)


@pytest.mark.parametrize(
    ("minimum", "line", "user"), [(2, 3, "sha"), (102, 3, "sha"), (1, None, None)]
)
def test_min_iterations_refuses_weaker_entries(
    minimum: int, line: int | None, user: str | None
) -> None:
    text = weak_file().encode()
    if line is None:  # a $6$ hash counts as 1 iteration, a SCRAM-SHA-256 with 1 too
        assert len(PasswordFile.parse(text, "pw.txt", minimum)) == 4
        return
    text = text.replace(b"scram1:", b"#scram1:")  # so the first weak entry is line 3
    with pytest.raises(SecurityFileError) as info:
        PasswordFile.parse(text, "pw.txt", minimum)
    assert str(info.value).startswith(f"pw.txt:{line}: user {user!r}: ")
    assert f"fewer than security.min_iterations ({minimum})" in str(info.value)


@pytest.fixture
def weak_passwords(tmp_path: Path) -> Path:
    """A password file with weak entries (``weak_file``) in the test's directory."""
    passwords = tmp_path / "pw.txt"
    passwords.write_text(weak_file() + "\n")
    return passwords


def test_min_iterations_stops_the_broker_at_start(
    weak_passwords: Path, start_broker: Callable[..., Any]
) -> None:
    with pytest.raises(RuntimeError) as info:
        start_broker(
            extra_args=(*security_config(weak_passwords, "min_iterations = 4096\n"), "--memory")
        )
    assert f"{weak_passwords}:2: user 'scram1': SCRAM-SHA-256 with 1 iterations" in str(info.value)


def test_weak_entries_are_warned_about_at_start(
    weak_passwords: Path, start_broker: Callable[..., Any]
) -> None:
    broker = start_broker(extra_args=(*security_config(weak_passwords), "--memory"))
    for user in ("scram1", "sha", "pbkdf"):
        found = broker.wait_for_log(rf"WARNING .*user '{user}': weak password hash", TIMEOUT)
        assert found is not None, broker.log_text()
    assert "user 'strong'" not in broker.log_text()

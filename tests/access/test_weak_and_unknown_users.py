"""Password files on a real broker: the SCRAM answer for an unknown user looks like a real
user's and stays the same across restarts (its salt comes from a secret kept in the data
directory); weak entries are warned about at start, and refused with ``min_iterations``. The
parsing and the stand-ins themselves: tests/security/test_password_hardening.py."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.clients import TIMEOUT, RawClient, connect_packet, parse_reason_and_properties, unique
from support.password_files import ITERATIONS, password_file, security_config, weak_file
from support.scram_client import ScramClient

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

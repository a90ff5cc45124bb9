"""User enumeration and weak password entries, without a broker: an unknown user's stand-in entry
costs what the file's usual entry costs, from a secret kept and checked; weak hashes are reported
at load, and ``security.min_iterations`` refuses them (file, line and user named). On a real
broker: tests/access/test_weak_and_unknown_users.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.password_files import mosquitto_pbkdf2_line, weak_file

from mqttbroker.security import SecurityFileError
from mqttbroker.security.authenticator import FileAuthenticator, load_secret
from mqttbroker.security.passwords import PasswordFile, make_entry_line


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

"""security/passwd.py, ``mqttbroker passwd``, as a subprocess: add, change, delete, create,
prompts on a terminal, and files it must not touch."""

from __future__ import annotations

import os
import pty
import select
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.launcher import run_broker
from support.password_files import ITERATIONS, mosquitto_pbkdf2_line, mosquitto_sha512_line

from mqttbroker.security.passwords import PasswordFile

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0


def passwd(
    *args: str, password: str | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mqttbroker passwd ARGS`` (fast iterations unless given)."""
    if password is not None:
        args = ("--password-stdin", "--iterations", str(ITERATIONS), *args)
        stdin = password + "\n"
    return run_broker("passwd", *args, input=stdin or "", timeout=TIMEOUT)


def verify(path: Path, user: str, password: bytes) -> bool:
    entry = PasswordFile.load(path).get(user)
    assert entry is not None, f"no user {user!r} in {path}"
    return entry.verify(password)


def test_create_add_change_delete(tmp_path: Path) -> None:
    path = tmp_path / "pw.txt"
    done = passwd("-c", str(path), "alice", password="first")
    assert done.returncode == 0, done.stderr
    assert "added user 'alice'" in done.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert verify(path, "alice", b"first")

    assert passwd(str(path), "bob", password="bobs").returncode == 0
    assert verify(path, "bob", b"bobs") and verify(path, "alice", b"first")

    changed = passwd(str(path), "alice", password="second")
    assert changed.returncode == 0, changed.stderr
    assert "changed the password of user 'alice'" in changed.stdout
    assert verify(path, "alice", b"second")
    assert not verify(path, "alice", b"first")
    assert [line.split(":")[0] for line in path.read_text().splitlines()] == ["alice", "bob"]

    deleted = passwd("-D", str(path), "alice")
    assert deleted.returncode == 0, deleted.stderr
    assert sorted(PasswordFile.load(path).entries) == ["bob"]


def test_other_lines_are_kept_and_mosquitto_entries_migrate(tmp_path: Path) -> None:
    path = tmp_path / "pw.txt"
    roger = mosquitto_pbkdf2_line("roger", b"old")
    legacy = mosquitto_sha512_line("legacy", b"older")
    path.write_text(f"# our users\n{roger}\n\n{legacy}\n")
    os.chmod(path, 0o640)
    assert passwd(str(path), "roger", password="new").returncode == 0
    lines = path.read_text().splitlines()
    assert lines[0] == "# our users" and lines[2] == "" and lines[3] == legacy
    assert lines[1].startswith("roger:SCRAM-SHA-512$4096:")
    assert verify(path, "roger", b"new") and not verify(path, "roger", b"old")
    entry = PasswordFile.load(path).get("roger")
    assert entry is not None and entry.credential("SCRAM-SHA-256") is not None  # SCRAM now
    assert verify(path, "legacy", b"older")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # permissions kept


def test_create_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "pw.txt"
    path.write_text(mosquitto_sha512_line("old", b"x") + "\n")
    assert passwd("-c", str(path), "new", password="pw").returncode == 0
    assert sorted(PasswordFile.load(path).entries) == ["new"]


@pytest.mark.parametrize(
    ("args", "password", "message"),
    [
        (("{missing}", "alice"), "pw", "{missing}: file not found (-c creates it)"),
        (("-D", "{file}", "nobody"), None, "{file}: no user 'nobody'"),
        (("{file}", "al:ice"), "pw", "may not contain ':'"),
        (("{file}", " alice"), "pw", "may not start or end with white space"),
        (("{file}", "carol"), "", "the password is empty"),
        (("--iterations", "10", "--password-stdin", "{file}", "carol"), None, "--iterations"),
        (("{file}", "carol"), None, "standard input is not a terminal: use --password-stdin"),
    ],
)
def test_errors(tmp_path: Path, args: tuple[str, ...], password: str | None, message: str) -> None:
    path = tmp_path / "pw.txt"
    original = mosquitto_sha512_line("alice", b"x") + "\n"
    path.write_text(original)
    names = {"file": str(path), "missing": str(tmp_path / "missing.txt")}
    done = passwd(*(a.format(**names) for a in args), password=password)
    assert done.returncode == 1, done
    assert done.stderr.startswith("mqttbroker passwd: ")
    assert message.format(**names) in done.stderr
    assert path.read_text() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pw.txt"]


def test_bad_file_is_reported_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "pw.txt"
    original = f"{mosquitto_sha512_line('alice', b'x')}\n# fine\nbob:plaintext\n"
    path.write_text(original)
    done = passwd(str(path), "carol", password="pw")
    assert done.returncode == 1
    assert f"{path}:3: user 'bob': not a password hash" in done.stderr
    assert path.read_text() == original
    deleted = passwd("-D", str(path), "alice")
    assert deleted.returncode == 1 and f"{path}:3:" in deleted.stderr
    assert path.read_text() == original


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    done = passwd("-c", "-D", str(tmp_path / "pw.txt"), "alice")
    assert done.returncode == 2
    assert "not allowed with argument" in done.stderr
    assert passwd(str(tmp_path / "pw.txt")).returncode == 2  # no user


# -- prompting on a terminal ------------------------------------------------------------------


def run_on_terminal(args: list[str], answers: list[str]) -> tuple[int, str]:
    """Run passwd with a pseudo-terminal as stdin/stdout/stderr (and no controlling terminal, so
    nothing can reach the terminal running the tests); answer each prompt in turn."""
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqttbroker", "passwd", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        env=env,
        cwd=str(ROOT),
    )
    os.close(slave)
    output = b""
    deadline = time.monotonic() + TIMEOUT
    pending = list(answers)
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"passwd did not finish; it wrote {output!r}"
            ready, _, _ = select.select([master], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(master, 1024)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
            if pending and output.endswith(b"assword: "):  # a prompt, nothing after it
                os.write(master, pending.pop(0).encode() + b"\n")
    finally:
        os.close(master)
        code = proc.wait(TIMEOUT)
    return code, output.decode(errors="replace")


def test_prompts_twice(tmp_path: Path) -> None:
    path = tmp_path / "pw.txt"
    code, output = run_on_terminal(
        ["-c", "--iterations", str(ITERATIONS), str(path), "alice"], ["s3cret", "s3cret"]
    )
    assert code == 0, output
    assert "Password:" in output and "Reenter password:" in output
    assert "s3cret" not in output  # not echoed
    assert verify(path, "alice", b"s3cret")


def test_prompt_mismatch_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "pw.txt"
    original = mosquitto_sha512_line("alice", b"x") + "\n"
    path.write_text(original)
    code, output = run_on_terminal([str(path), "alice"], ["one", "two"])
    assert code == 1
    assert "the passwords do not match" in output
    assert path.read_text() == original

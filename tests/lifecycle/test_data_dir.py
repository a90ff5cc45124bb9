"""The data directory: one broker at a time (an exclusive lock held for the process's life, that
dies with it), and a directory or database the broker may not use is a start error naming the
path and the cause (exit 2), never mistaken for damage: nothing is moved aside or changed."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from support.broker_exits import as_another_user, error_lines, exits, foreign, refused_to_start

from mqttbroker.storage.lock import LOCK_NAME


def test_second_broker_on_the_same_data_dir_refuses_naming_the_first(
    start_broker: Callable, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    first = start_broker(data)
    assert first.proc is not None
    second = start_broker(data, wait=False)
    error, log = refused_to_start(second)
    assert (
        f"cannot start: data directory {data} is in use by another mqttbroker "
        f"(pid {first.proc.pid}, lock {data / LOCK_NAME})" in error
    ), log
    assert "store" not in log, "the second broker must not touch the database"
    assert first.returncode is None, "the first broker runs on"


def test_the_lock_dies_with_the_broker(start_broker: Callable, tmp_path: Path) -> None:
    """No stale lock: after a clean stop, and after kill -9, the next broker starts."""
    data = tmp_path / "data"
    first = start_broker(data)
    assert first.stop() == 0
    second = start_broker(data)
    assert second.proc is not None
    second.proc.kill()
    second.wait_exit()
    third = start_broker(data)
    assert third.returncode is None


def test_read_only_database_is_a_start_error_not_damage(
    start_broker: Callable, tmp_path: Path
) -> None:
    """A database made by another user (readable, not writable to the broker): the broker says so
    and exits 2; it used to move the file aside as "damaged" and serve with an empty store."""
    data = tmp_path / "data"
    data.mkdir()
    db_path = data / "mqttbroker.db"
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE kept (x)")
    db.execute("INSERT INTO kept VALUES (42)")
    db.commit()
    db.close()
    foreign(db_path, 0o644)
    before = db_path.read_bytes()
    process = start_broker(data, wait=False, preexec_fn=as_another_user)
    error, log = refused_to_start(process)
    assert f"cannot start: {db_path}: cannot open the database: " in error, log
    assert "readonly" in error and "must be able to read and write it" in error, log
    assert "DAMAGED" not in log, log
    assert db_path.read_bytes() == before
    assert sorted(p.name for p in data.iterdir()) == sorted([LOCK_NAME, "mqttbroker.db"])


def test_data_dir_that_cannot_be_created_is_a_start_error(
    start_broker: Callable, tmp_path: Path
) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    foreign(parent, 0o755)
    data = parent / "data"
    try:
        process = start_broker(
            tmp_path, extra_args=("--data-dir", str(data)), wait=False, preexec_fn=as_another_user
        )
        code, log = exits(process)
    finally:
        parent.chmod(0o755)
    assert code == 2, log
    errors = error_lines(log)
    assert len(errors) == 1, log
    assert f"cannot start: data directory {data}: permission denied (EACCES)" in errors[0], log
    assert "moved" not in log, log
    assert not data.exists()


def test_data_dir_that_is_a_file_is_a_start_error(start_broker: Callable, tmp_path: Path) -> None:
    data = tmp_path / "data-file"
    data.write_bytes(b"not a directory")
    process = start_broker(tmp_path, extra_args=("--data-dir", str(data)), wait=False)
    error, log = refused_to_start(process)
    assert f"cannot start: data directory {data}: not a directory" in error, log
    assert data.read_bytes() == b"not a directory"

"""A start that fails never leaves the process behind: with the SQLite store (whose thread used to
keep a failed broker alive, deaf to SIGTERM), a listener that cannot listen, a locked database or
a row that cannot be restored end the process promptly with status 2 and one ERROR line naming
the cause and the listener or path. A SIGINT/SIGTERM while starting stops it as a normal stop
does (status 0, no traceback)."""

from __future__ import annotations

import signal
import socket
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.broker_exits import error_lines, exits, refused_to_start

from mqttbroker.storage.sqlite import MIGRATIONS


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_port_in_use_exits_2_naming_the_listener(start_broker: Callable, busy_port: int) -> None:
    process = start_broker(extra_args=("--port", str(busy_port)), wait=False)
    error, log = refused_to_start(process)
    assert (
        f"cannot start: listener[0] 127.0.0.1:{busy_port} (MQTT over TCP): cannot listen: "
        "address already in use" in error
    ), log


def test_ws_port_in_use_exits_2_naming_the_websocket_listener(
    start_broker: Callable, busy_port: int
) -> None:
    process = start_broker(extra_args=("--ws-port", str(busy_port)), wait=False)
    code, log = exits(process)
    assert code == 2, log
    assert (
        f"cannot start: listener[1] 127.0.0.1:{busy_port} (MQTT over WebSocket): cannot listen: "
        "address already in use" in log
    ), log


def test_unresolvable_host_exits_2_naming_the_host(start_broker: Callable, tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('[[listener]]\nhost = "no.such.host"\nport = 0\n')
    process = start_broker(extra_args=("--config", str(config)), wait=False)
    error, log = refused_to_start(process)
    assert "listener[0] no.such.host:0 (MQTT over TCP): cannot listen: cannot resolve host " in (
        error
    ), log


def _locked(db_path: Path) -> sqlite3.Connection:
    """A database another program holds an exclusive transaction on."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    holder = sqlite3.connect(db_path, isolation_level=None)
    holder.execute("CREATE TABLE IF NOT EXISTS other (x)")
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def test_locked_database_exits_2_naming_the_path(start_broker: Callable, tmp_path: Path) -> None:
    data = tmp_path / "data"
    holder = _locked(data / "mqttbroker.db")
    try:
        process = start_broker(data, wait=False)
        code, log = exits(process)
    finally:
        holder.close()
    assert code == 2, log
    errors = error_lines(log)
    assert len(errors) == 1, log
    assert f"cannot start: {data / 'mqttbroker.db'}: cannot open the database: " in errors[0]
    assert "database is locked" in errors[0], log
    assert not list(data.glob("*.damaged-*")), "a locked database is not damaged"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_while_starting_stops_cleanly(
    start_broker: Callable, tmp_path: Path, signum: int
) -> None:
    """The broker waits for a locked database; SIGTERM/SIGINT meanwhile stops it: status 0, as
    for a normal stop, no traceback, nothing left listening."""
    data = tmp_path / "data"
    holder = _locked(data / "mqttbroker.db")
    try:
        process = start_broker(data, wait=False)
        assert process.wait_for_log(r"store .*: opening", 10.0), process.log_text()
        process.send_signal(signum)
        code, log = exits(process)
    finally:
        holder.close()
    assert code == 0, log
    assert "stop requested while starting" in log, log
    assert "listening on" not in log, log
    assert error_lines(log) == [], log


@pytest.mark.parametrize("name", ["TERM", "INT"])
def test_signal_before_the_event_loop_runs_stops_cleanly(start_broker: Callable, name: str) -> None:
    """The signal arrives while the configuration is read (before the loop's handlers exist):
    it is recorded, and the broker stops as soon as its loop runs, status 0, no traceback."""
    launcher = (str(Path(__file__).with_name("signalled_while_loading.py")), name)
    process = start_broker(launcher=launcher, wait=False)
    code, log = exits(process)
    assert code == 0, log
    assert "stop requested while starting" in log and "stopped" in log, log
    assert "listening on" not in log, log


def test_row_that_cannot_be_restored_exits_2_and_leaves_the_file(
    start_broker: Callable, tmp_path: Path
) -> None:
    """SQLite finds the file sound, but a retained message's properties are garbage: the broker
    names the file and the table and exits; the file is neither moved nor changed."""
    data = tmp_path / "data"
    data.mkdir()
    db_path = data / "mqttbroker.db"
    db = sqlite3.connect(db_path, isolation_level=None)
    for number, migration in enumerate(MIGRATIONS):
        db.executescript(f"{migration} PRAGMA user_version={number + 1};")
    garbage = b"\x05\x26\xff\xff\xff"  # a user property whose strings run past the end
    db.execute("INSERT INTO retained VALUES ('t', x'00', 0, ?, NULL)", (garbage,))
    db.close()
    process = start_broker(data, wait=False)
    error, log = refused_to_start(process)
    assert f"cannot start: {db_path}: cannot restore the stored state (table retained: " in (
        error
    ), log
    assert not list(data.glob("*.damaged-*"))
    db = sqlite3.connect(db_path)
    try:
        assert db.execute("SELECT topic, properties FROM retained").fetchall() == [("t", garbage)]
    finally:
        db.close()

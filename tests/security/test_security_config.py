"""The [security] table: values, errors naming file and key, and what build_security makes of it
(anonymous access from the listener addresses, the files loaded, reload keeping old rules)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from support.clients import connect_packet
from support.launcher import write_file
from support.listeners import serving
from support.password_files import ITERATIONS

from mqttbroker.broker.auth import LoginRequest
from mqttbroker.config import Config, ConfigError, ListenerConfig, SecurityConfig, load
from mqttbroker.security import build_security
from mqttbroker.security.passwords import make_entry_line


def test_defaults() -> None:
    assert Config().security == SecurityConfig("", "", None)


def test_values_are_applied(tmp_path: Path) -> None:
    pw = write_file(tmp_path / "pw.txt", "")
    acl = write_file(tmp_path / "acl.txt", "")
    config = load(
        write_file(
            tmp_path / "c.toml",
            f"[security]\npassword_file = {str(pw)!r}\nacl_file = {str(acl)!r}\n"
            "allow_anonymous = false\n",
        )
    )
    assert config.security == SecurityConfig(str(pw), str(acl), False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[security]\nallow_anonymous = 'yes'\n",
            "security.allow_anonymous: expected true or false",
        ),
        ("[security]\npassword_file = 3\n", "security.password_file: expected a string"),
        ("[security]\nacl = 'x'\n", "security.acl: unknown key; known keys: acl_file"),
        ("[security]\npassword_file = '/no/such/file'\n", "security.password_file: file not found"),
        ("[security]\nacl_file = '/no/such/acl'\n", "security.acl_file: file not found"),
        ("security = 1\n", "security: expected a table [security]"),
        (
            "[security]\nmax_login_failures = -1\n",
            "security.max_login_failures: must not be negative",
        ),
        (
            "[security]\nlogin_failure_window = 0\n",
            "security.login_failure_window: must be positive",
        ),
        (
            "[security]\nmin_iterations = 10000001\n",
            "security.min_iterations: must be between 0 (none) and 10,000,000",
        ),
        ("[security]\nsecret_file = 1\n", "security.secret_file: expected a string"),
        (
            "[security]\nacl_partly_denied = 'drop'\n",
            'security.acl_partly_denied: expected "filter" or "refuse"',
        ),
    ],
)
def test_errors_name_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write_file(tmp_path / "bad.toml", text)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert expected in str(info.value)


def config_with(hosts: list[str], **security: object) -> Config:
    config = Config()
    config.storage.backend = "memory"  # nothing on disk: no secret file in the working directory
    config.listeners = [ListenerConfig(host=h, port=0) for h in hosts]
    for key, value in security.items():
        setattr(config.security, key, value)
    return config


@pytest.mark.parametrize(
    ("hosts", "setting", "allowed"),
    [
        (["127.0.0.1"], None, True),
        (["127.0.0.1", "0.0.0.0"], None, False),
        (["0.0.0.0"], True, True),
        (["127.0.0.1"], False, False),
    ],
)
def test_anonymous_access(hosts: list[str], setting: bool | None, allowed: bool) -> None:
    security = build_security(config_with(hosts, allow_anonymous=setting))
    code = security.authenticator.check_password(LoginRequest("c", None, None))
    assert code == (0 if allowed else 0x87)
    assert security.authorizer is None  # no ACL file: no authorizer, everything allowed


def test_files_loaded_and_reloaded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pw = write_file(tmp_path / "pw.txt", make_entry_line("alice", b"one", ITERATIONS) + "\n")
    acl = write_file(tmp_path / "acl.txt", "user alice\ntopic read a/#\n")
    security = build_security(config_with(["127.0.0.1"], password_file=str(pw), acl_file=str(acl)))
    auth, acls = security.authenticator, security.authorizer
    assert acls is not None
    assert auth.check_password(LoginRequest("c", "alice", b"one")) == 0
    assert acls.can_subscribe("c", "alice", "a/#") and acls.generation == 0

    pw.write_text(make_entry_line("alice", b"two", ITERATIONS) + "\n")
    acl.write_text("user alice\ntopic read b/#\n")
    assert security.reload()
    assert auth.check_password(LoginRequest("c", "alice", b"two")) == 0
    assert auth.check_password(LoginRequest("c", "alice", b"one")) == 0x86
    assert acls.can_subscribe("c", "alice", "b/#") and not acls.can_subscribe("c", "alice", "a/#")
    assert acls.generation == 1

    pw.write_text("alice\n")
    acl.write_text("user alice\nbogus\n")
    with caplog.at_level(logging.ERROR, logger="mqttbroker.security"):
        assert not security.reload()
    assert f"{pw}:1: expected NAME:HASH; keeping the previous password file" in caplog.text
    assert f"{acl}:2: unknown keyword 'bogus'" in caplog.text
    assert auth.check_password(LoginRequest("c", "alice", b"two")) == 0
    assert acls.can_subscribe("c", "alice", "b/#") and acls.generation == 1

    pw.unlink()
    with caplog.at_level(logging.ERROR, logger="mqttbroker.security"):
        assert not security.reload()
    assert f"{pw}: file not found" in caplog.text
    assert auth.check_password(LoginRequest("c", "alice", b"two")) == 0


@pytest.mark.parametrize(
    ("listeners", "refused_all", "summary"),
    [
        ([ListenerConfig(host="0.0.0.0")], True, "anonymous access refused (default"),
        ([ListenerConfig(host="127.0.0.1")], False, "anonymous access allowed (default"),
        (
            [ListenerConfig(host="0.0.0.0"), ListenerConfig(host="0.0.0.0", allow_anonymous=True)],
            False,
            "anonymous access allowed on listener[1] (0.0.0.0:1883) only",
        ),
        (
            [ListenerConfig(host="127.0.0.1"), ListenerConfig(host="0.0.0.0")],
            False,
            "anonymous access allowed on listener[0] (127.0.0.1:1883) only",
        ),
        (
            [ListenerConfig(host="0.0.0.0", tls_certificate_username="cn")],
            False,  # a verified client certificate names the user: no password needed
            "anonymous access refused (default",
        ),
        (
            [ListenerConfig(host="127.0.0.1", allow_anonymous=False)],
            True,
            "anonymous access refused\n",
        ),
    ],
)
def test_the_startup_summary_counts_each_listeners_own_rule(
    caplog: pytest.LogCaptureFixture,
    listeners: list[ListenerConfig],
    refused_all: bool,
    summary: str,
) -> None:
    """No password file: "every client will be refused" only when that is so, and the summary
    names the listeners that allow anonymous clients when not all of them do."""
    config = Config()
    config.listeners = listeners
    with caplog.at_level(logging.INFO, logger="mqttbroker.security"):
        build_security(config)
    assert ("every client will be refused" in caplog.text) is refused_all, caplog.text
    assert summary in caplog.text + "\n", caplog.text


def test_warnings_at_startup(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    acl = write_file(tmp_path / "acl.txt", "user admin\ntopic readwrite #\n")
    with caplog.at_level(logging.WARNING, logger="mqttbroker.security"):
        build_security(config_with(["0.0.0.0"], acl_file=str(acl)))
    assert "every client will be refused" in caplog.text
    assert "user names are not checked" in caplog.text


def test_a_user_name_is_no_way_around_the_listeners_rule(tmp_path: Path) -> None:
    """Without a password file a user name cannot be checked, so a named client is as anonymous
    as one without: a listener that refuses anonymous clients refuses it too (MQTT 5: 0x86,
    3.1.1: 4), even where [security] allow_anonymous is true; a listener that allows them lets
    it in."""
    config = Config(
        listeners=[
            ListenerConfig(port=0, allow_anonymous=False),
            ListenerConfig(port=0, allow_anonymous=True),
        ],
        data_dir=str(tmp_path),
    )
    config.security.allow_anonymous = True
    config.storage.backend = "memory"

    async def answer(port: int, packet: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(packet)
            return await asyncio.wait_for(reader.readexactly(4), 10)
        finally:
            writer.close()

    async def scenario() -> list[bytes]:
        server, (closed, open_) = await serving(config)
        try:
            return [
                await answer(closed, connect_packet("named5", username="anyone", password=b"x")),
                await answer(closed, connect_packet("named4", 4, username="anyone")),
                await answer(closed, connect_packet("nameless", 4)),
                await answer(open_, connect_packet("named-open", 4, username="anyone")),
            ]
        finally:
            await server.stop()

    named5, named4, nameless, named_open = asyncio.run(scenario())
    assert named5[0] == 0x20 and named5[3] == 0x86, named5  # CONNACK 0x86 (and a reason string)
    assert named4 == b"\x20\x02\x00\x04"
    assert nameless == b"\x20\x02\x00\x05"
    assert named_open == b"\x20\x02\x00\x00"

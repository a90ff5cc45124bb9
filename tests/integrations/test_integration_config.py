"""Bad [[bridge]] and [[webhook]] sections fail at start, naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.launcher import run_broker, write_file

from mqttbroker.config import ConfigError, load

ROOT = Path(__file__).resolve().parents[2]

BRIDGE = """
[[bridge]]
name = "cloud"
address = "127.0.0.1:1883"
{extra}
[[bridge.topic]]
filter = "{filter}"
direction = "{direction}"
"""
WEBHOOK = """
[[webhook]]
name = "hook"
url = "{url}"
topics = ["a/#"]
{extra}
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            BRIDGE.format(extra="", filter="a/#", direction="sideways"),
            'bridge[0].topic[0].direction: expected "out", "in" or "both", got \'sideways\'',
        ),
        (
            BRIDGE.format(extra="", filter="a/#/b", direction="out"),
            "bridge[0].topic[0].filter: 'a/#/b' is not a valid topic filter",
        ),
        (
            BRIDGE.format(extra='password_file = "/nonexistent/pw"', filter="a", direction="in"),
            "bridge[0].password_file: cannot read /nonexistent/pw: No such file or directory",
        ),
        (
            BRIDGE.format(extra='protocol = "4"', filter="a", direction="in"),
            'bridge[0].protocol: expected "5" or "3.1.1"',
        ),
        (
            BRIDGE.format(extra="", filter="a", direction="in").replace("1883", "port"),
            'bridge[0].address: expected "host:port"',
        ),
        (
            BRIDGE.format(extra="colour = 1", filter="a", direction="in"),
            "bridge[0].colour: unknown key",
        ),
        (
            WEBHOOK.format(url="example.com/hook", extra=""),
            "webhook[0].url: expected an http:// or https:// URL, got 'example.com/hook'",
        ),
        (
            WEBHOOK.format(url="http://127.0.0.1/x", extra='secret_file = "/nonexistent/s"'),
            "webhook[0].secret_file: cannot read /nonexistent/s: No such file or directory",
        ),
        (
            WEBHOOK.format(url="http://127.0.0.1/x", extra='secret_env = "NO_SUCH_VARIABLE_X"'),
            "webhook[0].secret_env: the environment variable NO_SUCH_VARIABLE_X is not set",
        ),
        (
            WEBHOOK.format(url="http://127.0.0.1/x", extra='events = ["message.lost"]'),
            "webhook[0].events[0]: expected one of",
        ),
        (
            WEBHOOK.format(url="http://127.0.0.1/x", extra="max_attempts = 0"),
            "webhook[0].max_attempts: must be at least 1",
        ),
    ],
)
def test_bad_sections_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write_file(tmp_path / "integrations.toml", text)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: "), info.value
    assert message in str(info.value)


def test_good_sections_load(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("k\n")
    text = BRIDGE.format(extra='protocol = "3.1.1"', filter="a/+/b", direction="both")
    text += WEBHOOK.format(url="https://example.com/in", extra=f'secret_file = "{secret}"')
    config = load(write_file(tmp_path / "integrations.toml", text))
    (bridge,) = config.bridges
    assert (bridge.host, bridge.port, bridge.protocol) == ("127.0.0.1", 1883, "3.1.1")
    assert bridge.session_expiry == 3600 and not bridge.insecure and not bridge.tls
    assert bridge.topics[0].direction == "both" and bridge.topics[0].qos == 1
    (hook,) = config.webhooks
    assert hook.secret == b"k" and hook.max_attempts == 10 and hook.events == ["message.publish"]


@pytest.mark.parametrize(
    ("line", "username"), [("", None), ('username = ""', None), ('username = "a"', "a")]
)
def test_an_empty_user_name_means_none(tmp_path: Path, line: str, username: str | None) -> None:
    """As for password_file and client_id, an empty string leaves the key unset: the bridge
    sends no user name (a remote with a password file would refuse an empty one)."""
    text = BRIDGE.format(extra=line, filter="a/#", direction="out")
    (bridge,) = load(write_file(tmp_path / "integrations.toml", text)).bridges
    assert bridge.username == username


def test_the_broker_exits_2_and_names_the_key(tmp_path: Path) -> None:
    path = write_file(tmp_path / "integrations.toml", WEBHOOK.format(url="/relative", extra=""))
    run = run_broker("--config", str(path), "--memory", cwd=tmp_path)
    assert run.returncode == 2, run
    assert f"{path}: webhook[0].url: expected an http:// or https:// URL" in run.stderr

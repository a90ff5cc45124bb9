"""The ``[[bridge]]`` and ``[[webhook]]`` sections of the TOML configuration, checked at start:
every error names the file and the key (``mqttbroker.toml: bridge[0].topic[1].direction: ...``).
Secrets (passwords, signing keys) are read here, from a file or an environment variable."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..broker.topics import valid_topic_filter, valid_topic_name
from ..secret_source import joined, read_secret

DIRECTIONS = ("out", "in", "both")
EVENTS = (
    "message.publish",
    "client.connected",
    "client.disconnected",
    "session.expired",
    "message.dropped",
)


class SettingsError(ValueError):
    """A bad value; the message starts with the key it is about."""


@dataclass(slots=True)
class TopicRule:
    filter: str
    direction: str = "out"
    qos: int = 1
    local_prefix: str = ""
    remote_prefix: str = ""

    @property
    def local_filter(self) -> str:
        return self.local_prefix + self.filter

    @property
    def remote_filter(self) -> str:
        return self.remote_prefix + self.filter


@dataclass(slots=True)
class BridgeConfig:
    name: str
    host: str
    port: int
    protocol: str = "5"
    client_id: str = ""
    username: str | None = None
    password: bytes | None = field(default=None, repr=False)
    tls: bool = False
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_server_name: str = ""
    insecure: bool = False
    session_expiry: int = 3600
    keep_alive: int = 60
    # The bridge's own outbound queue: not [broker] max_queued_messages (a client's session).
    max_queued_messages: int = 100_000
    max_queued_bytes: int = 64 * 1_048_576
    topics: list[TopicRule] = field(default_factory=list)


@dataclass(slots=True)
class WebhookConfig:
    """A ``[[webhook]]`` section. Its fields' defaults are the keys' defaults (parse_webhook
    reads each key with the field's default). ``url`` and ``secret`` stay out of the repr: the
    URL may hold a password or a token (show ``webhooks.redact_url(url)``)."""

    name: str
    url: str = field(repr=False)
    topics: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    format: str = "json"
    secret: bytes | None = field(default=None, repr=False)
    max_attempts: int = 10
    timeout: float = 10.0
    concurrency: int = 4
    max_queued: int = 100_000
    retry_delay: float = 1.0
    retry_max_delay: float = 300.0
    dead_letter_topic: str = ""


_BRIDGE_KEYS = (
    "name address protocol client_id username password_file password_env tls tls_ca_file "
    "tls_cert_file tls_key_file tls_server_name insecure session_expiry keep_alive "
    "max_queued_messages max_queued_bytes topic"
).split()
_TOPIC_KEYS = ("filter", "direction", "qos", "local_prefix", "remote_prefix")
_WEBHOOK_KEYS = (
    "name url topics events format secret_file secret_env max_attempts timeout concurrency "
    "max_queued retry_delay retry_max_delay dead_letter_topic"
).split()


def _get(table: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = table.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if value is not None and (
        not isinstance(value, kind) or (kind is int and isinstance(value, bool))
    ):
        names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        raise SettingsError(f"{key}: expected {names.get(kind, kind.__name__)}, got {value!r}")
    return value


def _unknown(table: dict[str, Any], known: tuple[str, ...] | list[str]) -> None:
    for key in table:
        if key not in known:
            raise SettingsError(f"{key}: unknown key (known keys: {', '.join(sorted(known))})")


def _secret(table: dict[str, Any], prefix: str) -> bytes | None:
    """``<prefix>_file`` or ``<prefix>_env`` (see :mod:`mqttbroker.secret_source`)."""
    path = _get(table, f"{prefix}_file", str, "")
    env = _get(table, f"{prefix}_env", str, "")
    return read_secret(path, env, prefix, joined(SettingsError))


def _name(table: dict[str, Any], seen: set[str]) -> str:
    name: str | None = _get(table, "name", str, None)
    if not name:
        raise SettingsError("name: required (it names the integration in logs and $SYS)")
    if "/" in name or "+" in name or "#" in name or not valid_topic_name(name):
        raise SettingsError(f"name: {name!r} may not contain '/', '+' or '#'")
    if name in seen:
        raise SettingsError(f"name: {name!r} is used twice")
    seen.add(name)
    return name


def _positive(value: int | float, key: str, minimum: int | float = 1) -> None:
    if value < minimum:
        raise SettingsError(f"{key}: must be at least {minimum}, got {value!r}")


def parse_bridge(table: dict[str, Any], seen: set[str]) -> BridgeConfig:
    _unknown(table, _BRIDGE_KEYS)
    name = _name(table, seen)
    address = _get(table, "address", str, None)
    if not address:
        raise SettingsError('address: required ("host:port")')
    host, colon, port_text = address.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise SettingsError(f'address: expected "host:port", got {address!r}')
    protocol = _get(table, "protocol", str, "5")
    if protocol not in ("5", "3.1.1"):
        raise SettingsError(f'protocol: expected "5" or "3.1.1", got {protocol!r}')
    cfg = BridgeConfig(name, host, int(port_text), protocol)
    cfg.client_id = _get(table, "client_id", str, "") or f"{socket.gethostname()}-bridge-{name}"
    cfg.username = _get(table, "username", str, None) or None  # "": no user name
    cfg.password = _secret(table, "password")
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name"):
        setattr(cfg, key, _get(table, key, str, ""))
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        path = getattr(cfg, key)
        if path and not os.path.isfile(path):
            raise SettingsError(f"{key}: file not found: {path}")
    if cfg.tls_key_file and not cfg.tls_cert_file:
        raise SettingsError("tls_key_file: needs tls_cert_file (the client certificate)")
    cfg.insecure = _get(table, "insecure", bool, False)
    cfg.tls = _get(table, "tls", bool, False) or bool(
        cfg.tls_ca_file or cfg.tls_cert_file or cfg.tls_server_name or cfg.insecure
    )
    cfg.session_expiry = _get(table, "session_expiry", int, cfg.session_expiry)
    if not 0 <= cfg.session_expiry <= 0xFFFFFFFF:
        raise SettingsError("session_expiry: must be between 0 and 4294967295")
    cfg.keep_alive = _get(table, "keep_alive", int, cfg.keep_alive)
    if not 0 < cfg.keep_alive <= 65535:
        raise SettingsError("keep_alive: must be between 1 and 65535")
    cfg.max_queued_messages = _get(table, "max_queued_messages", int, cfg.max_queued_messages)
    _positive(cfg.max_queued_messages, "max_queued_messages")
    cfg.max_queued_bytes = _get(table, "max_queued_bytes", int, cfg.max_queued_bytes)
    _positive(cfg.max_queued_bytes, "max_queued_bytes")
    rules = table.get("topic", [])
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules) or not rules:
        raise SettingsError("topic: expected one or more [[bridge.topic]] tables")
    for index, rule in enumerate(rules):
        try:
            cfg.topics.append(_parse_rule(rule))
        except SettingsError as exc:
            raise SettingsError(f"topic[{index}].{exc}") from None
    return cfg


def _parse_rule(table: dict[str, Any]) -> TopicRule:
    _unknown(table, _TOPIC_KEYS)
    topic_filter = _get(table, "filter", str, None)
    if topic_filter is None:
        raise SettingsError('filter: required (e.g. "sensors/#")')
    rule = TopicRule(topic_filter)
    rule.direction = _get(table, "direction", str, "out")
    if rule.direction not in DIRECTIONS:
        raise SettingsError(f'direction: expected "out", "in" or "both", got {rule.direction!r}')
    rule.qos = _get(table, "qos", int, 1)
    if rule.qos not in (0, 1, 2):
        raise SettingsError(f"qos: expected 0, 1 or 2, got {rule.qos!r}")
    rule.local_prefix = _get(table, "local_prefix", str, "")
    rule.remote_prefix = _get(table, "remote_prefix", str, "")
    for key, prefix in (("local_prefix", rule.local_prefix), ("remote_prefix", rule.remote_prefix)):
        if "+" in prefix or "#" in prefix:
            raise SettingsError(f"{key}: may not contain wildcards, got {prefix!r}")
    if not valid_topic_filter(rule.local_filter) or not valid_topic_filter(rule.remote_filter):
        raise SettingsError(
            f"filter: {topic_filter!r} is not a valid topic filter with its prefixes "
            "('#' only as the last level, '+' alone in its level)"
        )
    return rule


def parse_webhook(table: dict[str, Any], seen: set[str]) -> WebhookConfig:
    _unknown(table, _WEBHOOK_KEYS)
    name = _name(table, seen)
    url = _get(table, "url", str, None)
    if not url:
        raise SettingsError("url: required")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SettingsError(f"url: expected an http:// or https:// URL, got {url!r}")
    cfg = WebhookConfig(name, url)
    topics = _get(table, "topics", list, [])
    for index, topic_filter in enumerate(topics):
        if not isinstance(topic_filter, str) or not valid_topic_filter(topic_filter):
            raise SettingsError(f"topics[{index}]: not a valid topic filter: {topic_filter!r}")
        if topic_filter.startswith("$event"):
            raise SettingsError(f"topics[{index}]: $event/ topics are reserved for events")
    cfg.topics = list(topics)
    events = _get(table, "events", list, ["message.publish"] if topics else [])
    for index, event in enumerate(events):
        if event not in EVENTS:
            raise SettingsError(f"events[{index}]: expected one of {', '.join(EVENTS)}")
    if "message.publish" in events and not topics:
        raise SettingsError('topics: "message.publish" needs topic filters')
    if not events:
        raise SettingsError("events: nothing to send (give topics and/or events)")
    cfg.events = list(events)
    cfg.format = _get(table, "format", str, cfg.format)
    if cfg.format not in ("json", "raw"):
        raise SettingsError(f'format: expected "json" or "raw", got {cfg.format!r}')
    cfg.secret = _secret(table, "secret")
    cfg.max_attempts = _get(table, "max_attempts", int, cfg.max_attempts)
    _positive(cfg.max_attempts, "max_attempts")
    cfg.timeout = _get(table, "timeout", float, cfg.timeout)
    _positive(cfg.timeout, "timeout", 0.001)
    cfg.concurrency = _get(table, "concurrency", int, cfg.concurrency)
    _positive(cfg.concurrency, "concurrency")
    cfg.max_queued = _get(table, "max_queued", int, cfg.max_queued)
    _positive(cfg.max_queued, "max_queued")
    cfg.retry_delay = _get(table, "retry_delay", float, cfg.retry_delay)
    _positive(cfg.retry_delay, "retry_delay", 0.001)
    cfg.retry_max_delay = _get(table, "retry_max_delay", float, cfg.retry_max_delay)
    _positive(cfg.retry_max_delay, "retry_max_delay", cfg.retry_delay)
    cfg.dead_letter_topic = _get(table, "dead_letter_topic", str, cfg.dead_letter_topic)
    if cfg.dead_letter_topic and not valid_topic_name(cfg.dead_letter_topic):
        raise SettingsError(f"dead_letter_topic: not a valid topic name: {cfg.dead_letter_topic!r}")
    return cfg


def parse(kind: str, value: Any, source: str) -> list[Any]:
    """The ``[[bridge]]`` or ``[[webhook]]`` array of tables; ValueError "file: key: why"."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise SettingsError(f"{source}: {kind}: expected an array of tables [[{kind}]]")
    seen: set[str] = set()
    parsed = []
    for index, table in enumerate(value):
        try:
            parsed.append((parse_bridge if kind == "bridge" else parse_webhook)(table, seen))
        except SettingsError as exc:
            raise SettingsError(f"{source}: {kind}[{index}].{exc}") from None
    return parsed

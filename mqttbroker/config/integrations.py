"""The ``[[bridge]]`` and ``[[webhook]]`` tables, read and checked at start: every error names
the file and the key (``mqttbroker.toml: bridge[0].topic[1].direction: ...``). Their secrets
(a bridge's password, a webhook's signing key) are read here, from a file or a variable."""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

from ..broker.topics import valid_topic_filter, valid_topic_name
from .errors import ConfigError
from .keys import files_exist, secret, tables_of, values
from .sections import BRIDGE_DIRECTIONS, WEBHOOK_EVENTS, BridgeConfig, TopicRule, WebhookConfig

# Keys that are not fields of their class: they give a DERIVED field (topic: TopicRule tables).
EXTRA_KEYS: dict[str, dict[str, type]] = {
    "bridge": {"address": str, "password_file": str, "password_env": str, "topic": object},
    "webhook": {"secret_file": str, "secret_env": str},
}


def parse(kind: str, value: Any, source: str) -> list[Any]:
    """The ``[[bridge]]`` or ``[[webhook]]`` array of tables of ``source``."""
    tables = tables_of(value, f"{source}: {kind}", kind)
    read = _bridge if kind == "bridge" else _webhook
    seen: set[str] = set()
    return [read(table, seen, f"{source}: {kind}[{index}].") for index, table in enumerate(tables)]


def _name(table: dict[str, Any], seen: set[str], prefix: str) -> str:
    """The required, unique ``name`` (a topic level of $SYS/broker/bridges/<name>)."""
    name: str = table.get("name", "")
    if not name:
        raise ConfigError(f"{prefix}name: required (it names the integration in logs and $SYS)")
    if "/" in name or "+" in name or "#" in name or not valid_topic_name(name):
        raise ConfigError(f"{prefix}name: {name!r} may not contain '/', '+' or '#'")
    if name in seen:
        raise ConfigError(f"{prefix}name: {name!r} is used twice")
    seen.add(name)
    return name


def _at_least(section: Any, key: str, prefix: str, minimum: float = 1) -> None:
    value = getattr(section, key)
    if value < minimum:
        raise ConfigError(f"{prefix}{key}: must be at least {minimum}, got {value!r}")


def _bridge(table: dict[str, Any], seen: set[str], prefix: str) -> BridgeConfig:
    given = values(BridgeConfig, table, prefix, EXTRA_KEYS["bridge"])
    _name(given, seen, prefix)
    address = given.pop("address", "")
    if not address:
        raise ConfigError(f'{prefix}address: required ("host:port")')
    host, colon, port = address.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f'{prefix}address: expected "host:port", got {address!r}')
    rules = given.pop("topic", None)
    password = secret(given, "password", prefix)
    given.pop("password_file", None)
    given.pop("password_env", None)
    bridge = BridgeConfig(**given, host=host, port=int(port), password=password)
    if bridge.protocol not in ("5", "3.1.1"):
        raise ConfigError(f'{prefix}protocol: expected "5" or "3.1.1", got {bridge.protocol!r}')
    bridge.client_id = bridge.client_id or f"{socket.gethostname()}-bridge-{bridge.name}"
    bridge.username = bridge.username or None  # "": no user name
    files_exist(bridge, ("tls_ca_file", "tls_cert_file", "tls_key_file"), prefix)
    if bridge.tls_key_file and not bridge.tls_cert_file:
        raise ConfigError(f"{prefix}tls_key_file: needs tls_cert_file (the client certificate)")
    bridge.tls = bridge.tls or bool(
        bridge.tls_ca_file or bridge.tls_cert_file or bridge.tls_server_name or bridge.insecure
    )
    if not 0 <= bridge.session_expiry <= 0xFFFFFFFF:
        raise ConfigError(f"{prefix}session_expiry: must be between 0 and 4294967295")
    if not 0 < bridge.keep_alive <= 65535:
        raise ConfigError(f"{prefix}keep_alive: must be between 1 and 65535")
    _at_least(bridge, "max_queued_messages", prefix)
    _at_least(bridge, "max_queued_bytes", prefix)
    if not rules:
        raise ConfigError(f"{prefix}topic: expected one or more [[bridge.topic]] tables")
    rules = tables_of(rules, f"{prefix}topic", "bridge.topic")
    bridge.topics = [_rule(rule, f"{prefix}topic[{i}].") for i, rule in enumerate(rules)]
    return bridge


def _rule(table: dict[str, Any], prefix: str) -> TopicRule:
    given = values(TopicRule, table, prefix)
    if "filter" not in given:
        raise ConfigError(f'{prefix}filter: required (e.g. "sensors/#")')
    rule = TopicRule(**given)
    if rule.direction not in BRIDGE_DIRECTIONS:
        raise ConfigError(
            f'{prefix}direction: expected "out", "in" or "both", got {rule.direction!r}'
        )
    if rule.qos not in (0, 1, 2):
        raise ConfigError(f"{prefix}qos: expected 0, 1 or 2, got {rule.qos!r}")
    for key in ("local_prefix", "remote_prefix"):
        if "+" in getattr(rule, key) or "#" in getattr(rule, key):
            raise ConfigError(
                f"{prefix}{key}: may not contain wildcards, got {getattr(rule, key)!r}"
            )
    if not valid_topic_filter(rule.local_filter) or not valid_topic_filter(rule.remote_filter):
        raise ConfigError(
            f"{prefix}filter: {rule.filter!r} is not a valid topic filter with its prefixes "
            "('#' only as the last level, '+' alone in its level)"
        )
    return rule


def _webhook(table: dict[str, Any], seen: set[str], prefix: str) -> WebhookConfig:
    given = values(WebhookConfig, table, prefix, EXTRA_KEYS["webhook"])
    _name(given, seen, prefix)
    url = given.get("url")
    if not url:
        raise ConfigError(f"{prefix}url: required")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{prefix}url: expected an http:// or https:// URL, got {url!r}")
    signing_key = secret(given, "secret", prefix)
    given.pop("secret_file", None)
    given.pop("secret_env", None)
    hook = WebhookConfig(**given, secret=signing_key)
    for index, topic_filter in enumerate(hook.topics):
        if not valid_topic_filter(topic_filter):
            raise ConfigError(
                f"{prefix}topics[{index}]: not a valid topic filter: {topic_filter!r}"
            )
        if topic_filter.startswith("$event"):
            raise ConfigError(f"{prefix}topics[{index}]: $event/ topics are reserved for events")
    if "events" not in given and hook.topics:
        hook.events = ["message.publish"]
    for index, event in enumerate(hook.events):
        if event not in WEBHOOK_EVENTS:
            raise ConfigError(
                f"{prefix}events[{index}]: expected one of {', '.join(WEBHOOK_EVENTS)}"
            )
    if "message.publish" in hook.events and not hook.topics:
        raise ConfigError(f'{prefix}topics: "message.publish" needs topic filters')
    if not hook.events:
        raise ConfigError(f"{prefix}events: nothing to send (give topics and/or events)")
    if hook.format not in ("json", "raw"):
        raise ConfigError(f'{prefix}format: expected "json" or "raw", got {hook.format!r}')
    for key in ("max_attempts", "concurrency", "max_queued"):
        _at_least(hook, key, prefix)
    _at_least(hook, "timeout", prefix, 0.001)
    _at_least(hook, "retry_delay", prefix, 0.001)
    _at_least(hook, "retry_max_delay", prefix, hook.retry_delay)
    if hook.dead_letter_topic and not valid_topic_name(hook.dead_letter_topic):
        raise ConfigError(
            f"{prefix}dead_letter_topic: not a valid topic name: {hook.dead_letter_topic!r}"
        )
    return hook

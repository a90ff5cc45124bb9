"""Configuration: a TOML file (``--config``), overridden by command-line options.

Every error names the file and the key, e.g. ``config.toml: broker.max_packet_size: expected an
integer, got 'big'``. See ``config/mqttbroker.toml`` for every key with its default.

This package owns every key: ``sections`` declares the settings classes (one per table, each
field a key with its default), ``read`` reads a file into them, ``check`` checks the values.
The rest of the broker (security, integrations, the cluster, the server) takes these objects;
this package imports nothing of theirs, only the broker's own options and topic rules.
"""

from __future__ import annotations

from .check import (
    IPNetwork,
    check,
    configured_sources,
    is_loopback,
    redis_password,
    trusted_networks,
)
from .errors import ConfigError, StartError
from .read import from_table, load
from .sections import (
    ASYMMETRIC_ALGORITHMS,
    BRIDGE_DIRECTIONS,
    LOG_FORMATS,
    LOG_LEVELS,
    LOGIN_SOURCES,
    MAX_ITERATIONS,
    SYMMETRIC_ALGORITHMS,
    WEBHOOK_EVENTS,
    AdminConfig,
    AlertsConfig,
    BridgeConfig,
    ClusterConfig,
    Config,
    DynsecConfig,
    HttpAuthConfig,
    JwtConfig,
    ListenerConfig,
    SecurityConfig,
    StorageConfig,
    TopicRule,
    WebhookConfig,
)

__all__ = [
    "ASYMMETRIC_ALGORITHMS",
    "BRIDGE_DIRECTIONS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "LOGIN_SOURCES",
    "MAX_ITERATIONS",
    "SYMMETRIC_ALGORITHMS",
    "WEBHOOK_EVENTS",
    "AdminConfig",
    "AlertsConfig",
    "BridgeConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "DynsecConfig",
    "HttpAuthConfig",
    "IPNetwork",
    "JwtConfig",
    "ListenerConfig",
    "SecurityConfig",
    "StartError",
    "StorageConfig",
    "TopicRule",
    "WebhookConfig",
    "check",
    "configured_sources",
    "from_table",
    "is_loopback",
    "load",
    "redis_password",
    "trusted_networks",
]

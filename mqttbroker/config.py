"""Configuration: a TOML file (``--config``), overridden by command-line options.

Every error names the file and the key, e.g. ``config.toml: broker.max_packet_size: expected an
integer, got 'big'``. See ``config/mqttbroker.toml`` for every key with its default.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .broker.options import BrokerOptions

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class ConfigError(Exception):
    """A configuration problem; the message names the file and the key."""


@dataclass(slots=True)
class ListenerConfig:
    host: str = "127.0.0.1"
    port: int = 1883


@dataclass(slots=True)
class StorageConfig:
    # "sqlite": sessions, queues and retained messages survive restarts and crashes.
    # "memory": nothing is written; a restart starts empty.
    backend: str = "sqlite"
    # Database file; relative paths are under data_dir. Default: <data_dir>/mqttbroker.db
    path: str = "mqttbroker.db"
    # SQLite synchronous level: "full" survives power loss, "normal" survives a process crash
    # (kill -9) but may lose the last commits on power loss, "off" trusts the OS entirely.
    sync: str = "full"
    # A damaged database: "move" it aside and start empty, or "refuse" to start.
    on_corrupt: str = "move"
    # Seconds to wait before each commit so more changes share it (0: commit as soon as the
    # previous commit ends; batching then follows the load by itself).
    commit_interval: float = 0.0


@dataclass(slots=True)
class Config:
    listeners: list[ListenerConfig] = field(default_factory=lambda: [ListenerConfig()])
    broker: BrokerOptions = field(default_factory=BrokerOptions)
    storage: StorageConfig = field(default_factory=StorageConfig)
    data_dir: str = "./data"
    log_level: str = "info"

    @property
    def store_path(self) -> Path:
        return Path(self.data_dir) / self.storage.path


def _typed(value: Any, expected: type, where: str) -> Any:
    """Check a TOML value against a dataclass field's type (bool is not an int here)."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is int and isinstance(value, bool):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if not isinstance(value, expected):
        names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        raise ConfigError(
            f"{where}: expected {names.get(expected, expected.__name__)}, got {value!r}"
        )
    return value


def _fill(target: Any, table: dict[str, Any], prefix: str, source: str) -> None:
    types = {f.name: f.type for f in dataclasses.fields(target)}
    py_types = {"int": int, "float": float, "bool": bool, "str": str}
    for key, value in table.items():
        where = f"{source}: {prefix}{key}"
        if key not in types:
            known = ", ".join(sorted(types))
            raise ConfigError(f"{where}: unknown key (known keys: {known})")
        expected = py_types.get(str(types[key]), object)
        setattr(target, key, _typed(value, expected, where))


def load(path: str | Path | None) -> Config:
    """Read ``path`` (None: the defaults)."""
    config = Config()
    if path is None:
        return config
    source = str(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{source}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
    for key, value in data.items():
        if key in ("broker", "storage"):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {key}: expected a table [{key}]")
            _fill(getattr(config, key), value, f"{key}.", source)
        elif key == "listener":
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise ConfigError(f"{source}: listener: expected an array of tables [[listener]]")
            config.listeners = []
            for index, table in enumerate(value):
                listener = ListenerConfig()
                _fill(listener, table, f"listener[{index}].", source)
                config.listeners.append(listener)
        elif key in ("data_dir", "log_level"):
            setattr(config, key, _typed(value, str, f"{source}: {key}"))
        else:
            raise ConfigError(
                f"{source}: {key}: unknown key "
                "(known: broker, storage, listener, data_dir, log_level)"
            )
    check(config, source)
    return config


def check(config: Config, source: str = "command line") -> None:
    if config.log_level.lower() not in LOG_LEVELS:
        raise ConfigError(f"{source}: log_level: expected one of {', '.join(LOG_LEVELS)}")
    for index, listener in enumerate(config.listeners):
        if not 0 <= listener.port <= 65535:
            raise ConfigError(f"{source}: listener[{index}].port: must be between 0 and 65535")
    storage = config.storage
    if storage.backend not in ("sqlite", "memory"):
        raise ConfigError(f'{source}: storage.backend: expected "sqlite" or "memory"')
    if storage.sync not in ("full", "normal", "off"):
        raise ConfigError(f'{source}: storage.sync: expected "full", "normal" or "off"')
    if storage.on_corrupt not in ("move", "refuse"):
        raise ConfigError(f'{source}: storage.on_corrupt: expected "move" or "refuse"')
    if storage.commit_interval < 0:
        raise ConfigError(f"{source}: storage.commit_interval: must not be negative")
    try:
        config.broker.check()
    except ValueError as exc:
        raise ConfigError(f"{source}: broker.{exc}") from None

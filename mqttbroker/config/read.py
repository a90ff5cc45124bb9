"""Reading a TOML file (``--config``) into a :class:`Config`, then checking it."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import Any

from . import integrations
from .check import check
from .errors import ConfigError
from .keys import table_of, tables_of, values
from .sections import LOG_LEVELS, Config, ListenerConfig

# The tables [name] and their settings classes: the fields of Config that hold one.
TABLES: dict[str, Any] = {
    f.name: f.default_factory
    for f in dataclasses.fields(Config)
    if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory)
}
# The top level's keys that are not Config's plain fields: tables and arrays of tables.
_NESTED = {**{name: dict for name in TABLES}, "listener": list, "bridge": list, "webhook": list}
_NESTED_TYPES = {name: object for name in _NESTED} | {"log_levels": object}


def load(path: str | Path | None) -> Config:
    """Read ``path`` (None: the defaults)."""
    if path is None:
        return Config()
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
    return from_table(data, source, Path(os.path.abspath(path)).parent)


def from_table(data: dict[str, Any], source: str, directory: Path) -> Config:
    """The Config of a parsed TOML document (or of a converted Mosquitto configuration, see
    mosquitto_conf.py); ``source`` names it in errors, ``data_dir`` is relative to
    ``directory``."""
    given = values(Config, data, f"{source}: ", _NESTED_TYPES)
    nested = {key: given.pop(key) for key in _NESTED if key in given}
    levels = given.pop("log_levels", None)
    if "data_dir" in given:  # relative to the file's directory, not the working directory
        given["data_dir"] = os.path.normpath(os.path.join(directory, given["data_dir"]))
    config = Config(**given)
    if levels is not None:
        config.log_levels = _log_levels(levels, source)
    for key, value in nested.items():
        where = f"{source}: {key}"
        if key in TABLES:
            table = table_of(value, where, key)
            setattr(config, key, TABLES[key](**values(TABLES[key], table, f"{where}.")))
        elif key == "listener":
            tables = tables_of(value, where, key)
            config.listeners = [
                ListenerConfig(**values(ListenerConfig, table, f"{where}[{index}]."))
                for index, table in enumerate(tables)
            ]
        else:
            setattr(config, key + "s", integrations.parse(key, value, source))
    if config.busy_poll_us and "gather_us" not in data:
        config.gather_us = 0  # the one spins where the other sleeps
    check(config, source)
    return config


def _log_levels(value: Any, source: str) -> dict[str, str]:
    """``log_levels = { aiosqlite = "debug" }``: logger name -> level."""
    if not isinstance(value, dict):
        raise ConfigError(
            f'{source}: log_levels: expected a table of logger = level, e.g. {{ aiosqlite = "debug" }}'
        )
    levels = {}
    for name, level in value.items():
        if not isinstance(level, str) or level.lower() not in LOG_LEVELS:
            raise ConfigError(
                f"{source}: log_levels.{name}: expected one of {', '.join(LOG_LEVELS)}, "
                f"got {level!r}"
            )
        levels[name] = level.lower()
    return levels

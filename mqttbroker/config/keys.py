"""Reading one table's keys into its settings class: the keys are the class's fields (those
not marked ``DERIVED``), their types the fields' types, their defaults the fields' defaults. Every
table of the configuration is read this way, so each key has one reader and one default."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..secret_source import joined, read_secret
from .errors import ConfigError

# A field's annotation (its text, or with a compiled class the type itself) -> the TOML type.
_TYPES: dict[str, type] = {
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "bool | None": bool,
    "int | None": int,
    "str | None": str,
    "list[str]": list,
    "tuple[str, ...]": tuple,
}
_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def suggest(key: str, known: Iterable[str]) -> str:
    """What an unknown key's error adds: the likely key meant ("did you mean max_packet_size?"),
    else the keys there are."""
    names = sorted(known)
    close = difflib.get_close_matches(key, names, n=1)
    if close:
        return f"did you mean {close[0]}?"
    return f"known keys: {', '.join(names)}"


def typed(value: Any, expected: type, where: str) -> Any:
    """A TOML value checked against a key's type (bool is not an int here; a list of strings
    for list and tuple)."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected in (list, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        return expected(value)
    if expected is int and isinstance(value, bool):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if not isinstance(value, expected):
        name = _NAMES.get(expected, expected.__name__)
        raise ConfigError(f"{where}: expected {name}, got {value!r}")
    return value


def key_types(cls: Any) -> dict[str, type]:
    """The keys of ``cls``'s table and their types."""
    types = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("derived"):
            continue
        declared = f.type
        name = declared if isinstance(declared, str) else getattr(declared, "__name__", None)
        types[f.name] = _TYPES.get(name or str(declared), object)
    return types


def values(
    cls: Any, table: Mapping[str, Any], prefix: str, extra: Mapping[str, type] | None = None
) -> dict[str, Any]:
    """``table``'s values by key, each checked; ``prefix`` names the table in errors
    ("file: broker."), ``extra`` adds keys that are not fields (name -> type)."""
    types = key_types(cls)
    if extra:
        types.update(extra)
    checked = {}
    for key, value in table.items():
        where = f"{prefix}{key}"
        if key not in types:
            raise ConfigError(f"{where}: unknown key; {suggest(key, types)}")
        checked[key] = typed(value, types[key], where)
    return checked


def table_of(value: Any, where: str, name: str) -> dict[str, Any]:
    """``value`` if it is a table, else an error naming it ``[name]``."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table [{name}]")
    return value


def tables_of(value: Any, where: str, name: str) -> list[dict[str, Any]]:
    """``value`` if it is an array of tables, else an error naming it ``[[name]]``."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{where}: expected an array of tables [[{name}]]")
    return value


def files_exist(section: Any, keys: Iterable[str], prefix: str) -> None:
    """Each of ``keys`` of ``section`` that is set names a file that exists."""
    for key in keys:
        path = getattr(section, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"{prefix}{key}: file not found: {path}")


def one_source(section: Any, key: str, prefix: str) -> None:
    """A secret given by ``<key>_file`` or ``<key>_env``, not both (the message is
    :func:`~mqttbroker.secret_source.read_secret`'s)."""
    if getattr(section, f"{key}_file") and getattr(section, f"{key}_env"):
        raise ConfigError(f"{prefix}{key}_env: {key}_file is set too; choose one")


def secret(table: Mapping[str, Any], key: str, prefix: str) -> bytes | None:
    """The secret of ``<key>_file`` or ``<key>_env`` (see :mod:`mqttbroker.secret_source`)."""
    file, env = table.get(f"{key}_file", ""), table.get(f"{key}_env", "")
    return read_secret(file, env, f"{prefix}{key}", joined(ConfigError))

"""Mosquitto's configuration file (``mosquitto.conf``), read for this broker.

``mqttbroker --mosquitto-conf /etc/mosquitto/mosquitto.conf`` runs with it;
``mqttbroker convert-config /etc/mosquitto/mosquitto.conf`` prints the equivalent TOML. Both name,
with file and line, every directive that is not carried over, so that nothing is silently
dropped.

Carried over: listeners (``listener PORT [ADDRESS]``, the old global ``port`` and
``bind_address``, ``protocol websockets``, ``certfile``/``keyfile``/``cafile``,
``require_certificate``, ``use_identity_as_username``, ``tls_version``, ``ciphers``),
``allow_anonymous``, ``password_file``, ``acl_file``, the ``max_*`` limits with an equivalent here, ``retain_available``,
``persistence`` and ``persistence_location``, ``sys_interval``, ``include_dir`` (its ``*.conf``
files, in order), and bridges (``connection``, ``address``, ``topic``, ``remote_clientid``,
``remote_username``, ``bridge_protocol_version``, ``bridge_cafile``/``certfile``/``keyfile``) as
``[[bridge]]`` sections. Directives that change nothing here (``log_dest``, ``log_type``,
``pid_file``...) are named as ignored.

With ``per_listener_settings true`` each listener's ``allow_anonymous`` is its own (absent:
refused, Mosquitto 2's default). This broker has one password file and one ACL file for every
listener, so the listeners must name the same ones (or none), as Mosquitto would check each
listener's clients against that listener's own files; otherwise the configuration is refused,
naming the file and line. A security directive before the first ``listener`` is Mosquitto's
default listener's (port 1883 on every interface, or the old ``port``/``bind_address``): it is
kept for that listener when there is one (a ``port`` line, or no ``listener`` line at all), and
refused when only ``listener`` lines follow, since it is not theirs.

Mosquitto's ACL semantics are kept: its ``acl_file`` is read as it is, and a subscription that a
``topic deny`` reaches only in part is granted with the denied topics withheld (the default
``acl_partly_denied = "filter"``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import Config, ConfigError, from_table

# Global directives: name -> (table, key, kind). kind: "int", "bool", "str", "path".
_GLOBAL: dict[str, tuple[str, str, str]] = {
    "max_packet_size": ("broker", "max_packet_size", "int"),
    "max_inflight_messages": ("broker", "max_inflight", "int"),
    "max_queued_messages": ("broker", "max_queued_messages", "int"),
    "max_queued_bytes": ("broker", "max_queued_bytes", "int"),
    "max_keepalive": ("broker", "max_keepalive", "int"),
    "max_qos": ("broker", "maximum_qos", "int"),
    "max_topic_alias": ("broker", "topic_alias_maximum", "int"),
    "retain_available": ("broker", "retain_available", "bool"),
    "queue_qos0_messages": ("broker", "queue_qos0", "bool"),
    "sys_interval": ("broker", "sys_interval", "int"),
}
# Security directives: for all listeners, or with ``per_listener_settings true`` for the listener
# they follow (the same name in [security], or allow_anonymous in [[listener]]).
_SECURITY = ("allow_anonymous", "password_file", "acl_file")
# Listener directives: name -> (key, kind).
_LISTENER: dict[str, tuple[str, str]] = {
    "certfile": ("tls_cert_file", "path"),
    "keyfile": ("tls_key_file", "path"),
    "cafile": ("tls_ca_file", "path"),
    "require_certificate": ("tls_require_certificate", "bool"),
    "ciphers": ("tls_ciphers", "str"),
}
# Directives with no effect here (the broker logs to stderr, runs as the user that starts it).
_IGNORED = {
    "log_dest": "the broker logs to stderr (use the service manager's journal)",
    "log_type": "log detail is set with log_level",
    "log_timestamp": "log lines always carry a timestamp",
    "log_timestamp_format": "log lines always carry a timestamp",
    "connection_messages": "connections are always logged",
    "pid_file": "run it under a service manager",
    "user": "run it as the user it should run as",
    "autosave_interval": "every change is committed to the store",
    "autosave_on_changes": "every change is committed to the store",
    "persistence_file": "the store's file is <data_dir>/mqttbroker.db",
}
# Directives without an equivalent here, but with a key that comes close: name -> what to say.
_CLOSE = {
    "message_size_limit": (
        "no equivalent: Mosquitto drops a message whose payload is larger and completes its QoS "
        "flow, the client staying connected; the closest here is [broker] max_packet_size, the "
        "largest packet a client may send (payload, topic and headers), past which the client "
        "is disconnected (0x95)"
    ),
}
# Directives that belong to the bridge a "connection" line started.
_BRIDGE_WORDS = {
    "address",
    "addresses",
    "topic",
    "cleansession",
    "keepalive_interval",
    "notifications",
    "start_type",
    "try_private",
}
_BRIDGE_PROTOCOLS = {"mqttv50": "5", "mqttv311": "3.1.1", "mqttv31": "3.1.1"}


@dataclass
class Conversion:
    """A Mosquitto configuration read as this broker's: the TOML tables, and each directive not
    carried over, as "FILE:LINE: DIRECTIVE: why"."""

    tables: dict[str, Any] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def toml(self) -> str:
        """The equivalent TOML configuration, the directives not carried over as comments."""
        lines = ["# Converted from a Mosquitto configuration by mqttbroker convert-config."]
        for note in self.unsupported:
            lines.append(f"# NOT SUPPORTED: {note}")
        for note in self.ignored:
            lines.append(f"# ignored: {note}")
        for key, value in self.tables.items():
            if not isinstance(value, (dict, list)):
                lines.append(f"{key} = {_value(value)}")
        for key, value in self.tables.items():
            if isinstance(value, dict):
                lines += ["", f"[{key}]"] + [f"{k} = {_value(v)}" for k, v in value.items()]
            elif isinstance(value, list):
                for table in value:
                    lines += ["", f"[[{key}]]"]
                    nested = []
                    for k, v in table.items():
                        if isinstance(v, list):
                            nested.append((k, v))
                        else:
                            lines.append(f"{k} = {_value(v)}")
                    for k, rows in nested:
                        for row in rows:
                            lines += ["", f"[[{key}.{k}]]"]
                            lines += [f"{rk} = {_value(rv)}" for rk, rv in row.items()]
        return "\n".join(lines) + "\n"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # a TOML basic string is a JSON string


def bridges_supported() -> bool:
    """Whether this build runs ``[[bridge]]`` sections."""
    return any(f.name == "bridges" for f in dataclasses.fields(Config))


class _Reader:
    def __init__(self) -> None:
        self.out = Conversion()
        self.listeners: list[dict[str, Any]] = []
        self.default: dict[str, Any] | None = None  # the old global port / bind_address one
        self.current: dict[str, Any] | None = None  # the listener the next lines configure
        self.bridge: dict[str, Any] | None = None
        self.per_listener = False
        self.anonymous: list[bool] = []  # allow_anonymous lines without per_listener_settings
        self.security_seen = ""  # where the first security directive was (per_listener_settings)
        self.last_listener: dict[str, Any] | None = None  # the last `listener` line's
        # per_listener_settings true: security settings before any listener (name, value,
        # where), the default listener's: given to it at the end, if there is one (finish)
        self.early: list[tuple[str, bool | str, str]] = []
        # per_listener_settings true: each listener's password_file / acl_file, with where the
        # directive was, and where each listener was declared (keys: id of its table)
        self.files: dict[int, dict[str, tuple[str, str]]] = {}
        self.declared: dict[int, str] = {}

    def table(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.out.tables.setdefault(name, {})
        return found

    def read(self, path: Path, depth: int = 0) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not valid UTF-8") from None
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, _, rest = line.partition(" ")
            where = f"{path}:{number}"
            try:
                self.directive(name, rest.strip(), where, path, depth)
            except ValueError as exc:
                raise ConfigError(f"{where}: {name}: {exc}") from None

    def directive(self, name: str, rest: str, where: str, path: Path, depth: int) -> None:
        words = rest.split()
        if self.bridge is not None and (
            name.startswith(("bridge_", "remote_")) or name in _BRIDGE_WORDS
        ):
            self.bridge_directive(name, rest, words, where)
            return
        if name == "listener":
            if not words:
                raise ValueError("needs a port")
            listener = {"host": words[1] if len(words) > 1 else "0.0.0.0", "port": _int(words[0])}
            self.listeners.append(listener)
            self.current = self.last_listener = listener
            self.declared[id(listener)] = where
            self.bridge = None
        elif name in ("port", "bind_address"):
            if self.default is None:
                self.default = {"host": "0.0.0.0", "port": 1883}
                self.listeners.insert(0, self.default)
                self.declared[id(self.default)] = where
            if name == "port":
                self.default["port"] = _int(rest)
            else:
                self.default["host"] = rest
        elif name == "protocol":
            target = self.current or self.default
            if rest == "websockets" and target is not None:
                target["protocol"] = "ws"
            elif rest != "mqtt":
                raise ValueError(f'expected "mqtt" or "websockets", got {rest!r}')
        elif name in _LISTENER:
            key, kind = _LISTENER[name]
            self.listener_target(where)[key] = _convert(rest, kind, path)
        elif name == "use_identity_as_username":
            if _bool(rest):
                self.listener_target(where)["tls_certificate_username"] = "cn"
        elif name == "use_subject_as_username":
            self.out.unsupported.append(
                f"{where}: {name}: use use_identity_as_username (the certificate's CN)"
            )
        elif name == "tls_version":
            versions = {"tlsv1.2": "1.2", "tlsv1.3": "1.3"}
            if rest not in versions:
                raise ValueError('expected "tlsv1.2" or "tlsv1.3" (older versions are refused)')
            self.listener_target(where)["tls_min_version"] = versions[rest]
        elif name in _SECURITY:
            self.security_seen = self.security_seen or where
            if not self.per_listener:
                if name == "allow_anonymous":
                    self.anonymous.append(_bool(rest))
                else:
                    self.table("security")[name] = _convert(rest, "path", path)
                return
            owner = self.last_listener or self.default
            value = _bool(rest) if name == "allow_anonymous" else str(_convert(rest, "path", path))
            if owner is None:  # the default listener's, if there is one: see finish
                self.early.append((name, value, where))
            elif isinstance(value, bool):
                owner["allow_anonymous"] = value
            else:
                self.files.setdefault(id(owner), {})[name] = (value, where)
        elif name == "per_listener_settings":
            self.per_listener = _bool(rest)
            if self.per_listener and self.security_seen:
                raise ValueError(
                    "must come before every security setting (Mosquitto refuses it after one: "
                    f"{self.security_seen})"
                )
        elif name == "max_connections":
            count = _int(rest)
            self.table("broker")["max_connections"] = 0 if count < 0 else count
        elif name == "persistence":
            self.table("storage")["backend"] = "sqlite" if _bool(rest) else "memory"
        elif name == "persistence_location":
            self.out.tables["data_dir"] = _convert(rest, "path", path)
        elif name in _GLOBAL:
            section, key, kind = _GLOBAL[name]
            self.table(section)[key] = _convert(rest, kind, path)
        elif name == "include_dir":
            folder = Path(_convert(rest, "path", path))
            if depth > 8:
                raise ValueError("include_dir nested too deeply")
            for included in sorted(folder.glob("*.conf")):
                self.read(included, depth + 1)
        elif name == "connection":
            if not rest:
                raise ValueError("needs a name")
            self.bridge = {"name": rest, "topic": []}
            self.out.tables.setdefault("bridge", []).append(self.bridge)
            self.current = None
        elif name in _IGNORED:
            self.out.ignored.append(f"{where}: {name}: {_IGNORED[name]}")
        elif name in _CLOSE:
            self.out.unsupported.append(f"{where}: {name}: {_CLOSE[name]}")
        else:
            self.out.unsupported.append(f"{where}: {name}: no equivalent in this broker")

    def listener_target(self, where: str) -> dict[str, Any]:
        target = self.current or self.default
        if target is None:  # TLS settings before any listener: Mosquitto's default listener
            self.default = target = {"host": "0.0.0.0", "port": 1883}
            self.listeners.insert(0, target)
            self.declared[id(target)] = where
        return target

    def bridge_directive(self, name: str, rest: str, words: list[str], where: str) -> None:
        bridge = self.bridge
        assert bridge is not None
        if name in ("address", "addresses"):
            first = words[0] if words else ""
            if not first:
                raise ValueError("needs host[:port]")
            bridge["address"] = first if ":" in first else f"{first}:1883"
            if len(words) > 1:
                self.out.unsupported.append(
                    f"{where}: {name}: only the first address is used (no fail-over)"
                )
        elif name == "topic":
            if not words:
                raise ValueError("needs a pattern")
            rule: dict[str, Any] = {"filter": words[0]}
            if len(words) > 1:
                if words[1] not in ("in", "out", "both"):
                    raise ValueError(f'expected "in", "out" or "both", got {words[1]!r}')
                rule["direction"] = words[1]
            if len(words) > 2:
                rule["qos"] = _int(words[2])
            prefixes = [w.strip('"') for w in words[3:5]]
            if prefixes and prefixes[0]:
                rule["local_prefix"] = prefixes[0]
            if len(prefixes) > 1 and prefixes[1]:
                rule["remote_prefix"] = prefixes[1]
            bridge["topic"].append(rule)
        elif name == "remote_clientid":
            bridge["client_id"] = rest
        elif name == "remote_username":
            bridge["username"] = rest
        elif name == "bridge_protocol_version":
            if rest not in _BRIDGE_PROTOCOLS:
                raise ValueError(f"expected one of {', '.join(_BRIDGE_PROTOCOLS)}")
            bridge["protocol"] = _BRIDGE_PROTOCOLS[rest]
        elif name in ("bridge_cafile", "bridge_certfile", "bridge_keyfile"):
            bridge["tls"] = True
            bridge["tls_" + name.removeprefix("bridge_").replace("file", "_file")] = rest
        elif name == "remote_password":
            self.out.unsupported.append(
                f"{where}: {name}: put the password in a file (mode 0600) and set the "
                f"bridge's password_file"
            )
        else:
            self.out.unsupported.append(f"{where}: {name}: no equivalent for bridges here")

    def finish(self) -> Conversion:
        out = self.out
        if not self.listeners:
            self.default = {"host": "0.0.0.0", "port": 1883}  # Mosquitto's default listener
            self.listeners.append(self.default)
        if self.per_listener and self.early:
            self.give_early()
        if self.per_listener:
            for listener in self.listeners:
                # Mosquitto 2's default on each listener: no anonymous clients. (Mosquitto
                # 2.0.11 lets them onto its default listener, the one of `port`, when nothing
                # says otherwise, contrary to its documentation; that is not reproduced.)
                listener.setdefault("allow_anonymous", False)
            self.one_file_for_all("password_file")
            self.one_file_for_all("acl_file")
        else:
            # Mosquitto 2's default: no anonymous clients (ours: only on loopback listeners)
            self.table("security")["allow_anonymous"] = (
                self.anonymous[-1] if self.anonymous else False
            )
        out.tables["listener"] = self.listeners
        bridges = out.tables.get("bridge", [])
        for bridge in bridges:
            if "address" not in bridge:
                raise ConfigError(f"bridge {bridge['name']!r}: no address")
        if bridges and not bridges_supported():
            out.unsupported.append(
                f"connection ({', '.join(b['name'] for b in bridges)}): this build has no "
                "bridges; the [[bridge]] sections are shown, not run"
            )
        return out

    def give_early(self) -> None:
        """The security settings before any listener are Mosquitto's default listener's: the
        one of ``port``/``bind_address``, or the one it opens when no ``listener`` line
        follows. Settings given to it later win, as later lines do in Mosquitto."""
        owner = self.default
        if owner is None:
            name, _, where = self.early[0]
            raise ConfigError(
                f"{where}: {name}: with per_listener_settings true, a security setting before "
                "the first listener belongs to Mosquitto's default listener (port 1883 on every "
                "interface, which Mosquitto opens for a password_file even without a port "
                "line), not to the listeners below; move it under the listener it is for"
            )
        for name, value, where in self.early:
            if isinstance(value, bool):
                owner.setdefault("allow_anonymous", value)
            else:
                self.files.setdefault(id(owner), {}).setdefault(name, (value, where))

    def one_file_for_all(self, key: str) -> None:
        """``per_listener_settings true``: Mosquitto checks each listener's clients against that
        listener's own password (or ACL) file, and a listener without one has none. This broker
        has one file of each for every listener, so the listeners must all name the same one
        (or none); otherwise ConfigError names the directive that differs."""
        first = self.listeners[0]
        expected = self.files.get(id(first), {}).get(key)
        for listener in self.listeners[1:]:
            found = self.files.get(id(listener), {}).get(key)
            if _file(found) == _file(expected):
                continue
            where = found[1] if found else self.declared.get(id(listener), "")
            raise ConfigError(
                f"{where}: {key}: with per_listener_settings true Mosquitto checks the clients "
                f"of each listener against that listener's own {key} (listener "
                f"{_name(listener)}: {_file(found) or 'none'}; listener {_name(first)}: "
                f"{_file(expected) or 'none'}); this broker has one {key} for all listeners, "
                f"so this configuration cannot be carried over: give every listener the same "
                f"{key}, or run one broker per {key}"
            )
        if expected is not None:
            self.table("security")[key] = expected[0]


def _file(entry: tuple[str, str] | None) -> str:
    return entry[0] if entry else ""


def _name(listener: dict[str, Any]) -> str:
    return f"{listener['host']}:{listener['port']}"


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def _bool(text: str) -> bool:
    if text not in ("true", "false"):
        raise ValueError(f'expected "true" or "false", got {text!r}')
    return text == "true"


def _convert(text: str, kind: str, path: Path) -> Any:
    if kind == "int":
        return _int(text)
    if kind == "bool":
        return _bool(text)
    if not text:
        raise ValueError("needs a value")
    if kind == "path":
        return os.path.normpath(os.path.join(path.parent.absolute(), text))
    return text


def convert(path: str | Path) -> Conversion:
    """Read a Mosquitto configuration (ConfigError names the file, line and directive)."""
    reader = _Reader()
    reader.read(Path(path))
    return reader.finish()


def load(path: str | Path) -> tuple[Config, Conversion]:
    """The Config a Mosquitto configuration stands for, and what was not carried over."""
    conversion = convert(path)
    tables = dict(conversion.tables)
    if not bridges_supported():
        tables.pop("bridge", None)
    return from_table(tables, str(path), Path(path).parent), conversion

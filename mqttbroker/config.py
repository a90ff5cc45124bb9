"""Configuration: a TOML file (``--config``), overridden by command-line options.

Every error names the file and the key, e.g. ``config.toml: broker.max_packet_size: expected an
integer, got 'big'``. See ``config/mqttbroker.toml`` for every key with its default.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import re
import socket
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from .broker.options import BrokerOptions
from .secret_source import joined, read_secret_text

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")
MAX_BUSY_POLL_US = 1_000_000
MAX_GATHER_US = 10_000
MAX_FD_TABLE = 1 << 20  # Linux's default ceiling on any process's table (fs.nr_open)
MAX_WORKERS = 256
MAX_BACKLOG = 65535  # a listener's backlog (the kernel caps it lower: net.core.somaxconn)


class ConfigError(Exception):
    """A configuration problem; the message names the file and the key."""


@dataclass(slots=True)
class ListenerConfig:
    host: str = "127.0.0.1"
    port: int = 1883
    # "mqtt": MQTT over TCP (TLS with tls_cert_file); "ws": MQTT over WebSocket (wss with TLS).
    protocol: str = "mqtt"
    ws_path: str = "/mqtt"  # the HTTP path WebSocket clients connect to
    # TLS: a PEM certificate chain makes this a TLS listener; its private key is in
    # tls_key_file, or in tls_cert_file itself when that is empty.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_min_version: str = "1.2"  # "1.2" or "1.3"
    tls_ciphers: str = ""  # OpenSSL cipher list for TLS 1.2 ("": Python's secure defaults)
    # Mutual TLS: client certificates are verified against the CAs in tls_ca_file; with
    # tls_require_certificate a client without a valid certificate is refused in the handshake.
    tls_ca_file: str = ""
    tls_require_certificate: bool = False
    # "cn" or "san": a verified client certificate's Common Name (or first Subject Alternative
    # Name) is the connection's user name; "none": certificates only grant the connection.
    tls_certificate_username: str = "none"
    # Clients without a user name on this listener. Absent: [security] allow_anonymous, or
    # when that is absent too, allowed only if this listener binds to a loopback address.
    allow_anonymous: bool | None = None
    # "ws" behind a reverse proxy: comma-separated addresses or networks ("127.0.0.1, 10.0.0.0/8")
    # whose X-Forwarded-For header names the client. The address it names is the one logged and
    # counted against max_connections_per_address. "": the header is ignored.
    ws_trusted_proxies: str = ""
    # "mqtt" behind a TCP load balancer that sends the PROXY protocol header (v1 or v2):
    # comma-separated addresses or networks of the balancers. Only they may connect, each
    # connection must start with the header, and the client it names is the one logged and
    # counted against max_connections_per_address. With TLS, the balancer passes TLS through.
    proxy_protocol: str = ""
    # Connections the kernel completes and holds for the broker to accept. A connection storm
    # (thousands of devices reconnecting at once) past it has its SYNs dropped, and each such
    # client waits a second or more to retry. Linux caps it at net.core.somaxconn.
    backlog: int = 1024

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)

    @property
    def kind(self) -> str:
        """How the log names it: MQTT over TCP, TLS, WebSocket or WebSocket+TLS."""
        if self.protocol == "ws":
            return "MQTT over WebSocket+TLS" if self.tls else "MQTT over WebSocket"
        return "MQTT over TLS" if self.tls else "MQTT over TCP"


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
class SecurityConfig:
    # Password file (our format or mosquitto_passwd's; `mqttbroker passwd` writes it).
    # "": user names and passwords are not checked.
    password_file: str = ""
    # ACL file (Mosquitto's acl_file syntax, and more: see mqttbroker/security/acl.py).
    # "": every client may publish and subscribe anywhere; set: what it does not allow is denied.
    acl_file: str = ""
    # Clients without a user name (without a password file, with one too), on every listener
    # without its own allow_anonymous. Absent: each such listener allows them only if it is
    # local-only (binds to loopback, not behind a proxy).
    allow_anonymous: bool | None = None
    # Failed logins (bad passwords, failed SCRAM) from one address within login_failure_window
    # seconds before its logins are refused without a check (0x9F; one more try each
    # window / max_login_failures seconds); a user name with as many may then be tried only from
    # addresses without failed logins. 0: no limit.
    max_login_failures: int = 10
    login_failure_window: float = 300.0
    # Password-file entries hashed with fewer iterations are refused at load (file, line and
    # user named; a Mosquitto $6$ hash counts as 1). 0: none refused; below 4096 only warned.
    min_iterations: int = 0
    # The installation's secret (made if missing, mode 0600): unknown users' made-up SCRAM salts
    # stay the same across restarts. "": <data_dir>/auth-secret; with storage.backend = "memory"
    # (nothing on disk) one per process instead.
    secret_file: str = ""
    # A subscription whose filter an ACL deny rule matches only in part (`#` beside
    # `topic deny secret/x`): "filter" grants it and never delivers the denied topics through it
    # (as Mosquitto does); "refuse" refuses it (0x87).
    acl_partly_denied: str = "filter"
    # The order in which the login sources are asked: "password_file", "dynsec", "jwt",
    # "http" (each configured source once; mqttbroker/security/chain.py). Each answers allow,
    # deny or not mine; the first allow or deny decides. Empty: those configured, in the order
    # dynsec, password_file, jwt, http.
    chain: list[str] = field(default_factory=list)


@dataclass(slots=True)
class DynsecConfig:
    # Dynamic security, managed with `mosquitto_ctrl dynsec` (mqttbroker/security/dynsec.py).
    enabled: bool = False
    # Its state, Mosquitto's dynamic-security.json format. "": <data_dir>/dynamic-security.json
    # (with storage.backend = "memory": kept in memory only).
    file: str = ""
    # Where the state starts from when `file` does not exist yet: a dynamic-security.json, e.g.
    # one written by `mosquitto_ctrl dynsec init FILE admin` (its admin then works). "": empty.
    import_file: str = ""
    # PBKDF2-SHA-512 iterations for passwords set by commands (Mosquitto's plugin uses 101).
    iterations: int = 210_000


@dataclass(slots=True)
class ClusterConfig:
    # Redis URL ("redis://host:6379/0", "rediss://...", "unix:///path"): this broker is one node
    # of a cluster on that Redis. "": a single broker (Redis is never loaded).
    redis: str = ""
    # This node's name, unique in the cluster (letters, digits, "-", "_", ".", ":"); its stream
    # and routes are kept under it across restarts. "": the host name.
    node_id: str = ""
    # Entries kept in a node's Redis stream (approximately; an entry holds the QoS 1/2 messages
    # for that node of one write, up to about 64 KiB); past it the oldest are dropped, read or
    # not (a node down that long loses them).
    stream_max_length: int = 10_000
    # Seconds a node's lease lasts without renewal (renewed every third of it): a node killed
    # without stopping keeps its node_id this long.
    node_ttl: float = 10.0
    connect_timeout: float = 5.0  # seconds to reach Redis
    # Redis's password (requirepass, or an ACL user's: the user name goes in the URL), read from
    # this file (its trailing newline stripped) or from this environment variable, so that it
    # is not on the command line. Whoever can use that Redis controls the cluster (see README).
    # "": none, or the one in the URL.
    password_file: str = ""
    password_env: str = ""
    # Seconds a node may be gone (its lease expired, or stopped) before the other nodes adopt
    # its persistent sessions and the messages left for it; 0: only when one of its clients
    # connects to another node.
    adopt_after: float = 60.0


@dataclass(slots=True)
class AdminConfig:
    # The admin HTTP server (dashboard, /metrics, /api/v1, /healthz, /readyz). 0: off.
    host: str = "127.0.0.1"
    port: int = 18083
    # A bearer token, read from this file (first line) or from this environment variable; never
    # written in the configuration itself. Needed (or admin_users) unless host is loopback.
    token_file: str = ""
    token_env: str = ""
    # Comma-separated users of [security] password_file who may log in (HTTP Basic).
    admin_users: str = ""
    # TLS, as for listeners: a PEM certificate chain, and its key ("": in tls_cert_file).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # Comma-separated origins allowed to call the API from other sites (CORS). "": none.
    cors_origins: str = ""


@dataclass(slots=True)
class AlertsConfig:
    # Seconds a session's oldest queued message may wait before the session counts as stuck
    # (logged, counted, published under $SYS/broker/alerts/, flagged in the API). 0: off.
    oldest_queued_age: float = 60.0


@dataclass(slots=True)
class Config:
    listeners: list[ListenerConfig] = field(default_factory=lambda: [ListenerConfig()])
    broker: BrokerOptions = field(default_factory=BrokerOptions)
    storage: StorageConfig = field(default_factory=StorageConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    dynsec: DynsecConfig = field(default_factory=DynsecConfig)
    # [jwt] and [http_auth]: security/tokens.py TokenSettings, security/http_backend.py
    # HttpAuthSettings (frozen; read by _settings)
    jwt: Any = field(default_factory=lambda: _default_settings("jwt"))
    http_auth: Any = field(default_factory=lambda: _default_settings("http_auth"))
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    data_dir: str = "./data"  # in a config file: relative to the file's directory
    log_level: str = "info"
    # Levels of other loggers by name, e.g. {"aiosqlite": "debug"}. Loggers outside the broker's
    # own (aiosqlite, asyncio, aiohttp) are otherwise at info at most, even at log_level debug.
    log_levels: dict[str, str] = field(default_factory=dict)
    log_format: str = "text"  # "json": one object per line, for log shippers
    admin: AdminConfig = field(default_factory=AdminConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    # Allocations between two young-generation runs of Python's cycle collector (its default is
    # 700). Thousands of long-lived connection objects make each run costly: at 700 it took
    # about a fifth of the broker's CPU while 10,000 clients connected. 0 leaves Python's setting.
    gc_threshold: int = 10_000
    # Microseconds the event loop keeps polling, instead of sleeping, after a pass that sent
    # something (server/polling.py): lower latency for a core spinning meanwhile. 0: off.
    busy_poll_us: int = 0
    # Microseconds from the start of a loop pass that found two or more connections ready to
    # the next pass, at least: the loop sleeps for the rest, and the next pass reads what
    # arrived meanwhile (server/streams.py). Not after a pass that read a client the broker had
    # written to since its last read (it may be waiting for that answer: PUBACK, a reply).
    # Less CPU per message from many one-way senders, each of their messages delayed up to
    # this long; plain TCP listeners only. Off (0) when busy_poll_us is set and this is not.
    gather_us: int = 200
    # File descriptors the process's descriptor table is sized for at start, at most the
    # open-file limit (RLIMIT_NOFILE). Linux otherwise doubles the table as connections arrive,
    # and in a process with threads each doubling waits for an RCU grace period, the broker
    # stopped meanwhile: a few ms each time, about a third of the time a fresh broker took to
    # accept its first 5,000 clients. 16,384 descriptors take 128 KiB of kernel memory. 0: off.
    fd_table: int = 16_384
    # [[bridge]] and [[webhook]] sections (integrations/settings.py: BridgeConfig, WebhookConfig)
    bridges: list[Any] = field(default_factory=list)
    webhooks: list[Any] = field(default_factory=list)
    # Processes serving the same listeners (SO_REUSEPORT), each a node of the cluster on
    # [cluster] redis (node_id "<node_id>-<n>", data under <data_dir>/worker-<n>): one per core.
    workers: int = 1

    @property
    def store_path(self) -> Path:
        return Path(self.data_dir) / self.storage.path


def _default_settings(section: str) -> Any:
    from .security.http_backend import HttpAuthSettings
    from .security.tokens import TokenSettings

    return TokenSettings() if section == "jwt" else HttpAuthSettings()


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


# The keys of the file's top level (tables and plain keys).
TOP_LEVEL_KEYS = (
    "broker",
    "storage",
    "security",
    "dynsec",
    "jwt",
    "http_auth",
    "cluster",
    "admin",
    "alerts",
    "listener",
    "bridge",
    "webhook",
    "data_dir",
    "log_level",
    "log_levels",
    "log_format",
    "gc_threshold",
    "busy_poll_us",
    "gather_us",
    "fd_table",
    "workers",
)


def _suggest(key: str, known: Iterable[str]) -> str:
    """What an unknown key's error adds: the likely key meant ("did you mean max_packet_size?"),
    else the keys there are."""
    names = sorted(known)
    close = difflib.get_close_matches(key, names, n=1)
    if close:
        return f"did you mean {close[0]}?"
    return f"known keys: {', '.join(names)}"


def _fill(target: Any, table: dict[str, Any], prefix: str, source: str) -> None:
    types = {f.name: f.type for f in dataclasses.fields(target)}
    py_types = {
        "int": int,
        "float": float,
        "bool": bool,
        "str": str,
        "bool | None": bool,
        "int | None": int,
    }
    for key, value in table.items():
        where = f"{source}: {prefix}{key}"
        if key not in types:
            raise ConfigError(f"{where}: unknown key; {_suggest(key, types)}")
        # an annotation's text, or (the compiled BrokerOptions) the type itself
        declared = types[key]
        name = declared if isinstance(declared, str) else getattr(declared, "__name__", None)
        expected = py_types.get(name or str(declared), object)
        setattr(target, key, _typed(value, expected, where))


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
    config = Config()
    for key, value in data.items():
        if key in ("broker", "storage", "security", "dynsec", "cluster", "admin", "alerts"):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {key}: expected a table [{key}]")
            _fill(getattr(config, key), value, f"{key}.", source)
        elif key in ("jwt", "http_auth"):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {key}: expected a table [{key}]")
            setattr(config, key, _settings(key, value, source))
        elif key == "listener":
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise ConfigError(f"{source}: listener: expected an array of tables [[listener]]")
            config.listeners = []
            for index, table in enumerate(value):
                listener = ListenerConfig()
                _fill(listener, table, f"listener[{index}].", source)
                config.listeners.append(listener)
        elif key == "data_dir":  # relative to the file's directory, not the working directory
            config.data_dir = os.path.normpath(
                os.path.join(directory, _typed(value, str, f"{source}: {key}"))
            )
        elif key in ("log_level", "log_format"):
            setattr(config, key, _typed(value, str, f"{source}: {key}"))
        elif key == "log_levels":
            config.log_levels = _log_levels(value, source)
        elif key in ("gc_threshold", "busy_poll_us", "gather_us", "fd_table", "workers"):
            setattr(config, key, _typed(value, int, f"{source}: {key}"))
        elif key in ("bridge", "webhook"):
            from .integrations import settings

            try:
                setattr(config, key + "s", settings.parse(key, value, source))
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        else:
            raise ConfigError(f"{source}: {key}: unknown key; {_suggest(key, TOP_LEVEL_KEYS)}")
    if config.busy_poll_us and "gather_us" not in data:
        config.gather_us = 0  # the one spins where the other sleeps
    check(config, source)
    return config


def _settings(section: str, table: dict[str, Any], source: str) -> Any:
    """[jwt] or [http_auth] as its (frozen) settings class, each value checked."""
    from .security.http_backend import HttpAuthSettings
    from .security.tokens import TokenSettings

    cls: Any = TokenSettings if section == "jwt" else HttpAuthSettings
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    py_types = {"int": int, "float": float, "bool": bool, "str": str}
    values: dict[str, Any] = {}
    for key, value in table.items():
        where = f"{source}: {section}.{key}"
        if key not in types:
            raise ConfigError(f"{where}: unknown key; {_suggest(key, types)}")
        declared = str(types[key])
        if declared == "tuple[str, ...]":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
            values[key] = tuple(value)
        else:
            values[key] = _typed(value, py_types[declared], where)
    return cls(**values)


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


def check(config: Config, source: str = "command line") -> None:
    if config.log_level.lower() not in LOG_LEVELS:
        raise ConfigError(f"{source}: log_level: expected one of {', '.join(LOG_LEVELS)}")
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(f'{source}: log_format: expected "text" or "json"')
    if not 0 <= config.gc_threshold <= 2**31 - 1:
        raise ConfigError(f"{source}: gc_threshold: must be between 0 and {2**31 - 1}")
    if not 0 <= config.fd_table <= MAX_FD_TABLE:
        raise ConfigError(f"{source}: fd_table: must be between 0 (off) and {MAX_FD_TABLE:,}")
    if not 0 <= config.busy_poll_us <= MAX_BUSY_POLL_US:
        raise ConfigError(
            f"{source}: busy_poll_us: must be between 0 (off) and {MAX_BUSY_POLL_US:,} (1 s)"
        )
    if not 0 <= config.gather_us <= MAX_GATHER_US:
        raise ConfigError(
            f"{source}: gather_us: must be between 0 (off) and {MAX_GATHER_US:,} (10 ms)"
        )
    if config.gather_us and config.busy_poll_us:
        raise ConfigError(
            f"{source}: gather_us and busy_poll_us: set one or the other (gather_us sleeps "
            "where busy_poll_us spins; busy_poll_us alone turns gathering off)"
        )
    bound: dict[tuple[str, int], int] = {}
    for index, listener in enumerate(config.listeners):
        _check_listener(listener, f"{source}: listener[{index}]")
        if listener.port:
            other = bound.setdefault((listener.host, listener.port), index)
            if other != index:
                raise ConfigError(
                    f"{source}: listener[{index}].port: {listener.host}:{listener.port} is "
                    f"already listener[{other}]"
                )
    for key in ("password_file", "acl_file"):
        path = getattr(config.security, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"{source}: security.{key}: file not found: {path}")
    from .security.passwords import MAX_ITERATIONS

    security = config.security
    _check_dynsec(config, source)
    _check_jwt(config, source)
    _check_http_auth(config, source)
    _check_chain(config, source)
    if security.acl_partly_denied not in ("filter", "refuse"):
        raise ConfigError(f'{source}: security.acl_partly_denied: expected "filter" or "refuse"')
    if security.max_login_failures < 0:
        raise ConfigError(f"{source}: security.max_login_failures: must not be negative (0: off)")
    if not security.login_failure_window > 0:
        raise ConfigError(f"{source}: security.login_failure_window: must be positive")
    if not 0 <= security.min_iterations <= MAX_ITERATIONS:
        raise ConfigError(
            f"{source}: security.min_iterations: must be between 0 (none) and {MAX_ITERATIONS:,}"
        )
    _check_admin(config, source)
    if config.alerts.oldest_queued_age < 0:
        raise ConfigError(f"{source}: alerts.oldest_queued_age: must not be negative (0: off)")
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
    _check_cluster(config.cluster, f"{source}: cluster")
    if not 1 <= config.workers <= MAX_WORKERS:
        raise ConfigError(f"{source}: workers: must be between 1 and {MAX_WORKERS}")
    if config.workers > 1:
        if not config.cluster.redis:
            raise ConfigError(
                f"{source}: workers: more than 1 needs [cluster] redis (--cluster URL): the "
                "workers are nodes of one cluster"
            )
        for index, listener in enumerate(config.listeners):
            if not listener.port:
                raise ConfigError(
                    f"{source}: listener[{index}].port: 0 (any free port) cannot be shared by "
                    "workers; give a port"
                )
        # Worker n serves its admin on the admin port plus n (cluster/workers.py).
        admin = config.admin.port
        ports = range(admin, admin + config.workers) if admin else range(0)
        if admin and ports[-1] > 65535:
            raise ConfigError(
                f"{source}: admin.port: {admin} + {config.workers - 1} (one port per worker) "
                "is past 65535"
            )
        for index, listener in enumerate(config.listeners):
            if listener.port in ports:
                raise ConfigError(
                    f"{source}: admin.port: worker {listener.port - admin}'s admin port "
                    f"{listener.port} is listener[{index}]'s port"
                )


NODE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


def _check_dynsec(config: Config, source: str) -> None:
    dynsec = config.dynsec
    if not 1 <= dynsec.iterations <= 10_000_000:
        raise ConfigError(f"{source}: dynsec.iterations: must be between 1 and 10,000,000")
    if dynsec.enabled and config.security.acl_file:
        raise ConfigError(f"{source}: dynsec.enabled and security.acl_file: use one or the other")
    if dynsec.import_file and not os.path.isfile(dynsec.import_file):
        raise ConfigError(f"{source}: dynsec.import_file: file not found: {dynsec.import_file}")


def _check_jwt(config: Config, source: str) -> None:
    from .security.tokens import ASYMMETRIC, SYMMETRIC

    jwt = config.jwt
    if jwt is None or not jwt.enabled:
        return
    where = f"{source}: jwt"
    if not jwt.algorithms:
        raise ConfigError(f"{where}.algorithms: give at least one")
    for alg in jwt.algorithms:
        if alg not in ASYMMETRIC | SYMMETRIC:
            raise ConfigError(
                f"{where}.algorithms: {alg!r} is not accepted (one of "
                f"{', '.join(sorted(ASYMMETRIC | SYMMETRIC))}; never none)"
            )
    for key in ("public_key_file", "jwks_file", "secret_file"):
        path = getattr(jwt, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"{where}.{key}: file not found: {path}")
    if jwt.public_key_dir and not Path(jwt.public_key_dir).is_dir():
        raise ConfigError(f"{where}.public_key_dir: not a directory: {jwt.public_key_dir}")
    if jwt.secret_file and jwt.secret_env:
        raise ConfigError(f"{where}.secret_file and secret_env: set one or the other")
    secret = jwt.secret_file or jwt.secret_env
    public = jwt.public_key_file or jwt.public_key_dir or jwt.jwks_file
    if any(alg in SYMMETRIC for alg in jwt.algorithms) and not secret:
        raise ConfigError(f"{where}.algorithms: HS* needs jwt.secret_file or jwt.secret_env")
    if any(alg in ASYMMETRIC for alg in jwt.algorithms) and not public:
        raise ConfigError(
            f"{where}.algorithms: {', '.join(a for a in jwt.algorithms if a in ASYMMETRIC)} "
            "need jwt.public_key_file, public_key_dir or jwks_file"
        )
    if not secret and not public:
        raise ConfigError(f"{where}: give public_key_file, public_key_dir, jwks_file or a secret")
    if not 0 <= jwt.leeway <= 3600:
        raise ConfigError(f"{where}.leeway: must be between 0 and 3600 seconds")
    if not 64 <= jwt.max_token_size <= 65_536:
        raise ConfigError(f"{where}.max_token_size: must be between 64 and 65,536 bytes")
    if not jwt.username_claim:
        raise ConfigError(f"{where}.username_claim: must not be empty")


def _check_http_auth(config: Config, source: str) -> None:
    http = config.http_auth
    if http is None or not http.enabled:
        return
    where = f"{source}: http_auth"
    if not http.url and not http.acl_url:
        raise ConfigError(f"{where}: give url (logins), acl_url (rights) or both")
    for key in ("url", "acl_url"):
        url = getattr(http, key)
        if url and (urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname):
            raise ConfigError(f"{where}.{key}: expected an http:// or https:// URL, got {url!r}")
    if not 0 < http.timeout <= 60:
        raise ConfigError(f"{where}.timeout: must be between 0 and 60 seconds")
    if http.cache_ttl < 0:
        raise ConfigError(f"{where}.cache_ttl: must not be negative (0: no cache)")
    if http.cache_size < 1:
        raise ConfigError(f"{where}.cache_size: must be at least 1")
    if not 1 <= http.max_concurrent <= 10_000:
        raise ConfigError(f"{where}.max_concurrent: must be between 1 and 10,000")
    if http.when_down not in ("deny", "ignore"):
        raise ConfigError(f'{where}.when_down: expected "deny" or "ignore"')
    if http.token_file and not Path(http.token_file).is_file():
        raise ConfigError(f"{where}.token_file: file not found: {http.token_file}")
    if http.token_file and http.token_env:
        raise ConfigError(f"{where}.token_file and token_env: set one or the other")


def configured_sources(config: Config) -> list[str]:
    """The login sources ``config`` sets up, in the default chain's order."""
    names = []
    if config.dynsec.enabled:
        names.append("dynsec")
    if config.security.password_file:
        names.append("password_file")
    if config.jwt is not None and config.jwt.enabled:
        names.append("jwt")
    if config.http_auth is not None and config.http_auth.enabled:
        names.append("http")
    return names


def _check_chain(config: Config, source: str) -> None:
    from .security.chain import SOURCES

    chain = config.security.chain
    where = f"{source}: security.chain"
    if not isinstance(chain, list) or not all(isinstance(name, str) for name in chain):
        raise ConfigError(f'{where}: expected a list of source names, e.g. ["jwt", "http"]')
    if not chain:
        return
    configured = configured_sources(config)
    needs = {
        "password_file": "security.password_file",
        "dynsec": "dynsec.enabled",
        "jwt": "jwt.enabled",
        "http": "http_auth.enabled",
    }
    for name in chain:
        if name not in SOURCES:
            raise ConfigError(f"{where}: unknown source {name!r}; one of {', '.join(SOURCES)}")
        if chain.count(name) > 1:
            raise ConfigError(f"{where}: {name!r} is named twice")
        if name not in configured:
            raise ConfigError(f"{where}: {name!r} needs {needs[name]}")
    for name in configured:
        if name not in chain:
            raise ConfigError(f"{where}: {name!r} is configured ({needs[name]}): name it too")


def _check_cluster(cluster: ClusterConfig, where: str) -> None:
    """The [cluster] values; an empty node_id becomes the host name."""
    if not cluster.redis:
        return
    scheme = cluster.redis.partition("://")[0]
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            f"{where}.redis: expected a redis://, rediss:// or unix:// URL, got {scheme!r}"
        )
    try:
        from redis.asyncio.connection import parse_url
    except ImportError:
        raise ConfigError(
            f"{where}.redis: cluster mode needs the redis package "
            "(pip install '.[cluster]' in the mqttbroker source tree)"
        ) from None
    try:
        parse_url(cluster.redis)
    except ValueError as exc:
        raise ConfigError(f"{where}.redis: not a valid Redis URL: {exc}") from None
    if not cluster.node_id:
        cluster.node_id = socket.gethostname()
    if not NODE_ID.fullmatch(cluster.node_id):
        raise ConfigError(
            f"{where}.node_id: letters, digits, '-', '_', '.' and ':' only (1 to 100), "
            f"got {cluster.node_id!r}"
        )
    if cluster.stream_max_length < 100:
        raise ConfigError(f"{where}.stream_max_length: must be at least 100")
    if not cluster.node_ttl >= 1:
        raise ConfigError(f"{where}.node_ttl: must be at least 1 (second)")
    if not cluster.connect_timeout > 0:
        raise ConfigError(f"{where}.connect_timeout: must be positive")
    if not cluster.adopt_after >= 0:
        raise ConfigError(f"{where}.adopt_after: must be 0 (off) or more (seconds)")
    password = redis_password(cluster, where)
    if password is not None:
        key = "password_file" if cluster.password_file else "password_env"
        cluster.redis = _with_password(cluster.redis, password, f"{where}.{key}")


def redis_password(cluster: ClusterConfig, where: str = "cluster") -> str | None:
    """The password of [cluster] password_file or password_env (None: neither is set);
    ConfigError names the key, and the file or variable."""
    file, env = cluster.password_file, cluster.password_env
    return read_secret_text(file, env, f"{where}.password", joined(ConfigError))


def _with_password(url: str, password: str, where: str) -> str:
    """``url`` with ``password`` in it, as redis-py reads a URL's password (the node logs the
    URL without it). The same URL back if it has that password already (the configuration is
    checked again after the command line's options)."""
    parts = urlsplit(url)
    if parts.password is not None:
        if unquote(parts.password) == password:
            return url
        raise ConfigError(f"{where}: the redis URL has a password as well; keep one of them")
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{user}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


def _check_admin(config: Config, source: str) -> None:
    """[admin]: off with port 0; anywhere but loopback only with a token or admin users."""
    admin = config.admin
    where = f"{source}: admin"
    if not 0 <= admin.port <= 65535:
        raise ConfigError(f"{where}.port: must be between 0 (off) and 65535")
    if not admin.port:
        return
    if admin.token_file and admin.token_env:
        raise ConfigError(f"{where}.token_env: token_file is set too; choose one")
    for key in ("token_file", "tls_cert_file", "tls_key_file"):
        path = getattr(admin, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"{where}.{key}: file not found: {path}")
    if admin.tls_key_file and not admin.tls_cert_file:
        raise ConfigError(f"{where}.tls_key_file: needs tls_cert_file")
    if admin.admin_users and not config.security.password_file:
        raise ConfigError(f"{where}.admin_users: needs security.password_file (their passwords)")
    from .security import is_loopback

    if not is_loopback(admin.host) and not (
        admin.token_file or admin.token_env or admin.admin_users
    ):
        raise ConfigError(
            f"{where}.host: {admin.host!r} is not a loopback address: set token_file, token_env "
            "or admin_users, or admin.port = 0 to turn the admin server off"
        )


def _check_listener(listener: ListenerConfig, where: str) -> None:
    """The values of one [[listener]], and that its files exist (``security.tls`` loads them)."""
    if not 0 <= listener.port <= 65535:
        raise ConfigError(f"{where}.port: must be between 0 and 65535")
    if listener.protocol not in ("mqtt", "ws"):
        raise ConfigError(f'{where}.protocol: expected "mqtt" or "ws", got {listener.protocol!r}')
    if not 1 <= listener.backlog <= MAX_BACKLOG:
        raise ConfigError(f"{where}.backlog: must be between 1 and {MAX_BACKLOG}")
    if not listener.ws_path.startswith("/"):
        raise ConfigError(f"{where}.ws_path: must start with '/', got {listener.ws_path!r}")
    if listener.tls_min_version not in ("1.2", "1.3"):
        raise ConfigError(
            f'{where}.tls_min_version: expected "1.2" or "1.3", got {listener.tls_min_version!r}'
        )
    if listener.tls_certificate_username not in ("none", "cn", "san"):
        raise ConfigError(
            f'{where}.tls_certificate_username: expected "none", "cn" or "san", '
            f"got {listener.tls_certificate_username!r}"
        )
    if not listener.tls_cert_file:
        for key in ("tls_key_file", "tls_ciphers", "tls_ca_file"):
            if getattr(listener, key):
                raise ConfigError(f"{where}.{key}: needs tls_cert_file (a TLS listener)")
    if listener.tls_require_certificate and not listener.tls_ca_file:
        raise ConfigError(
            f"{where}.tls_require_certificate: needs tls_ca_file (the CA of client certificates)"
        )
    if listener.tls_certificate_username != "none" and not listener.tls_ca_file:
        raise ConfigError(
            f"{where}.tls_certificate_username: needs tls_ca_file (the CA of client certificates)"
        )
    for key in ("tls_cert_file", "tls_key_file", "tls_ca_file"):
        path = getattr(listener, key)
        if path and not Path(path).is_file():
            raise ConfigError(f"{where}.{key}: file not found: {path}")
    if listener.ws_trusted_proxies:
        if listener.protocol != "ws":
            raise ConfigError(f'{where}.ws_trusted_proxies: needs protocol = "ws"')
        try:
            trusted_networks(listener.ws_trusted_proxies)
        except ValueError as exc:
            raise ConfigError(f"{where}.ws_trusted_proxies: {exc}") from None
    if listener.proxy_protocol:
        if listener.protocol != "mqtt":
            raise ConfigError(
                f'{where}.proxy_protocol: needs protocol = "mqtt" (behind a reverse proxy a '
                "WebSocket listener reads X-Forwarded-For: ws_trusted_proxies)"
            )
        try:
            trusted_networks(listener.proxy_protocol)
        except ValueError as exc:
            raise ConfigError(f"{where}.proxy_protocol: {exc}") from None


def trusted_networks(text: str) -> tuple[IPNetwork, ...]:
    """``ws_trusted_proxies``, ``proxy_protocol``: comma-separated addresses or networks;
    ValueError names a bad one."""
    networks = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"not an IP address or network: {entry!r}") from None
    if text and not networks:
        raise ValueError(f"no address in {text!r}")
    return tuple(networks)

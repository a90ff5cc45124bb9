"""The settings classes: one dataclass per table of the TOML configuration, each field a key
with its default (config/mqttbroker.toml lists them all). ``read.py`` fills them from a file,
``check.py`` checks the values; the rest of the broker takes these objects as they are.

A field marked ``DERIVED`` is not a key: it is worked out from keys while reading (a bridge's
host and port from its address, a secret from its ``_file`` or ``_env`` key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..broker.options import BrokerOptions

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")
# The login sources [security] chain may name (security/chain.py), in the default order's
# terms: each configured source once.
LOGIN_SOURCES = ("password_file", "dynsec", "jwt", "http")
# [jwt] algorithms: those verified with a public key, and the HMAC ones (a shared secret);
# "none" is never accepted.
ASYMMETRIC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
SYMMETRIC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
# PBKDF2 iterations of a password (password files, dynamic security): a bound, so that a typo
# in a file cannot stall every login.
MAX_ITERATIONS = 10_000_000
BRIDGE_DIRECTIONS = ("out", "in", "both")
WEBHOOK_EVENTS = (
    "message.publish",
    "client.connected",
    "client.disconnected",
    "session.expired",
    "message.dropped",
)
DERIVED = {"derived": True}  # field metadata: worked out while reading, not a key


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
    # Seconds a change that no acknowledgement waits for (a delivered message's removal, a QoS 1
    # message's packet id, a known session's clock) may wait for a commit; a crash within it
    # sends such messages again (at least once). 0: committed at once, as the others.
    defer_wait: float = 0.05


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


@dataclass(frozen=True, slots=True)
class JwtConfig:
    # Devices log in with a JSON Web Token as password (security/tokens.py).
    enabled: bool = False
    # Accepted algorithms (ASYMMETRIC_ALGORITHMS, SYMMETRIC_ALGORITHMS); HS* need a secret, and
    # a public key never verifies an HMAC token.
    algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")
    # The keys: one PEM public key for every device; <dir>/<client id>.pem, each device's own;
    # a JWKS file whose kid picks the key; the HMAC secret from a file or a variable.
    public_key_file: str = ""
    public_key_dir: str = ""
    jwks_file: str = ""
    secret_file: str = ""
    secret_env: str = ""
    # Required aud and iss claims ("": not checked); seconds of clock skew on exp, nbf, iat.
    audience: str = ""
    issuer: str = ""
    leeway: float = 30.0
    max_token_size: int = 8192  # bytes; larger tokens are refused before any parsing
    # The claim that becomes the user name; the claim holding the device's whole rights
    # ({"publish": [filters], "subscribe": [filters]}; "": the other sources decide).
    username_claim: str = "sub"
    acl_claim: str = ""


@dataclass(frozen=True, slots=True)
class HttpAuthConfig:
    # The operator's HTTP service decides logins (url) and rights (acl_url):
    # security/http_backend.py.
    enabled: bool = False
    url: str = ""
    acl_url: str = ""
    timeout: float = 2.0  # seconds per call
    # Seconds an answer is reused (0: no cache), and how many answers are kept.
    cache_ttl: float = 60.0
    cache_size: int = 100_000
    max_concurrent: int = 64  # calls at once
    # The service down (time-out, refused, 5xx, unreadable answer): "deny" or "ignore".
    when_down: str = "deny"
    # The bearer token each call carries, from a file or an environment variable.
    token_file: str = ""
    token_env: str = ""
    # Each delivery asks acl_url's "read" right too, from the cache (security/chain.py).
    check_reads: bool = False


@dataclass(slots=True)
class TopicRule:
    """A ``[[bridge.topic]]``: which messages cross, which way, at what QoS at most."""

    filter: str
    direction: str = "out"  # "out" (to the remote), "in" (from it) or "both"
    qos: int = 1
    # The local topic is local_prefix + topic, the remote one remote_prefix + topic.
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
    """A ``[[bridge]]``: a connection to another broker (integrations/bridge.py)."""

    name: str  # in logs and in $SYS/broker/bridges/<name>/...
    # From the key address ("host:port").
    host: str = field(default="", metadata=DERIVED)
    port: int = field(default=0, metadata=DERIVED)
    protocol: str = "5"  # "5" or "3.1.1"
    client_id: str = ""  # "": "<host name>-bridge-<name>"
    username: str | None = None  # "" or absent: no user name
    # From the keys password_file or password_env.
    password: bytes | None = field(default=None, repr=False, metadata=DERIVED)
    # TLS with the system's CAs; implied by any tls_* key or insecure.
    tls: bool = False
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_server_name: str = ""  # the name checked in the remote's certificate ("": the host)
    insecure: bool = False  # no certificate check (tests only)
    session_expiry: int = 3600  # MQTT 5: seconds the remote keeps the bridge's session
    keep_alive: int = 60
    # The bridge's own outbound queue (stored), past which messages are dropped: not [broker]
    # max_queued_messages (a client session's).
    max_queued_messages: int = 100_000
    max_queued_bytes: int = 64 * 1_048_576
    # From the [[bridge.topic]] tables.
    topics: list[TopicRule] = field(default_factory=list, metadata=DERIVED)


@dataclass(slots=True)
class WebhookConfig:
    """A ``[[webhook]]``: messages and events POSTed to an HTTP endpoint
    (integrations/webhooks.py). ``url`` and ``secret`` stay out of the repr: the URL may hold a
    password or a token (show ``webhooks.redact_url(url)``)."""

    name: str
    url: str = field(default="", repr=False)
    # Topic filters; their messages are event "message.publish".
    topics: list[str] = field(default_factory=list)
    # WEBHOOK_EVENTS; absent: "message.publish" if topics are given.
    events: list[str] = field(default_factory=list)
    format: str = "json"  # "json" envelope, or "raw": the payload, metadata in headers
    # The HMAC-SHA256 signing key, from the keys secret_file or secret_env (None: unsigned).
    secret: bytes | None = field(default=None, repr=False, metadata=DERIVED)
    max_attempts: int = 10  # then a dead letter
    timeout: float = 10.0  # seconds per request
    concurrency: int = 4  # requests in flight
    max_queued: int = 100_000  # pending deliveries kept (stored); then dropped
    # Seconds before the first retry, doubling with jitter up to retry_max_delay.
    retry_delay: float = 1.0
    retry_max_delay: float = 300.0
    dead_letter_topic: str = ""  # given-up deliveries are published here ("": dropped)


@dataclass(slots=True)
class Config:
    # The [[listener]] tables.
    listeners: list[ListenerConfig] = field(
        default_factory=lambda: [ListenerConfig()], metadata=DERIVED
    )
    broker: BrokerOptions = field(default_factory=BrokerOptions)
    storage: StorageConfig = field(default_factory=StorageConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    dynsec: DynsecConfig = field(default_factory=DynsecConfig)
    jwt: JwtConfig = field(default_factory=JwtConfig)
    http_auth: HttpAuthConfig = field(default_factory=HttpAuthConfig)
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
    # The [[bridge]] and [[webhook]] tables.
    bridges: list[BridgeConfig] = field(default_factory=list, metadata=DERIVED)
    webhooks: list[WebhookConfig] = field(default_factory=list, metadata=DERIVED)
    # Processes serving the same listeners (SO_REUSEPORT), each a node of the cluster on
    # [cluster] redis (node_id "<node_id>-<n>", data under <data_dir>/worker-<n>): one per core.
    workers: int = 1

    @property
    def store_path(self) -> Path:
        return Path(self.data_dir) / self.storage.path

"""Checking a configuration's values, across tables too (a listener's port against the
admin port, the login chain against the sources configured): the first problem is a
ConfigError naming the file and the key. Also the small network rules the checks share
(:func:`is_loopback`, :func:`trusted_networks`)."""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from ..secret_source import joined, read_secret_text
from .errors import ConfigError
from .keys import files_exist, one_source
from .sections import (
    ASYMMETRIC_ALGORITHMS,
    LOG_FORMATS,
    LOG_LEVELS,
    LOGIN_SOURCES,
    MAX_ITERATIONS,
    SYMMETRIC_ALGORITHMS,
    ClusterConfig,
    Config,
    ListenerConfig,
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_BUSY_POLL_US = 1_000_000
MAX_GATHER_US = 10_000
MAX_FD_TABLE = 1 << 20  # Linux's default ceiling on any process's table (fs.nr_open)
MAX_WORKERS = 256
MAX_BACKLOG = 65535  # a listener's backlog (the kernel caps it lower: net.core.somaxconn)
NODE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


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
    security = config.security
    files_exist(security, ("password_file", "acl_file"), f"{source}: security.")
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
    if not 0 <= storage.defer_wait <= 60:
        raise ConfigError(f"{source}: storage.defer_wait: must be between 0 and 60 seconds")
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


def _check_dynsec(config: Config, source: str) -> None:
    dynsec = config.dynsec
    if not 1 <= dynsec.iterations <= MAX_ITERATIONS:
        raise ConfigError(f"{source}: dynsec.iterations: must be between 1 and {MAX_ITERATIONS:,}")
    if dynsec.enabled and config.security.acl_file:
        raise ConfigError(f"{source}: dynsec.enabled and security.acl_file: use one or the other")
    files_exist(dynsec, ("import_file",), f"{source}: dynsec.")


def _check_jwt(config: Config, source: str) -> None:
    jwt = config.jwt
    if not jwt.enabled:
        return
    where = f"{source}: jwt"
    if not jwt.algorithms:
        raise ConfigError(f"{where}.algorithms: give at least one")
    accepted = ASYMMETRIC_ALGORITHMS | SYMMETRIC_ALGORITHMS
    for alg in jwt.algorithms:
        if alg not in accepted:
            raise ConfigError(
                f"{where}.algorithms: {alg!r} is not accepted (one of "
                f"{', '.join(sorted(accepted))}; never none)"
            )
    files_exist(jwt, ("public_key_file", "jwks_file", "secret_file"), f"{where}.")
    if jwt.public_key_dir and not Path(jwt.public_key_dir).is_dir():
        raise ConfigError(f"{where}.public_key_dir: not a directory: {jwt.public_key_dir}")
    one_source(jwt, "secret", f"{where}.")
    secret = jwt.secret_file or jwt.secret_env
    public = jwt.public_key_file or jwt.public_key_dir or jwt.jwks_file
    if any(alg in SYMMETRIC_ALGORITHMS for alg in jwt.algorithms) and not secret:
        raise ConfigError(f"{where}.algorithms: HS* needs jwt.secret_file or jwt.secret_env")
    asymmetric = [alg for alg in jwt.algorithms if alg in ASYMMETRIC_ALGORITHMS]
    if asymmetric and not public:
        raise ConfigError(
            f"{where}.algorithms: {', '.join(asymmetric)} "
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
    if not http.enabled:
        return
    where = f"{source}: http_auth"
    if not http.url and not http.acl_url:
        raise ConfigError(f"{where}: give url (logins), acl_url (rights) or both")
    if http.check_reads and not http.acl_url:
        raise ConfigError(f"{where}.check_reads: needs acl_url, the service that answers rights")
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
    files_exist(http, ("token_file",), f"{where}.")
    one_source(http, "token", f"{where}.")


def configured_sources(config: Config) -> list[str]:
    """The login sources ``config`` sets up, in the default chain's order."""
    names = []
    if config.dynsec.enabled:
        names.append("dynsec")
    if config.security.password_file:
        names.append("password_file")
    if config.jwt.enabled:
        names.append("jwt")
    if config.http_auth.enabled:
        names.append("http")
    return names


def _check_chain(config: Config, source: str) -> None:
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
        if name not in LOGIN_SOURCES:
            raise ConfigError(
                f"{where}: unknown source {name!r}; one of {', '.join(LOGIN_SOURCES)}"
            )
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
    one_source(admin, "token", f"{where}.")
    files_exist(admin, ("token_file", "tls_cert_file", "tls_key_file"), f"{where}.")
    if admin.tls_key_file and not admin.tls_cert_file:
        raise ConfigError(f"{where}.tls_key_file: needs tls_cert_file")
    if admin.admin_users and not config.security.password_file:
        raise ConfigError(f"{where}.admin_users: needs security.password_file (their passwords)")
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
    files_exist(listener, ("tls_cert_file", "tls_key_file", "tls_ca_file"), f"{where}.")
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


def is_loopback(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable from this machine only."""
    host = host.strip().strip("[]").split("%", 1)[0]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name, or "" (every interface): assume it is reachable from outside

"""Command line: ``mqttbroker [--config PATH] [--host H] [--port P] [--ws-port P] [--data-dir D]
[--memory] [--allow-anonymous] [--log-level L] [--cluster URL] [--node-id ID] [--workers N]``.

Exit statuses: 0 stopped by SIGINT/SIGTERM, 1 an unexpected error, 2 did not start (a
configuration error on stderr, or a start error in the log: server/app.py)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import signal
import sys

from . import __version__, logformat
from .config import LOG_LEVELS, Config, ConfigError, ListenerConfig, check, load


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mqttbroker",
        description="An MQTT 5.0 / 3.1.1 broker.",
        epilog="mqttbroker passwd [-c | -D] FILE USER: add, change or delete a user of a "
        "password file (mqttbroker passwd --help); mqttbroker check-config FILE: validate a "
        "configuration file without starting anything (exit 0: valid, 2: not); mqttbroker convert-config MOSQUITTO_CONF: "
        "print the TOML equivalent of a Mosquitto configuration.",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument("--config", metavar="PATH", help="TOML configuration file")
    source.add_argument(
        "--mosquitto-conf",
        metavar="PATH",
        help="run with a Mosquitto configuration file (mosquitto.conf); the directives it "
        "cannot carry over are logged (mqttbroker convert-config PATH prints the TOML)",
    )
    p.add_argument(
        "--host", help="address to listen on (default 127.0.0.1; the first [[listener]]'s)"
    )
    p.add_argument(
        "--port",
        type=int,
        help="TCP port to listen on (default 1883; 0 = any free port; the first [[listener]]'s)",
    )
    p.add_argument(
        "--ws-port",
        type=int,
        metavar="PORT",
        help="also listen for MQTT over WebSocket (ws://HOST:PORT/mqtt) on --host",
    )
    p.add_argument(
        "--data-dir", metavar="DIR", help="where the broker keeps its data (default ./data)"
    )
    p.add_argument(
        "--memory", action="store_true", help='keep nothing on disk (storage.backend = "memory")'
    )
    p.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="accept clients without a user name on every listener that does not say otherwise "
        "(security.allow_anonymous = true)",
    )
    p.add_argument(
        "--admin-port",
        type=int,
        metavar="PORT",
        help="admin HTTP server (dashboard, /metrics, API) port (default 18083; 0 = off)",
    )
    p.add_argument("--log-level", choices=LOG_LEVELS, help="default info")
    p.add_argument(
        "--cluster",
        metavar="URL",
        help="be a node of the cluster on this Redis (cluster.redis), e.g. redis://127.0.0.1:6379/0",
    )
    p.add_argument(
        "--node-id", metavar="ID", help="this node's name in the cluster (cluster.node_id)"
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="run N broker processes sharing the listening ports, nodes of the cluster "
        "(needs --cluster); one per core",
    )
    p.add_argument("--version", action="version", version=f"mqttbroker {__version__}")
    return p


def _record_stop_signals() -> list[int]:
    """Until the event loop takes over, SIGINT and SIGTERM are only recorded: a broker told to
    stop while it reads its configuration stops as soon as its loop runs, without a traceback
    (and with the exit status of a normal stop)."""
    received: list[int] = []

    def record(signum: int, frame: object) -> None:
        received.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, record)
    return received


def _set_log_levels(config: Config) -> None:
    """The broker's own loggers at ``log_level``; the libraries' (aiosqlite logs every statement
    at debug) at info at most, unless ``log_levels`` names them."""
    root = logging.getLogger()
    root.setLevel(max(logging.INFO, root.level))
    logging.getLogger("mqttbroker").setLevel(config.log_level.upper())
    for name, level in config.log_levels.items():
        logging.getLogger(name).setLevel(level.upper())


# mqttbroker COMMAND ...: the commands besides running the broker.
COMMANDS = ("passwd", "check-config", "convert-config")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        # (the broker's own options are all --options: a first word is a command)
        close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
        hint = f"did you mean {close[0]}?" if close else f"commands: {', '.join(COMMANDS)}"
        print(f"mqttbroker: unknown command {argv[0]!r}; {hint}", file=sys.stderr)
        return 2
    if argv[:1] == ["passwd"]:
        from .security.passwd import main as passwd_main

        return passwd_main(argv[1:])
    if argv[:1] == ["check-config"]:
        return check_config(argv[1:])
    if argv[:1] == ["convert-config"]:
        return convert_config(argv[1:])
    args = parser().parse_args(argv)
    stop_requested = _record_stop_signals()
    not_carried: list[str] = []
    try:
        if args.mosquitto_conf:
            from . import mosquitto_conf

            config, conversion = mosquitto_conf.load(args.mosquitto_conf)
            not_carried = conversion.unsupported
        else:
            config = load(args.config)
        if args.host is not None or args.port is not None:
            # The first listener's address; its protocol and TLS settings stay.
            first = config.listeners[0] if config.listeners else ListenerConfig()
            config.listeners[:1] = [
                dataclasses.replace(
                    first,
                    host=args.host if args.host is not None else first.host,
                    port=args.port if args.port is not None else first.port,
                )
            ]
        if args.ws_port is not None:
            host = config.listeners[0].host if config.listeners else ListenerConfig().host
            config.listeners.append(ListenerConfig(host=host, port=args.ws_port, protocol="ws"))
        if args.data_dir is not None:
            config.data_dir = args.data_dir
        if args.memory:
            config.storage.backend = "memory"
        if args.allow_anonymous:
            config.security.allow_anonymous = True
        if args.log_level is not None:
            config.log_level = args.log_level
        if args.cluster is not None:
            config.cluster.redis = args.cluster
        if args.node_id is not None:
            config.cluster.node_id = args.node_id
        if args.workers is not None:
            config.workers = args.workers
        if args.admin_port is not None:
            config.admin.port = args.admin_port
        check(config)
        from .security.tls import check_listeners

        check_listeners(config, args.config or args.mosquitto_conf or "command line")
    except ConfigError as exc:
        print(f"mqttbroker: configuration error: {exc}", file=sys.stderr)
        return 2
    logformat.setup(config.log_level)  # control characters in messages escaped
    if config.log_format == "json":
        from .ops.logjson import JsonFormatter

        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    _set_log_levels(config)
    if config.workers > 1:
        from .cluster.workers import as_worker, supervise, worker_index

        index = worker_index()
        if index is None:
            return supervise(argv, config, stop_requested)
        as_worker(config, index)
    path = args.config or args.mosquitto_conf
    logging.getLogger("mqttbroker").info(
        "mqttbroker %s, %s",
        __version__,
        f"{'Mosquitto ' if args.mosquitto_conf else ''}config file {os.path.abspath(path)}"
        if path
        else "no config file",
    )
    for note in not_carried:
        logging.getLogger("mqttbroker").warning("Mosquitto directive not carried over: %s", note)
    from .server.app import run

    try:
        return run(config, stop_requested)
    except ConfigError as exc:  # a password or ACL file that does not load (file and line)
        print(f"mqttbroker: configuration error: {exc}", file=sys.stderr)
        return 2


def check_config(argv: list[str]) -> int:
    """``mqttbroker check-config FILE``: load FILE as the broker would (its keys, the files it
    names: certificates, password and ACL files, the admin token) without binding anything.
    Exit 0 if it is valid, 2 (with the error on stderr) if not."""
    p = argparse.ArgumentParser(
        prog="mqttbroker check-config", description="Validate a configuration file."
    )
    p.add_argument("file", metavar="FILE")
    args = p.parse_args(argv)
    from .ops.admin import read_token
    from .security import build_security
    from .security.tls import check_listeners

    logging.basicConfig(level="ERROR")  # build_security's notes are not the point here
    try:
        config = load(args.file)
        check_listeners(config, args.file)
        build_security(config)
        if config.admin.port:
            read_token(config.admin)
    except ConfigError as exc:
        print(f"mqttbroker: configuration error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.file}: valid")
    return 0


def convert_config(argv: list[str]) -> int:
    """``mqttbroker convert-config MOSQUITTO_CONF``: the equivalent TOML on stdout; the
    directives not carried over are comments in it, and listed on stderr."""
    p = argparse.ArgumentParser(
        prog="mqttbroker convert-config",
        description="Print the TOML configuration equivalent to a Mosquitto configuration.",
    )
    p.add_argument("path", metavar="MOSQUITTO_CONF")
    args = p.parse_args(argv)
    from . import mosquitto_conf

    try:
        conversion = mosquitto_conf.convert(args.path)  # files need not exist on this machine
    except ConfigError as exc:
        print(f"mqttbroker: configuration error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(conversion.toml())
    for note in conversion.unsupported:
        print(f"not carried over: {note}", file=sys.stderr)
    return 0

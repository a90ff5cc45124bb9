"""The errors of a configuration that cannot run: each message names the file and the key."""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration problem; the message names the file and the key."""


class StartError(Exception):
    """The broker cannot start with its configuration (a listener that cannot listen, a Redis
    that cannot be reached); the message names the key or the listener, and why. Raised by the
    server and the cluster node alike, so it lives here, below both."""

"""What a listener decides for the connections it accepts, handed to the broker explicitly
when a connection is created (the broker never reads listener settings itself)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ListenerPolicy:
    """``allow_anonymous``: whether a client without a user name may connect (None: the
    authenticator alone decides, as for a connection made in a test). ``local``: the listener
    is reachable from this host only, so it has no per-address connection limit unless one is
    configured. ``kind``: how the log names the transport ("MQTT over TLS")."""

    allow_anonymous: bool | None = None
    local: bool = False
    kind: str = "MQTT over a test link"


OPEN = ListenerPolicy()  # connections made without a listener (tests, internal clients)

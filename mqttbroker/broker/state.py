"""The states of one connection and their transitions, as data (the shape of h11's _state.py).

A connection is in one of four states. What moves it is an event of the broker's making (a
CONNECT accepted, an authentication begun, a close), never a packet by itself; the packets a
client may send in each state are a second table, and the function that handles each of them a
third (h11's READERS). :meth:`Connection.to <mqttbroker.broker.connection.Connection.to>` is the
only place that changes the state, and it refuses any move the table does not list.

The states are plain ints (``Final``, so compiled code compares them as constants on the hot
path); :class:`State` names them for logs and tests.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Final

from ..protocol.packets import PacketType
from . import connect, subscribe

if TYPE_CHECKING:
    from .connection import Connection

AWAIT_CONNECT: Final = 0  # the socket is open; the first packet must be CONNECT
AUTHENTICATING: Final = 1  # CONNECT received; a password check or an AUTH exchange is under way
CONNECTED: Final = 2  # CONNACK sent: the session is attached
CLOSED: Final = 3  # closed by either side; nothing is read or written any more


class State(IntEnum):
    AWAIT_CONNECT = AWAIT_CONNECT
    AUTHENTICATING = AUTHENTICATING
    CONNECTED = CONNECTED
    CLOSED = CLOSED


# The events, plain ints as well (the enum below names them):
AUTHENTICATE: Final = 0  # CONNECT acceptable so far; its credentials (or its claim) are checked
ACCEPT: Final = 1  # the client is who it says: session attached, CONNACK sent
CLOSE: Final = 2  # DISCONNECT, an error, a refusal, the transport lost, or the server's decision


class Event(IntEnum):
    AUTHENTICATE = AUTHENTICATE
    ACCEPT = ACCEPT
    CLOSE = CLOSE


TRANSITIONS: Final[dict[int, dict[int, int]]] = {
    AWAIT_CONNECT: {
        Event.AUTHENTICATE: AUTHENTICATING,
        Event.ACCEPT: CONNECTED,
        Event.CLOSE: CLOSED,
    },
    # AUTHENTICATE again: a cluster node claims the client id once the credentials are checked
    AUTHENTICATING: {
        Event.AUTHENTICATE: AUTHENTICATING,
        Event.ACCEPT: CONNECTED,
        Event.CLOSE: CLOSED,
    },
    CONNECTED: {Event.CLOSE: CLOSED},
    CLOSED: {},
}

# What a client may send in each state (sections 3.1.0, 3.1.2.11.9 and 4.12); anything else is
# a protocol error, answered per the state (no answer before CONNECT, 0x82 after it).
_FLOWS = (
    PacketType.PUBLISH,
    PacketType.PUBACK,
    PacketType.PUBREC,
    PacketType.PUBREL,
    PacketType.PUBCOMP,
)
RECEIVES: Final[dict[int, frozenset[int]]] = {
    AWAIT_CONNECT: frozenset({PacketType.CONNECT}),  # MQTT-3.1.0-1
    AUTHENTICATING: frozenset({PacketType.AUTH, PacketType.DISCONNECT}),  # MQTT-3.1.2-30
    CONNECTED: frozenset(
        {
            *_FLOWS,
            PacketType.SUBSCRIBE,
            PacketType.UNSUBSCRIBE,
            PacketType.PINGREQ,
            PacketType.DISCONNECT,
            PacketType.AUTH,
        }
    ),  # a second CONNECT is an error (MQTT-3.1.0-2)
    CLOSED: frozenset(),  # MQTT-3.1.4-6: nothing after a refused CONNECT is processed
}

# The function that handles each packet a state receives, once decoded. PUBLISH and its
# acknowledgements are not here: the connection hands them, received in CONNECTED, straight to
# their fast decoders and handlers (publish.py, deliver.py), without a packet object.
HANDLERS: Final[dict[int, Callable[[Connection, Any], None]]] = {
    PacketType.CONNECT: connect.on_connect,
    PacketType.AUTH: connect.on_auth,
    PacketType.DISCONNECT: connect.on_disconnect,
    PacketType.PINGREQ: connect.on_pingreq,
    PacketType.SUBSCRIBE: subscribe.on_subscribe,
    PacketType.UNSUBSCRIBE: subscribe.on_unsubscribe,
}


class IllegalTransition(Exception):
    """A bug of ours: the connection tried a move the table does not allow."""


def next_state(state: int, event: int) -> int:
    """The state ``event`` leads to from ``state``; IllegalTransition if it may not happen."""
    try:
        return TRANSITIONS[state][event]
    except KeyError:
        raise IllegalTransition(f"{State(state).name} cannot {Event(event).name.lower()}") from None

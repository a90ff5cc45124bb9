"""The seam between one broker and the other nodes of its cluster.

A single node has no backplane: ``Router.backplane`` is None and every hook below is one
attribute check that fails. A cluster node (``mqttbroker.cluster``) sets it to an object with
these methods; the router calls them at the points where other nodes must hear of something:

- :meth:`Backplane.publish`: a message was routed here, from a client of this node (or its will):
  send it on to the nodes with matching subscribers. Returns how many nodes it went to, and
  which of this node's matching shared groups deliver it here (each shared subscription gets a
  message once in the whole cluster: the others' turn may be on another node).
- :meth:`Backplane.route_added` / :meth:`Backplane.route_removed`: the first subscription of a
  filter on this node came, or its last one went (a shared one: ``$share/<group>/<filter>``).
- :meth:`Backplane.claim`: a client's CONNECT passed the checks that need no session
  (credentials, ``client_id_pattern``); the node takes its client id over (another node may hand
  its session over, or refuse to: a session of another user) and calls ``done`` to let the
  CONNECT go on, or with the refusal.
- :meth:`Backplane.session_ended`: a session ended here; its client id is free.

Messages that arrived from another node are routed locally only; the backplane knows them (it
routed them itself) and does not send them on again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..protocol.errors import MQTTError
    from .message import Message
    from .session import Session
    from .topics import SharedGroup


class Backplane:
    """The interface; this base class does nothing (a node alone)."""

    def publish(
        self, message: Message, groups: list[SharedGroup], publisher: Session | None
    ) -> tuple[int, list[SharedGroup]]:
        return 0, groups

    def route_added(self, topic_filter: str) -> None: ...

    def route_removed(self, topic_filter: str) -> None: ...

    def claim(
        self,
        client_id: str,
        clean_start: bool,
        username: str | None,
        done: Callable[[MQTTError | None], None],
    ) -> None:
        """Take ``client_id`` over for a client of ``username`` (None: anonymous), then call
        ``done`` on the event loop (never from within this call: the connection calling it is
        in the middle of its input) with None, or with the refusal of the node that had the
        session (another user's: what ``Broker.check_owner`` there said), which refuses the
        CONNECT; that node's client and session are then left as they were."""
        raise NotImplementedError

    def session_ended(self, client_id: str) -> None: ...

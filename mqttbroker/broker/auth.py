"""Authentication: the interface the connection asks, and the default that lets everyone in.

Two ways a client proves who it is (section 4.12):

* user name and password in CONNECT: :meth:`Authenticator.check_password` answers a
  :class:`LoginRequest` with a reason code (0x00 accepted, 0x86 bad user name or password, 0x87
  not authorized...);
* enhanced authentication, an Authentication Method named in CONNECT followed by AUTH packets
  (a challenge/response such as SCRAM): :meth:`Authenticator.exchange` returns an
  :class:`AuthExchange` for that method, or None when the method is not supported (CONNACK 0x8C).
  The same exchange serves re-authentication (AUTH 0x19) on an established connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from mypy_extensions import mypyc_attr

from ..protocol.reasons import ReasonCode

SUCCESS = "success"
CONTINUE = "continue"
FAIL = "fail"


@dataclass(slots=True)
class AuthOutcome:
    """One step's result: ``success`` (CONNACK or AUTH 0x00), ``continue`` (AUTH 0x18 carrying
    ``data``), or ``fail`` (CONNACK or DISCONNECT with ``reason_code``)."""

    status: str
    data: bytes | None = None
    reason_code: int = ReasonCode.NOT_AUTHORIZED
    username: str | None = None  # the identity the exchange established, if any


@dataclass(slots=True)
class LoginRequest:
    """A login to check: the CONNECT's client id, user name and password; ``anonymous``, the
    listener's rule for clients the authenticator cannot identify (no user name, or nothing to
    check a name against), overriding the authenticator's own (None: its own); ``address``,
    the client's (failed logins are counted per address), None if unknown."""

    client_id: str
    username: str | None
    password: bytes | None
    anonymous: bool | None = None
    address: str | None = None


class AuthExchange(Protocol):
    def step(self, data: bytes | None) -> AuthOutcome:
        """Take the client's Authentication Data (from CONNECT, or from its AUTH packets)."""
        ...


class Authenticator(Protocol):
    def check_password(self, login: LoginRequest) -> int:
        """The reason code for a CONNECT's user name and password (0 accepts)."""
        ...

    def exchange(
        self, method: str, client_id: str, username: str | None, address: str | None = None
    ) -> AuthExchange | None:
        """A new exchange for ``method``, or None if this broker does not support it."""
        ...


@mypyc_attr(allow_interpreted_subclasses=True)  # rules of a test or a plugin may extend it
class AllowAll:
    """The default: any user name and password is accepted; no enhanced method is supported."""

    def check_password(self, login: LoginRequest) -> int:
        return ReasonCode.SUCCESS

    def exchange(
        self, method: str, client_id: str, username: str | None, address: str | None = None
    ) -> AuthExchange | None:
        return None


class Pending(Exception):  # noqa: N818 (not an error: the answer is on its way)
    """Raised by an authorizer's ``ask_publish``/``ask_subscribe`` (optional methods, for an
    authorizer that asks a service: http_auth) when it has no answer yet: the connection holds
    its input from the packet that asked, and ``wait(resume)`` calls ``resume`` once the answer
    is in; the packet is then handled again and finds it."""

    def __init__(self, wait: Callable[[Callable[[], None]], None]) -> None:
        super().__init__("authorization pending")
        self.wait = wait


class Authorizer(Protocol):
    """Who may publish and subscribe where (an ACL). ``generation`` changes whenever the rules
    change (a reload), so connections may cache answers per generation."""

    generation: int

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool: ...

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        """Whether the subscription is granted (a filter reaching denied topics may be granted,
        those topics then withheld at delivery: see ``needs_read_check``)."""
        ...

    def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
        """Whether a message on ``topic`` may be delivered (checked for retained messages, and
        for each message through a subscription that ``needs_read_check``)."""
        ...

    def needs_read_check(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        """For a subscription ``can_subscribe`` granted: whether it can reach a topic the
        client may not read, so that each message through it must pass ``can_read``."""
        ...

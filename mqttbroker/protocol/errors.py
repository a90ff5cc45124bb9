"""Errors raised by the codec and the broker's rules, each carrying the reason code the spec
assigns to it. A connection that catches one answers with that code (CONNACK before the session
is established, DISCONNECT after it, in MQTT 5) and closes."""

from __future__ import annotations

from .reasons import ReasonCode


class MQTTError(Exception):
    """A violation by the remote side, answered with ``reason_code`` and a closed connection."""

    reason_code: int = ReasonCode.UNSPECIFIED_ERROR

    def __init__(self, message: str, reason_code: int | None = None) -> None:
        super().__init__(message)
        if reason_code is not None:
            self.reason_code = reason_code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class MalformedPacket(MQTTError):
    """The bytes cannot be parsed according to the spec (reason code 0x81)."""

    reason_code = ReasonCode.MALFORMED_PACKET


class ProtocolError(MQTTError):
    """The packet parses but breaks a rule of the protocol (reason code 0x82)."""

    reason_code = ReasonCode.PROTOCOL_ERROR


class UnsupportedProtocolVersion(MQTTError):
    """CONNECT names a protocol or level this broker does not speak (0x84)."""

    reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION


class PacketTooLarge(MQTTError):
    """The packet is larger than the maximum this side accepts (0x95)."""

    reason_code = ReasonCode.PACKET_TOO_LARGE


class LimitExceeded(MQTTError):
    """The packet is valid but past a limit of this implementation, e.g. too many User
    Properties (0x83: the spec's "valid but cannot be processed by this implementation")."""

    reason_code = ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR

"""protocol/reasons.py: MQTT 5 CONNACK reason codes mapped onto the 3.1.1 return codes (3.1.1 section 3.2.2.3), which
a 3.1.1 client gets for the same refusal."""

from __future__ import annotations

import pytest

from mqttbroker.protocol.reasons import ReasonCode, v311_connack_code


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        (ReasonCode.SUCCESS, 0),
        (ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, 1),  # unacceptable protocol version
        (ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, 2),  # identifier rejected
        (ReasonCode.SERVER_UNAVAILABLE, 3),  # server unavailable
        (ReasonCode.SERVER_BUSY, 3),
        (ReasonCode.QUOTA_EXCEEDED, 3),
        (ReasonCode.UNSPECIFIED_ERROR, 3),
        (ReasonCode.BAD_USER_NAME_OR_PASSWORD, 4),  # bad user name or password
        (ReasonCode.NOT_AUTHORIZED, 5),  # not authorized
        (ReasonCode.BANNED, 5),
    ],
)
def test_v311_client_gets_the_return_code_of_the_refusal(reason: int, code: int) -> None:
    assert v311_connack_code(reason) == code

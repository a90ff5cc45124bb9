"""BrokerOptions.check: every bound, on both sides (the last value allowed passes, the first one
past it fails with the message that names the option)."""

from __future__ import annotations

from typing import Any

import pytest

from mqttbroker.broker.options import BrokerOptions

NON_NEGATIVE = [
    "max_connections",
    "max_topic_length",
    "max_topic_levels",
    "max_subscriptions_per_client",
    "max_publish_burst",
    "max_retained",
    "max_sessions",
    "max_sessions_per_user",
    "max_subscription_bytes",
    "match_cache_size",
    "match_cache_bytes",
    "max_user_properties",
    "max_output_buffer",
    "max_publish_rate",
    "sys_interval",
    "max_connections_per_address",
]


# (option, values allowed, values refused, message)
BOUNDS: list[tuple[str, list[Any], list[Any], str]] = [
    ("max_packet_size", [1, 268_435_460], [0, 268_435_461], "between 1 and 268435460"),
    ("receive_maximum", [1, 65535], [0, 65536], "between 1 and 65535"),
    ("topic_alias_maximum", [0, 65535], [-1, 65536], "between 0 and 65535"),
    ("maximum_qos", [0, 1, 2], [-1, 3], "0, 1 or 2"),
    ("max_keepalive", [0, 65535], [-1, 65536], "between 0 and 65535"),
    ("connect_timeout", [0.001], [0, -1], "positive"),
    ("max_session_expiry", [0, 0xFFFFFFFF], [-1, 0x100000000], "between 0 and 4294967295"),
    ("max_inflight", [1, 65535], [0, 65536], "between 1 and 65535"),
    ("input_budget", [1], [0], "at least 1"),
    ("max_connect_size", [1, 268_435_460], [0, 268_435_461], "between 1 and 268435460"),
    ("shared_subscription_strategy", ["round_robin", "random", "sticky", "hash"], ["x"], ""),
    ("session_owner_mismatch", ["refuse", "new"], ["keep"], ""),
]


@pytest.mark.parametrize(
    ("name", "allowed", "refused", "message"), BOUNDS, ids=[b[0] for b in BOUNDS]
)
def test_each_option_takes_its_range_and_refuses_the_rest(
    name: str, allowed: list[Any], refused: list[Any], message: str
) -> None:
    for value in allowed:
        BrokerOptions(**{name: value}).check()
    for value in refused:
        with pytest.raises(ValueError, match=f"^{name} must be") as error:
            BrokerOptions(**{name: value}).check()
        assert message in str(error.value)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        *((name, f"{name} must not be negative") for name in NON_NEGATIVE),
        ("max_queued_messages", "max_queued_messages and max_queued_bytes must not be negative"),
        ("max_queued_bytes", "max_queued_messages and max_queued_bytes must not be negative"),
    ],
    ids=[*NON_NEGATIVE, "max_queued_messages", "max_queued_bytes"],
)
def test_zero_is_allowed_and_a_negative_value_refused(name: str, message: str) -> None:
    BrokerOptions(**{name: 0}).check()
    with pytest.raises(ValueError) as error:
        BrokerOptions(**{name: -1}).check()
    assert str(error.value) == message

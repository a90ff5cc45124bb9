"""The packet classes write their ``__init__`` out (so that, compiled, it runs as C): each must
take every field by name, store it, and give each packet a properties dict of its own."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from mqttbroker.protocol import packets as pk

CLASSES = [
    pk.Will,
    pk.Connect,
    pk.Connack,
    pk.Publish,
    pk.Puback,
    pk.Pubrec,
    pk.Pubrel,
    pk.Pubcomp,
    pk.SubscriptionRequest,
    pk.Subscribe,
    pk.Suback,
    pk.Unsubscribe,
    pk.Unsuback,
    pk.Pingreq,
    pk.Pingresp,
    pk.Disconnect,
    pk.Auth,
]

REQUIRED: dict[type, dict[str, Any]] = {
    pk.Will: {"topic": "t"},
    pk.Puback: {"packet_id": 1},
    pk.Pubrec: {"packet_id": 1},
    pk.Pubrel: {"packet_id": 1},
    pk.Pubcomp: {"packet_id": 1},
    pk.SubscriptionRequest: {"topic_filter": "t"},
    pk.Subscribe: {"packet_id": 1, "subscriptions": []},
    pk.Suback: {"packet_id": 1, "reason_codes": []},
    pk.Unsubscribe: {"packet_id": 1, "topic_filters": []},
    pk.Unsuback: {"packet_id": 1},
}


# The classes with fields (PINGREQ and PINGRESP have none), and of those the ones with a
# container among their defaults: what the two tests below can say something about.
WITH_FIELDS = [cls for cls in CLASSES if dataclasses.fields(cls)]
WITH_CONTAINERS = [
    cls
    for cls in WITH_FIELDS
    if any(
        isinstance(getattr(cls(**REQUIRED.get(cls, {})), f.name), (dict, list))
        and f.name not in REQUIRED.get(cls, {})
        for f in dataclasses.fields(cls)
    )
]

# Fields whose default is None: a value of the type they hold otherwise.
WHEN_NOT_NONE: dict[str, Any] = {
    "username": "user",
    "password": b"secret",
    "will": pk.Will("will"),
    "packet_id": 7,
}


def _other_value(name: str, default: Any, index: int) -> Any:
    """A value of the field's type that differs from its default and from the other fields'."""
    if default is None:
        return WHEN_NOT_NONE[name]
    if isinstance(default, bool):
        return not default
    made: dict[type, Any] = {
        str: f"value-{index}",
        int: 1000 + index,
        bytes: b"value-%d" % index,
        dict: {index: "value"},
        list: [index],
    }
    return made[type(default)]


@pytest.mark.parametrize("cls", WITH_FIELDS, ids=lambda c: c.__name__)
def test_every_field_is_taken_by_name_and_kept(cls: type) -> None:
    defaults = cls(**REQUIRED.get(cls, {}))
    fields = dataclasses.fields(cls)
    values = {
        f.name: _other_value(f.name, getattr(defaults, f.name), i) for i, f in enumerate(fields)
    }
    packet = cls(**values)
    for name, value in values.items():
        assert getattr(packet, name) == value, name
        if isinstance(value, (dict, list)):
            assert getattr(packet, name) is value, name


@pytest.mark.parametrize("cls", WITH_CONTAINERS, ids=lambda c: c.__name__)
def test_defaults_give_each_packet_its_own_containers(cls: type) -> None:
    one, two = cls(**REQUIRED.get(cls, {})), cls(**REQUIRED.get(cls, {}))
    assert one == two
    for f in dataclasses.fields(cls):
        value = getattr(one, f.name)
        if isinstance(value, (dict, list)) and f.name not in REQUIRED.get(cls, {}):
            assert value == type(value)()
            assert value is not getattr(two, f.name), f.name


def test_packet_types() -> None:
    expected = {
        pk.Connect: pk.CONNECT,
        pk.Connack: pk.CONNACK,
        pk.Publish: pk.PUBLISH,
        pk.Puback: pk.PUBACK,
        pk.Pubrec: pk.PUBREC,
        pk.Pubrel: pk.PUBREL,
        pk.Pubcomp: pk.PUBCOMP,
        pk.Subscribe: pk.SUBSCRIBE,
        pk.Suback: pk.SUBACK,
        pk.Unsubscribe: pk.UNSUBSCRIBE,
        pk.Unsuback: pk.UNSUBACK,
        pk.Pingreq: pk.PINGREQ,
        pk.Pingresp: pk.PINGRESP,
        pk.Disconnect: pk.DISCONNECT,
        pk.Auth: pk.AUTH,
    }
    for cls, ptype in expected.items():
        assert cls(**REQUIRED.get(cls, {})).packet_type == ptype, cls.__name__

"""The ACL file: parsing (Mosquitto's syntax and ours), errors naming file and line, and the
decisions: sections, %u/%c substitution, deny precedence, read and write kept apart, wildcard
subscriptions refused when they could reach a denied topic, reload generations."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttbroker.broker.topics import matches as reference_matches
from mqttbroker.security import AclAuthorizer, AclRules, SecurityFileError
from mqttbroker.security.filters import covers, matches, overlaps, split


def rules(text: str) -> AclRules:
    return AclRules.parse(text.encode(), "acl.txt")


def authorizer(text: str) -> AclAuthorizer:
    return AclAuthorizer(rules(text))


MOSQUITTO_EXAMPLE = """
# This affects access control for clients with no username.
topic read $SYS/#
topic read public/#

# This only affects clients with username "roger".
user roger
topic foo/bar
topic read sensors/#
topic deny sensors/secret/#

user writer
topic write sensors/#

# This affects all clients.
pattern write $SYS/broker/connection/%c/state
pattern readwrite users/%u/#
"""


# -- Mosquitto's syntax -----------------------------------------------------------------------


def test_anonymous_rules_apply_to_clients_without_a_user_name() -> None:
    acl = authorizer(MOSQUITTO_EXAMPLE)
    assert acl.can_subscribe("anon", None, "public/#")
    assert acl.can_read("anon", None, "$SYS/broker/uptime")
    assert not acl.can_publish("anon", None, "public/x")  # read only
    assert not acl.can_subscribe("anon", None, "foo/bar")
    # A user gets its own section, not the anonymous one.
    assert not acl.can_subscribe("c", "roger", "public/#")


def test_user_rules_and_default_access_readwrite() -> None:
    acl = authorizer(MOSQUITTO_EXAMPLE)
    assert acl.can_publish("c", "roger", "foo/bar")  # no access word: readwrite
    assert acl.can_subscribe("c", "roger", "foo/bar")
    assert not acl.can_publish("c", "roger", "foo/baz")
    assert acl.can_subscribe("c", "roger", "sensors/room1/temp")
    assert not acl.can_publish("c", "roger", "sensors/room1/temp")
    assert acl.can_publish("c", "writer", "sensors/room1/temp")
    assert not acl.can_subscribe("c", "writer", "sensors/room1/temp")  # write only
    assert not acl.can_publish("c", "nobody", "foo/bar")  # a user without a section


def test_deny_beats_allow_whatever_the_order() -> None:
    for text in (
        "topic read a/#\ntopic deny a/secret/#\n",
        "topic deny a/secret/#\ntopic read a/#\n",
    ):
        acl = authorizer(text)
        assert acl.can_read("c", None, "a/open")
        assert not acl.can_read("c", None, "a/secret/x")
        assert not acl.can_read("c", None, "a/secret")  # "#" covers the parent level too
        assert not acl.can_subscribe("c", None, "a/secret/x")


def test_patterns_substitute_user_and_client() -> None:
    acl = authorizer(MOSQUITTO_EXAMPLE)
    assert acl.can_publish("dev1", "roger", "users/roger/inbox")
    assert acl.can_subscribe("dev1", "roger", "users/roger/#")
    assert not acl.can_publish("dev1", "roger", "users/anna/inbox")
    assert not acl.can_subscribe("dev1", "roger", "users/+/inbox")  # reaches other users
    assert acl.can_publish("dev1", "roger", "$SYS/broker/connection/dev1/state")
    assert not acl.can_publish("dev1", "roger", "$SYS/broker/connection/dev2/state")
    # Anonymous clients: %c patterns apply, %u patterns do not.
    assert acl.can_publish("dev9", None, "$SYS/broker/connection/dev9/state")
    assert not acl.can_publish("dev9", None, "users//inbox")


@pytest.mark.parametrize(
    ("client_id", "username"),
    [
        ("dev1", "ro/ger"),  # would write into users/ro/...
        ("dev1", "+"),
        ("dev1", "#"),
        ("dev1", ""),
    ],
)
def test_unsafe_values_get_nothing_from_patterns(client_id: str, username: str) -> None:
    acl = authorizer("pattern readwrite users/%u/#\n")
    for topic in ("users/ro/x", "users/ro/ger/x", "users/x", "users/+/x", "users//x"):
        assert not acl.can_publish(client_id, username, topic)
    assert not acl.can_subscribe(client_id, username, "users/#")


def test_unsafe_values_make_denials_deny_everything() -> None:
    acl = authorizer("topic readwrite #\npattern deny private/%c/#\n")
    assert acl.can_publish("ok", None, "private/other/x")
    assert not acl.can_publish("ok", None, "private/ok/x")
    assert not acl.can_publish("a/b", None, "anything")
    assert not acl.can_read("a+b", None, "anything")
    assert not acl.can_subscribe("a#", None, "x")


def test_substitution_is_one_pass() -> None:
    """A user name holding "%c" must not be expanded again into the client id."""
    acl = authorizer("pattern readwrite users/%u/#\n")
    assert acl.can_publish("victim", "%c", "users/%c/x")
    assert not acl.can_publish("victim", "%c", "users/victim/x")


def test_substitution_cannot_reach_dollar_topics() -> None:
    acl = authorizer("pattern readwrite %u/#\n")
    assert acl.can_publish("c", "anna", "anna/x")
    assert not acl.can_publish("c", "$SYS", "$SYS/x")
    assert not acl.can_subscribe("c", "$SYS", "$SYS/#")


def test_pattern_applies_to_everyone_wherever_it_is_written() -> None:
    acl = authorizer("user anna\ntopic read anna/#\npattern read shared/%c\n")
    assert acl.can_read("bobs-phone", "bob", "shared/bobs-phone")
    assert acl.can_read("x", None, "shared/x")


def test_topic_with_spaces_and_topic_rest_of_line() -> None:
    acl = authorizer("topic read  room 1/temp  \n")
    assert acl.can_read("c", None, "room 1/temp")
    assert not acl.can_publish("c", None, "room 1/temp")


# -- our keywords -----------------------------------------------------------------------------


def test_allow_and_deny_one_access() -> None:
    acl = authorizer(
        "user anna\n"
        "allow readwrite devices/#\n"
        "deny write devices/+/firmware\n"
        "deny subscribe devices/+/keys\n"
    )
    assert acl.can_publish("c", "anna", "devices/d1/state")
    assert acl.can_read("c", "anna", "devices/d1/firmware")  # only write is denied
    assert not acl.can_publish("c", "anna", "devices/d1/firmware")
    assert acl.can_publish("c", "anna", "devices/d1/keys")  # only read is denied
    assert not acl.can_read("c", "anna", "devices/d1/keys")
    # devices/# reaches devices/+/keys: granted, those topics withheld at delivery
    assert acl.can_subscribe("c", "anna", "devices/#")
    assert acl.needs_read_check("c", "anna", "devices/#")
    assert acl.can_subscribe("c", "anna", "devices/+/firmware")
    assert not acl.needs_read_check("c", "anna", "devices/+/firmware")
    assert not acl.can_subscribe("c", "anna", "devices/d1/keys")  # denied whole


def test_client_sections_and_allow_with_placeholders() -> None:
    acl = authorizer(
        "client gateway-7\n"
        "allow publish telemetry/%c/#\n"
        "topic read commands/gateway-7\n"
        "user anna\n"
        "allow read telemetry/#\n"
    )
    assert acl.can_publish("gateway-7", None, "telemetry/gateway-7/t")
    assert acl.can_publish("gateway-7", "anna", "telemetry/gateway-7/t")  # client rules add up
    assert acl.can_read("gateway-7", "anna", "commands/gateway-7")
    assert not acl.can_publish("gateway-8", None, "telemetry/gateway-8/t")
    assert acl.can_subscribe("phone", "anna", "telemetry/#")
    assert not acl.can_publish("phone", "anna", "telemetry/phone/t")


def test_all_and_anonymous_sections() -> None:
    acl = authorizer(
        "user anna\n"
        "topic readwrite anna/#\n"
        "all\n"
        "deny write alerts/#\n"
        "allow read status\n"
        "anonymous\n"
        "topic read public/#\n"
    )
    assert acl.can_read("c", "anna", "status") and acl.can_read("c", None, "status")
    assert acl.can_read("c", None, "public/x")
    assert not acl.can_read("c", "anna", "public/x")
    assert acl.can_publish("c", "anna", "anna/x")


def test_all_denial_overrides_user_allowance() -> None:
    acl = authorizer(
        "user root\ntopic readwrite #\nall\ndeny publish $SYS/#\ndeny write alerts/#\n"
    )
    assert acl.can_publish("c", "root", "anything/else")
    assert not acl.can_publish("c", "root", "alerts/fire")
    assert acl.can_read("c", "root", "alerts/fire")


# -- subscriptions with wildcards -------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic_filter", "allowed"),
    [
        ("#", False),  # reaches secret/...
        ("+/x", False),  # reaches secret/x
        ("secret/#", False),
        ("secret", False),  # "secret/#" denies the parent too
        ("public/#", True),
        ("public/+/x", True),
        ("publics", True),
        ("+", False),  # matches the topic "secret", which "secret/#" denies
        ("+/+/+", False),  # matches secret/a/b
        ("public/+", True),
        ("$SYS/#", False),  # "#" in a rule does not reach $ topics
    ],
)
def test_wildcard_subscription_must_not_reach_a_denied_topic(
    topic_filter: str, allowed: bool
) -> None:
    """acl_partly_denied = "refuse"."""
    acl = AclAuthorizer(rules("topic read #\ntopic deny secret/#\n"), "refuse")
    assert acl.can_subscribe("c", None, topic_filter) is allowed


def test_subscription_must_be_covered_by_one_allowance() -> None:
    acl = authorizer("topic read a/b/#\ntopic read a/+/c\ntopic read $SYS/broker/#\n")
    assert acl.can_subscribe("c", None, "a/b/#")
    assert acl.can_subscribe("c", None, "a/b/c/d")
    assert acl.can_subscribe("c", None, "a/+/c")
    assert acl.can_subscribe("c", None, "a/x/c")
    assert not acl.can_subscribe("c", None, "a/#")
    assert not acl.can_subscribe("c", None, "a/+/#")
    assert not acl.can_subscribe("c", None, "+/b/#")
    assert acl.can_subscribe("c", None, "$SYS/broker/uptime")
    assert not acl.can_subscribe("c", None, "$SYS/#")


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("topic", "'topic' needs a topic"),
        ("topic read", "'topic read' needs a topic"),
        ("pattern deny", "'pattern deny' needs a topic"),
        ("topic read a/#/b", "invalid topic filter 'a/#/b'"),
        ("topic read a+/b", "invalid topic filter 'a+/b'"),
        ("pattern write x/%u+/y", "invalid topic filter"),
        ("user", "'user' needs a name"),
        ("client", "'client' needs a name"),
        ("all now", "'all' takes nothing after it"),
        ("allow a/b", "expected 'allow read|write|readwrite TOPIC'"),
        ("deny maybe a/b", "expected 'deny read|write|readwrite TOPIC'"),
        ("Topic read a", "unknown keyword 'Topic'"),
        ("permit read a", "unknown keyword 'permit'"),
    ],
)
def test_errors_name_file_and_line(line: str, message: str) -> None:
    text = f"# comment\ntopic read ok/#\n\nuser anna\n{line}\ntopic read more\n"
    with pytest.raises(SecurityFileError) as info:
        rules(text)
    assert str(info.value).startswith("acl.txt:5: ")
    assert message in str(info.value)


def test_empty_file_denies_everything() -> None:
    acl = authorizer("# nothing allowed\n")
    assert not acl.can_publish("c", None, "a")
    assert not acl.can_read("c", "u", "a")
    assert not acl.can_subscribe("c", None, "a")


def test_generation_moves_on_each_replace() -> None:
    acl = authorizer("topic read a\n")
    assert acl.generation == 0
    assert acl.can_read("c", None, "a")
    acl.replace(rules("topic read b\n"))
    assert acl.generation == 1
    assert not acl.can_read("c", None, "a")
    assert acl.can_read("c", None, "b")
    acl.replace(rules("topic read b\n"))
    assert acl.generation == 2


def test_rule_count() -> None:
    assert rules(MOSQUITTO_EXAMPLE).rule_count == 8


# -- the filter algebra against brute force ---------------------------------------------------

NAMES = ["a", "b", "$s"]
UNIVERSE_NAMES = ["a", "b", "$s", "z", ""]  # "z": a name no filter uses; "": an empty level
UNIVERSE = [
    levels
    for depth in range(1, 5)
    for levels in itertools.product(UNIVERSE_NAMES, repeat=depth)
    if levels != ("",)  # a topic name has at least one character
]

filters = st.lists(st.sampled_from([*NAMES, "+"]), min_size=1, max_size=3).flatmap(
    lambda levels: st.sampled_from([tuple(levels), (*levels, "#"), tuple(levels[:-1]) + ("#",)])
)


def test_matches_agrees_with_the_broker() -> None:
    for pattern in ["#", "+", "a/#", "+/b", "$s/#", "a/+/#", "a"]:
        for topic in UNIVERSE:
            expected = reference_matches(pattern, "/".join(topic))
            assert matches(split(pattern), topic) is expected, (pattern, topic)


@settings(max_examples=200, deadline=None)
@given(outer=filters, inner=filters)
def test_covers_is_exact(outer: tuple[str, ...], inner: tuple[str, ...]) -> None:
    brute = all(matches(outer, t) for t in UNIVERSE if matches(inner, t))
    assert covers(outer, inner) is brute


@settings(max_examples=200, deadline=None)
@given(first=filters, second=filters)
def test_overlaps_is_exact(first: tuple[str, ...], second: tuple[str, ...]) -> None:
    brute = any(matches(first, t) and matches(second, t) for t in UNIVERSE)
    assert overlaps(first, second) is brute
    assert overlaps(second, first) is brute


# -- subscriptions a denial reaches in part -----------------------------------------------------

PARTLY = "topic readwrite #\ntopic deny secret/x\ntopic deny vault/#\n"


@pytest.mark.parametrize(
    ("topic_filter", "granted", "checked"),
    [
        ("#", True, True),  # reaches secret/x: granted, each message checked
        ("+/+", True, True),
        ("secret/+", True, True),
        ("vault/+/y", False, False),  # vault/# denies everything it reaches
        ("secret/x", False, False),
        ("public/#", True, False),  # no denial inside: nothing checked per message
        ("public/+", True, False),
    ],
)
def test_partly_denied_filters_are_granted_and_marked(
    topic_filter: str, granted: bool, checked: bool
) -> None:
    """Mosquitto's semantics (the default, acl_partly_denied = "filter")."""
    acl = authorizer(PARTLY)
    assert acl.can_subscribe("c", None, topic_filter) is granted
    if granted:
        assert acl.needs_read_check("c", None, topic_filter) is checked


def test_partly_denied_filters_refused_when_configured() -> None:
    acl = AclAuthorizer(rules(PARTLY), "refuse")
    assert not acl.can_subscribe("c", None, "#")
    assert not acl.can_subscribe("c", None, "secret/+")
    assert acl.can_subscribe("c", None, "public/#")
    assert not acl.needs_read_check("c", None, "public/#")

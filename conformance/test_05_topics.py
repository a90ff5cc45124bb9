"""Topic names, topic filters and wildcards (sections 4.7 and 1.5.4)."""

from __future__ import annotations

import pytest

from .mqtt import SUBACK, publish, string, subscribe, unsubscribe

INVALID_FILTERS = ["{t}/#/x", "{t}#", "{t}/x#", "{t}/#/", "{t}/x+", "{t}/+x/y", "{t}/a+b"]


def _expect_filter_refused(c, topic_filter: str) -> None:
    """An invalid filter is refused: SUBACK 0x8F (Topic Filter invalid), or a DISCONNECT
    (0x81, 0x82 or 0x8F) and close. It is never granted."""
    c.send(subscribe(3, [(topic_filter, 1)]))
    pkt = c.read()
    if pkt.type == SUBACK:
        assert pkt.packet_id == 3 and pkt.reason_codes == [0x8F], f"{topic_filter!r}: {pkt!r}"
        return
    assert pkt.type == 14, f"{topic_filter!r}: expected SUBACK 0x8F or DISCONNECT, got {pkt!r}"
    assert pkt.reason_code in (0x81, 0x82, 0x8F), pkt
    c.expect_closed()


def test_wildcard_matching(clients, topic):
    """'#' matches the parent level and any number of levels; '+' matches exactly one level,
    empty levels included, at any position. [MQTT-4.7.1-1] [MQTT-4.7.1-2] [MQTT-3.3.2-3]"""
    root = topic.split("/")[0]
    uid = topic.split("/")[1]
    cases = {
        f"{topic}/#": {topic, f"{topic}/a", f"{topic}/a/b", f"{topic}/", f"{topic}//x"},
        f"{topic}/+": {f"{topic}/a", f"{topic}/"},
        f"{topic}/+/b": {f"{topic}/a/b"},
        f"{topic}/+/+": {f"{topic}/a/b", f"{topic}//x"},
        f"+/{uid}/+": {f"{topic}/a", f"{topic}/"},
        f"+/{uid}": {topic},
        f"{root}/+/a/#": {f"{topic}/a", f"{topic}/a/b"},
        f"{topic}//x": {f"{topic}//x"},
    }
    published = [topic, f"{topic}/a", f"{topic}/a/b", f"{topic}/", f"{topic}//x", f"{topic}x"]
    subs = {}
    for topic_filter in cases:
        s = clients.connected()
        assert s.subscribe(topic_filter).reason_codes == [0], topic_filter
        subs[topic_filter] = s
    pub = clients.connected()
    for name in published:
        pub.publish_acked(name, name.encode(), qos=1)
    for topic_filter, expected in cases.items():
        got = subs[topic_filter].drain()
        assert all(p.payload == p.topic.encode() for p in got)
        assert {p.topic for p in got} == expected, f"filter {topic_filter!r}"
        assert len(got) == len(expected), f"filter {topic_filter!r}: duplicates {got!r}"


@pytest.mark.parametrize("pattern", INVALID_FILTERS)
def test_invalid_wildcard_filters_refused(clients, topic, pattern):
    """'#' must be last and alone in its level; '+' must fill its level: other filters are
    refused. [MQTT-4.7.1-1] [MQTT-4.7.1-2]"""
    _expect_filter_refused(clients.connected(), pattern.format(t=topic))


def test_mixed_valid_and_invalid_filters(clients, topic):
    """In a SUBSCRIBE mixing valid and invalid filters, a broker that answers with SUBACK gives
    each filter its own code, in order. [MQTT-3.9.3-1] [MQTT-3.9.3-2] [MQTT-4.7.1-1]"""
    c = clients.connected()
    c.send(subscribe(4, [(f"{topic}/a", 1), (f"{topic}/#/b", 0), (f"{topic}/+", 2)]))
    pkt = c.read()
    if pkt.type != SUBACK:
        assert pkt.type == 14 and pkt.reason_code in (0x81, 0x82, 0x8F), pkt
        c.expect_closed()
        pytest.skip("the broker refuses the whole SUBSCRIBE with DISCONNECT (allowed)")
    assert pkt.reason_codes == [1, 0x8F, 2], pkt


def test_dollar_topics_not_matched_by_leading_wildcards(clients, uid):
    """Filters starting with '#' or '+' do not match topic names starting with '$'; a filter
    naming the '$' level does. [MQTT-4.7.2-1]"""
    dollar = f"${uid}/x"
    hash_all = clients.connected()
    hash_all.subscribe("#")
    plus = clients.connected()
    plus.subscribe("+/x", "+/+")
    explicit = clients.connected()
    explicit.subscribe(f"${uid}/#", f"${uid}/+")
    pub = clients.connected()
    pub.publish_acked(dollar, b"dollar", qos=1)
    got = explicit.drain()
    if not got:
        pytest.skip("the broker does not accept PUBLISH to '$' topics from clients")
    assert {p.topic for p in got} == {dollar}
    for s in (hash_all, plus):
        leaked = [p for p in s.drain() if p.topic.startswith("$")]
        assert not leaked, f"'$' topic matched a leading wildcard: {leaked!r}"


@pytest.mark.parametrize("name", ["{t}/+", "{t}/#", "+", "{t}/a+"])
def test_wildcard_in_topic_name(clients, topic, name):
    """A PUBLISH Topic Name may not contain '+' or '#': the connection is closed (DISCONNECT
    0x81, 0x82 or 0x90 if any). [MQTT-3.3.2-2] [MQTT-4.7.0-1] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.publish(name.format(t=topic), b"x")
    c.expect_disconnect({0x81, 0x82, 0x90})


def test_empty_topic_name(clients):
    """A Topic Name has at least one character: an empty one without a Topic Alias is a
    Protocol Error. [MQTT-4.7.3-1] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.publish("", b"x")
    c.expect_disconnect({0x81, 0x82})


def test_empty_topic_filter(clients):
    """A Topic Filter has at least one character. [MQTT-4.7.3-1]"""
    _expect_filter_refused(clients.connected(), "")


def test_null_character_in_topic_name(clients, topic):
    """U+0000 in a Topic Name makes the PUBLISH malformed: DISCONNECT 0x81 (if any) and close.
    [MQTT-4.7.3-2] [MQTT-1.5.4-2] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.publish(topic.encode() + b"/a\x00b", b"x")
    c.expect_disconnect({0x81})


def test_null_character_in_topic_filter(clients, topic):
    """U+0000 in a Topic Filter makes the SUBSCRIBE malformed. [MQTT-4.7.3-2] [MQTT-1.5.4-2]"""
    c = clients.connected()
    c.send(subscribe(1, [(topic.encode() + b"/\x00", 0)]))
    c.expect_disconnect({0x81})


def test_null_character_in_unsubscribe_filter(clients, topic):
    """U+0000 in an UNSUBSCRIBE Topic Filter makes it malformed. [MQTT-4.7.3-2] [MQTT-1.5.4-2]"""
    c = clients.connected()
    c.send(unsubscribe(1, [topic.encode() + b"/\x00"]))
    c.expect_disconnect({0x81})


@pytest.mark.parametrize(
    "bad",
    [b"/\xff", b"/\xed\xa0\x80", b"/\xc0\xaf", b"/\xe2\x82"],
    ids=["ff", "surrogate", "overlong", "truncated"],
)
def test_ill_formed_utf8_topic_name(clients, topic, bad):
    """A Topic Name that is not well-formed UTF-8 (invalid byte, surrogate, overlong, truncated
    sequence) makes the PUBLISH malformed: DISCONNECT 0x81 (if any) and close.
    [MQTT-1.5.4-1] [MQTT-3.3.2-1] [MQTT-4.13.1-1]"""
    c = clients.connected()
    c.publish(topic.encode() + bad, b"x")
    c.expect_disconnect({0x81})


def test_byte_order_mark_preserved(clients, topic):
    """EF BB BF in a string is U+FEFF: it is neither skipped nor stripped, so a topic with it is
    a different topic, forwarded byte for byte. [MQTT-1.5.4-3] [MQTT-4.7.3-4]"""
    with_bom = f"\ufeff{topic}/\ufeffx"
    without = f"{topic}/x"
    s_bom = clients.connected()
    s_bom.subscribe(with_bom)
    s_plain = clients.connected()
    s_plain.subscribe(without)
    pub = clients.connected()
    pub.publish_acked(with_bom, b"bom", qos=1)
    pub.publish_acked(without, b"plain", qos=1)
    got = s_bom.drain()
    assert [p.payload for p in got] == [b"bom"], got
    assert got[0].raw.startswith(b"\x30" + got[0].raw[1:2] + string(with_bom)), got[0].raw.hex()
    assert [p.payload for p in s_plain.drain()] == [b"plain"]


def test_no_normalization_in_matching(clients, topic):
    """Topic matching compares strings exactly: no Unicode normalization, no case folding.
    [MQTT-4.7.3-4]"""
    composed = f"{topic}/caf\u00e9"
    decomposed = f"{topic}/cafe\u0301"
    s = clients.connected()
    s.subscribe(composed)
    pub = clients.connected()
    pub.publish_acked(decomposed, b"decomposed", qos=1)
    pub.publish_acked(f"{topic}/CAF\u00c9", b"upper", qos=1)
    pub.publish_acked(composed, b"composed", qos=1)
    got = s.drain()
    assert [p.payload for p in got] == [b"composed"], got
    assert got[0].topic == composed


def test_topic_name_with_spaces_and_unicode(clients, topic):
    """Topic Names may hold any Unicode except U+0000 and wildcards: spaces, '$' later in the
    name and non-ASCII characters round-trip unchanged. [MQTT-4.7.3-4]"""
    name = f"{topic}/ a b /$x/\u00fc\U0001f600"
    s = clients.connected()
    s.subscribe(name)
    clients.connected().send(publish(name, b"odd"))
    s.expect_publish(name, b"odd")

"""The route table: which other nodes a topic goes to (no Redis needed)."""

from __future__ import annotations

from mqttbroker.cluster.routes import RouteTable


def test_a_topic_goes_to_the_nodes_with_matching_filters_only() -> None:
    table = RouteTable()
    table.add("b", "sensors/+/temp")
    table.add("c", "sensors/#")
    table.add("d", "other/topic")
    assert table.match("sensors/1/temp") == ("b", "c")
    assert table.match("sensors") == ("c",)  # "#" includes the parent level
    assert table.match("sensors/1/hum") == ("c",)
    assert table.match("other/topic") == ("d",)
    assert table.match("nothing/here") == ()


def test_wildcards_do_not_match_dollar_topics_at_the_first_level() -> None:
    table = RouteTable()
    table.add("b", "#")
    table.add("c", "+/x")
    table.add("d", "$SYS/#")
    assert table.match("$SYS/x") == ("d",)  # MQTT-4.7.2-1
    assert table.match("a/x") == ("b", "c")


def test_removal_and_snapshot_replace_update_cached_answers() -> None:
    table = RouteTable()
    table.add("b", "a/+")
    table.add("b", "a/b")
    assert table.match("a/b") == ("b",)
    table.remove("b", "a/+")
    assert table.match("a/b") == ("b",)  # a/b still there
    table.remove("b", "a/b")
    assert table.match("a/b") == ()
    assert table.filters == {}
    table.replace("c", {"x/#"})
    assert table.match("x/y") == ("c",)
    table.replace("c", set())
    assert table.match("x/y") == ()

"""The route table: which other nodes a topic goes to (no Redis needed)."""

from __future__ import annotations

from mqttbroker.cluster.routes import RouteTable


def routes(*pairs: tuple[str, str]) -> RouteTable:
    """A route table with each ``(node, topic filter)`` added in order."""
    table = RouteTable()
    for node, topic_filter in pairs:
        table.add(node, topic_filter)
    return table


def test_a_topic_goes_to_the_nodes_with_matching_filters_only() -> None:
    table = routes(("b", "sensors/+/temp"), ("c", "sensors/#"), ("d", "other/topic"))
    assert table.match("sensors/1/temp") == (("b", "c"), {})
    assert table.match("sensors")[0] == ("c",)  # "#" includes the parent level
    assert table.match("sensors/1/hum")[0] == ("c",)
    assert table.match("other/topic")[0] == ("d",)
    assert table.match("nothing/here")[0] == ()


def test_wildcards_do_not_match_dollar_topics_at_the_first_level() -> None:
    table = routes(("b", "#"), ("c", "+/x"), ("d", "$SYS/#"))
    assert table.match("$SYS/x")[0] == ("d",)  # MQTT-4.7.2-1
    assert table.match("a/x")[0] == ("b", "c")


def test_removal_and_snapshot_replace_update_cached_answers() -> None:
    table = routes(("b", "a/+"), ("b", "a/b"))
    assert table.match("a/b")[0] == ("b",)
    table.remove("b", "a/+")
    assert table.match("a/b")[0] == ("b",)  # a/b still there
    table.remove("b", "a/b")
    assert table.match("a/b")[0] == ()
    assert table.filters == {}
    table.replace("c", {"x/#"})
    assert table.match("x/y")[0] == ("c",)
    table.replace("c", set())
    assert table.match("x/y")[0] == ()


def test_a_shared_subscription_is_a_route_of_its_own() -> None:
    table = routes(
        ("b", "$share/g/a/+"), ("c", "$share/g/a/+"), ("c", "$share/h/a/#"), ("d", "a/x")
    )
    assert table.match("a/x") == (("d",), {"$share/g/a/+": ("b", "c"), "$share/h/a/#": ("c",)})
    table.remove("b", "$share/g/a/+")
    assert table.match("a/x")[1]["$share/g/a/+"] == ("c",)
    table.remove("c", "$share/g/a/+")
    assert "$share/g/a/+" not in table.match("a/x")[1]

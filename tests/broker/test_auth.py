"""broker/auth.py: a right the authorizer cannot answer yet (auth.Pending, http_auth's acl_url) in
the sans-I/O core: the connection holds the packet that asked and everything after it, reads
nothing more, and goes on in order once the answer is in; a SUBSCRIBE waits whole (nothing
subscribed before every filter is answered); other clients go on meanwhile; a connection closed
meanwhile stays closed. The real service behind it: tests/access/test_http_auth_service.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.harness import Harness

from mqttbroker.broker.auth import Pending
from mqttbroker.broker.state import CLOSED
from mqttbroker.protocol import packets as pk


class Asking:
    """An authorizer with answers for some topics; the others are Pending until ``answer``."""

    generation = 0

    def __init__(self) -> None:
        self.answers: dict[str, bool] = {}
        self.waiting: list[Callable[[], None]] = []
        self.asked: list[str] = []

    def answer(self, topic: str, allowed: bool) -> None:
        self.answers[topic] = allowed
        waiting, self.waiting = self.waiting, []
        for resume in waiting:
            resume()

    def _ask(self, topic: str) -> bool:
        self.asked.append(topic)
        if topic not in self.answers:
            raise Pending(self.waiting.append)
        return self.answers[topic]

    def ask_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return self._ask(topic)

    def ask_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return self._ask(topic_filter)

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return self.answers.get(topic, False)

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return self.answers.get(topic_filter, False)

    def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
        return True

    def needs_read_check(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return False


@pytest.fixture
def h() -> Harness:
    return Harness()


def acks(client: object) -> list[tuple[int, int]]:
    return [(p.packet_id, p.reason_code) for p in client.receive() if isinstance(p, pk.Puback)]  # type: ignore[attr-defined]


def test_a_publish_waits_for_its_answer_and_what_follows_waits_behind_it(h: Harness) -> None:
    rights = Asking()
    rights.answers["known"] = True
    h.broker.authorizer = rights
    rights.answers["#"] = True
    watcher = h.connect("watcher")
    watcher.subscribe("#", 1)
    client = h.connect("c")
    other = h.connect("other")
    first = client.publish("new", b"1", qos=1)
    second = client.publish("known", b"2", qos=1)
    assert acks(client) == [] and client.link.reading_paused
    assert rights.asked.count("new") == 1  # held, not asked again for what came after it
    other.publish("known", b"3", qos=1)  # another client is not held
    assert [p.payload for p in watcher.publishes()] == [b"3"]
    rights.answer("new", True)
    assert acks(client) == [(first, 0), (second, 0)]
    assert [p.payload for p in watcher.publishes()] == [b"1", b"2"]
    assert not client.link.reading_paused
    assert client.conn.input.publishes == 2


def test_a_denied_answer_refuses_the_publish(h: Harness) -> None:
    rights = Asking()
    h.broker.authorizer = rights
    client = h.connect("c")
    packet_id = client.publish("secret", b"1", qos=1)
    rights.answer("secret", False)
    assert acks(client) == [(packet_id, 0x87)]
    assert h.broker.stats.denied == 1


def test_a_subscribe_waits_whole(h: Harness) -> None:
    rights = Asking()
    rights.answers["a/#"] = True
    h.broker.authorizer = rights
    client = h.connect("c")
    packet_id = client.next_id()
    requests = [pk.SubscriptionRequest("a/#", 1), pk.SubscriptionRequest("b/#", 1)]
    client.send(pk.Subscribe(packet_id, requests, {}))
    assert client.receive() == [] and client.session.subscriptions == {}
    rights.answer("b/#", False)
    suback = client.one(pk.Suback)
    assert suback.reason_codes == [1, 0x87]
    assert list(client.session.subscriptions) == ["a/#"]


def test_a_connection_closed_while_it_waits_stays_closed(h: Harness) -> None:
    rights = Asking()
    h.broker.authorizer = rights
    client = h.connect("c")
    client.publish("slow", b"1", qos=1)
    client.lose()
    rights.answer("slow", True)
    assert client.conn.state == CLOSED and client.receive() == []
    assert client.conn not in h.broker.connections
    h.check_no_write_after_close()

"""The admin API's listings page with bounded work: thousands of sessions, subscriptions and
retained messages in one broker (in-process), and a request examines at most
``paging.SCAN_LIMIT`` entries however sparse its filter, answering with a cursor to go on from;
following the cursors gives every match exactly once. The sessions sorted by oldest queued age
are sorted from the broker's backlog index, without a walk over all sessions."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from support.harness import FakeClock

from mqttbroker.broker.core import Broker
from mqttbroker.broker.message import Message
from mqttbroker.broker.session import Session
from mqttbroker.broker.topics import Subscription, matches
from mqttbroker.ops import alerts, paging
from mqttbroker.ops.alerts import Survey
from mqttbroker.ops.api import Api

DEVICES = 3000
RARE = (7, 1500, 2990)  # the devices that also have an alarm
BOUND = 300  # SCAN_LIMIT in these tests


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> tuple[Broker, Api, FakeClock]:
    """A broker with DEVICES offline persistent sessions, each subscribed to its device's
    telemetry (RARE ones to its alarms too; every 10th to commands for all, a few of them in a
    shared group), and a retained message per device."""
    monkeypatch.setattr(paging, "SCAN_LIMIT", BOUND)
    clock = FakeClock()
    broker = Broker(clock=clock)
    for n in range(DEVICES):
        client_id = f"device-{n}"
        session = broker.sessions[client_id] = Session(
            client_id, broker.options, broker.store, broker.backlog
        )
        session.expiry_interval = 3600
        filters = [f"dev/{n}/temp"] + ([f"dev/{n}/alarm"] if n in RARE else [])
        if n % 10 == 0:  # 500 subscriptions in one node: pages resume inside it
            filters.append("$share/workers/cmd/all" if n in (0, 10, 20) else "cmd/all")
        if n == 1:
            filters.append("$SYS/broker/#")  # out of reach of a wildcard at the top
        for topic_filter in filters:
            sub = Subscription(session, topic_filter, 1)
            broker.router.subscribe(sub)
            session.add_subscription(sub)
        kept = "alarm" if n in RARE else "temp"
        broker.router.retained.store(Message(f"dev/{n}/{kept}/last", b"21.5", 0, True))
    return broker, Api(broker, Survey(broker, 60), [], list), clock


def call(api: Api, handler: str, path: str) -> dict[str, Any]:
    async def run() -> Any:
        return await getattr(api, handler)(make_mocked_request("GET", path))

    response = asyncio.run(run())
    assert response.status == 200, response.text
    return json.loads(response.text)  # type: ignore[no-any-return]


def pages(api: Api, handler: str, path: str) -> Iterator[dict[str, Any]]:
    """Every page of a listing, following next_cursor."""
    page = call(api, handler, path)
    yield page
    while page["next_cursor"] is not None:
        page = call(api, handler, f"{path}&cursor={page['next_cursor']}")
        yield page


def test_a_sparse_subscription_filter_pages_with_bounded_work(
    fleet: tuple[Broker, Api, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, api, _ = fleet
    visited = [0]
    walk = paging._nodes

    def counted(*args: Any) -> Iterator[Any]:
        for node in walk(*args):
            visited[0] += 1
            yield node

    monkeypatch.setattr(paging, "_nodes", counted)
    found: list[tuple[str, str]] = []
    requests = 0
    for page in pages(api, "subscriptions", "/api/v1/subscriptions?filter=dev/%2B/alarm"):
        requests += 1
        assert visited[0] <= BOUND + 1, f"request {requests} visited {visited[0]} nodes"
        visited[0] = 0
        found += [(item["client_id"], item["filter"]) for item in page["items"]]
    # The 3,000 device nodes take more than one request's bound: so many pages, each bounded.
    assert requests >= DEVICES // BOUND
    assert sorted(found) == sorted((f"device-{n}", f"dev/{n}/alarm") for n in RARE)


def test_subscription_pages_cover_every_match_once(fleet: tuple[Broker, Api, FakeClock]) -> None:
    broker, api, _ = fleet
    every = list(broker.router.trie)
    for pattern in ("#", "dev/+/temp", "dev/42/+", "+/+/+", "cmd/all", "$SYS/#", "nothing/#"):
        path = "/api/v1/subscriptions?limit=700&filter=" + pattern.replace("#", "%23")
        found = [
            (item["client_id"], item["filter"])
            for page in pages(api, "subscriptions", path.replace("+", "%2B"))
            for item in page["items"]
        ]
        expected = [
            (sub.session.client_id, sub.topic_filter)
            for sub in every
            if matches(pattern, sub.filter)
        ]
        assert len(found) == len(set(found)), pattern  # none twice
        assert sorted(found) == sorted(expected), pattern


SPARSE = [
    (
        "retained",
        "/api/v1/retained?filter=dev/%2B/alarm/%23",
        "topic",
        sorted(f"dev/{n}/alarm/last" for n in RARE),
    ),
    (
        "sessions",
        "/api/v1/sessions?client_id=device-299",
        "client_id",
        ["device-299", *(f"device-{n}" for n in range(2990, 3000))],
    ),
]


@pytest.mark.parametrize(
    ("listing", "url", "key", "expected"), SPARSE, ids=["retained filter", "session prefix"]
)
def test_a_sparse_listing_pages_with_bounded_work(
    fleet: tuple[Broker, Api, FakeClock], listing: str, url: str, key: str, expected: list[str]
) -> None:
    """A listing whose few matches are spread over many entries comes in many pages, each of
    bounded work, and every match comes once."""
    _, api, _ = fleet
    got = list(pages(api, listing, url))
    assert len(got) >= DEVICES // BOUND
    assert sorted(item[key] for page in got for item in page["items"]) == expected


class Unwalkable(dict[str, Session]):
    """The broker's sessions, which a request may look up but must not walk."""

    def _walked(self, *args: Any) -> Any:
        raise AssertionError("a request walked all the sessions")

    __iter__ = values = items = keys = _walked  # type: ignore[assignment]


def test_sessions_sorted_by_oldest_queued_age_come_from_the_backlog(
    fleet: tuple[Broker, Api, FakeClock],
) -> None:
    broker, api, clock = fleet
    router = broker.router
    waiting = random.Random(16).sample(range(DEVICES), 5)
    for n in waiting:  # one message each, a second apart: the first one waits longest
        topic = f"dev/{n}/temp"
        match = router.lookup(topic)
        assert match is not None
        router.publish(Message(topic, b"1", 1, False), match, None, clock.now)
        clock.now += 1.0
    ended = broker.sessions[f"device-{waiting[2]}"]
    broker.end_session(ended, clock.now)
    revoked = broker.sessions[f"device-{waiting[3]}"]
    assert revoked.drop_unreadable(lambda topic: False, clock.now) == 1  # leaves the index
    broker.sessions = Unwalkable(broker.sessions)
    page = call(api, "sessions", "/api/v1/sessions?sort=oldest_queued_age&limit=2")
    ids = [item["client_id"] for item in page["items"]]
    assert ids == [f"device-{waiting[0]}", f"device-{waiting[1]}"]
    assert page["items"][0]["oldest_queued_age"] == 5.0
    rest = call(
        api, "sessions", f"/api/v1/sessions?sort=oldest_queued_age&cursor={page['next_cursor']}"
    )
    assert [item["client_id"] for item in rest["items"]] == [f"device-{waiting[4]}"]
    assert rest["next_cursor"] is None
    assert set(broker.backlog) == {
        broker.sessions[f"device-{n}"] for n in waiting[:2] + waiting[4:]
    }


def test_shared_groups_page_by_filter(fleet: tuple[Broker, Api, FakeClock]) -> None:
    _, api, _ = fleet
    listing = list(pages(api, "shared", "/api/v1/shared?filter=%2B/all"))
    groups = [group for page in listing for group in page["items"]]
    assert [(g["filter"], g["group"]) for g in groups] == [("$share/workers/cmd/all", "workers")]
    members = {m["client_id"] for m in groups[0]["members"]}
    assert members == {"device-0", "device-10", "device-20"}


def test_the_survey_counts_in_bounded_slices_and_sees_stuck_sessions_at_once(
    fleet: tuple[Broker, Api, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The once-a-second survey behind /metrics and the alarms counts at most CENSUS_SLICE
    sessions per survey (the totals of the last complete pass are reported), while the queued
    figures and the stuck alarms come from the backlog index at every survey."""
    broker, _, clock = fleet
    monkeypatch.setattr(alerts, "CENSUS_SLICE", 1000)
    survey = Survey(broker, 60)
    topic = f"dev/{RARE[1]}/alarm"
    match = broker.router.lookup(topic)
    assert match is not None
    broker.router.publish(Message(topic, b"hot", 1, False), match, None, clock.now)
    clock.now += 61.0
    passes = []
    for n in range(DEVICES // 1000):
        figures = survey.current()
        assert survey.counted <= 1000
        assert figures.stuck == {f"device-{RARE[1]}": 61.0 + n}  # from the first survey on
        assert figures.queued == 1
        passes.append(figures.census.sessions_offline)
        clock.now += 1.0
    assert passes == [0] * (DEVICES // 1000 - 1) + [DEVICES]  # the last survey completes it
    assert survey.alerts == 1

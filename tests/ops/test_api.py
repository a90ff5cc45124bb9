"""The JSON API against a real broker with real clients (paho, mosquitto_pub): every answer is
checked against the OpenAPI document the broker serves; bad input gets a 4xx JSON error."""

from __future__ import annotations

from typing import Any

import pytest
from openapi_spec_validator import validate
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from support.admin_client import OPENAPI, Admin, AdminBroker, check
from support.clients import MQTT_311, TIMEOUT, Paho, unique
from support.launcher import mosquitto_client


def persistent() -> Properties:
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 300
    return props


def mosquitto_pub(admin: Admin, *args: str) -> None:
    """mosquitto_pub with ``args`` against the admin's broker."""
    mosquitto_client("mosquitto_pub", admin.broker.host, admin.broker.port, *args, timeout=TIMEOUT)


def test_the_openapi_document_is_valid_and_served(admin_broker: AdminBroker) -> None:
    validate(OPENAPI)
    admin = admin_broker()
    reply = admin.get("/api/v1/openapi.json")
    assert reply.status == 200
    assert reply.body == OPENAPI


def test_healthz_says_alive_and_readyz_ready(admin_broker: AdminBroker) -> None:
    admin = admin_broker()
    assert admin.get("/healthz").body == {"status": "alive"}
    reply = admin.get("/readyz")
    assert (reply.status, reply.body) == (200, {"ready": True})


def test_clients_list_a_connected_paho_client(admin_broker: AdminBroker, paho: Paho) -> None:
    admin = admin_broker()
    topic = unique("api")
    client = paho(admin, client_id=unique("listed"))
    client.subscribe(topic + "/#", qos=1)
    old = paho(admin, client_id=unique("other"), version=MQTT_311)
    page = admin.ok("GET", "/api/v1/clients")
    ids = {item["client_id"] for item in page["items"]}
    assert {client.client_id, old.client_id} <= ids
    mine = admin.ok("GET", f"/api/v1/clients?client_id={client.client_id}")["items"]
    assert len(mine) == 1
    item = mine[0]
    assert item["protocol"] == "MQTT 5" and item["listener"] == "listener[0]"
    assert item["subscriptions"] == [topic + "/#"]
    assert item["address"].startswith("127.0.0.1:")
    assert item["keep_alive"] == 60
    one = admin.ok("GET", f"/api/v1/clients/{old.client_id}")
    assert one["protocol"] == "MQTT 3.1.1"
    # paging: one per page, and the pages cover both without repeating
    seen: list[str] = []
    page = admin.ok("GET", "/api/v1/clients?limit=1")
    while True:
        assert len(page["items"]) <= 1
        seen += [item["client_id"] for item in page["items"]]
        if page["next_cursor"] is None:
            break
        page = admin.ok("GET", f"/api/v1/clients?limit=1&cursor={page['next_cursor']}")
    assert sorted(seen) == sorted({client.client_id, old.client_id})


def test_kick_sends_administrative_action(admin_broker: AdminBroker, paho: Paho) -> None:
    admin = admin_broker()
    client = paho(admin, client_id=unique("kicked"))
    body = admin.ok("POST", f"/api/v1/clients/{client.client_id}/kick")
    assert body == {"client_id": client.client_id, "disconnected": True}
    gone = client.wait_disconnected()
    assert gone.from_server and gone.reason_code == 0x98
    assert admin.get(f"/api/v1/clients/{client.client_id}").status == 404


@pytest.mark.needs_mosquitto
def test_offline_sessions_show_their_backlog_and_can_be_deleted(
    admin_broker: AdminBroker, paho: Paho
) -> None:
    admin = admin_broker()
    topic = unique("backlog")
    client = paho(admin, client_id=unique("away"), connect_properties=persistent())
    client.subscribe(topic, qos=1)
    client.disconnect()
    client.wait_disconnected()
    for n in range(3):
        mosquitto_pub(admin, "-q", "1", "-t", topic, "-m", f"m{n}")
    session = admin.ok("GET", f"/api/v1/sessions/{client.client_id}")
    assert session["online"] is False
    assert session["queued"] == 3
    assert session["expiry_interval"] == 300 and session["expires_at"] is not None
    assert session["oldest_queued_age"] > 0
    assert session["subscriptions"] == [{"filter": topic, "qos": 1}]
    listed = admin.ok("GET", "/api/v1/sessions?sort=oldest_queued_age&limit=1000")["items"]
    assert listed[0]["client_id"] == client.client_id  # the only one with a backlog
    assert admin.ok("DELETE", f"/api/v1/sessions/{client.client_id}")["deleted"] is True
    assert admin.get(f"/api/v1/sessions/{client.client_id}").status == 404


def test_subscriptions_and_shared_groups(admin_broker: AdminBroker, paho: Paho) -> None:
    admin = admin_broker()
    base = unique("subs")
    one, two = paho(admin), paho(admin)
    one.subscribe(f"{base}/a/+", qos=1)
    one.subscribe(f"$share/workers/{base}/jobs", qos=1)
    two.subscribe(f"$share/workers/{base}/jobs", qos=0)
    subs = admin.ok("GET", f"/api/v1/subscriptions?filter={base}/%23")["items"]
    assert {(s["client_id"], s["filter"], s["share_group"]) for s in subs} == {
        (one.client_id, f"{base}/a/+", None),
        (one.client_id, f"$share/workers/{base}/jobs", "workers"),
        (two.client_id, f"$share/workers/{base}/jobs", "workers"),
    }
    groups = admin.ok("GET", "/api/v1/shared")["items"]
    group = next(g for g in groups if g["filter"] == f"$share/workers/{base}/jobs")
    assert group["group"] == "workers"
    assert {m["client_id"] for m in group["members"]} == {one.client_id, two.client_id}
    assert all(m["queued"] == 0 and m["online"] for m in group["members"])


@pytest.mark.needs_mosquitto
def test_retained_messages_browse_and_delete(admin_broker: AdminBroker) -> None:
    admin = admin_broker()
    topic = unique("kept") + "/temp"
    mosquitto_pub(admin, "-r", "-t", topic, "-m", "21.5")
    items = admin.ok("GET", f"/api/v1/retained?filter={topic.split('/')[0]}/%23")["items"]
    assert items == [
        {
            "topic": topic,
            "qos": 0,
            "size": 4,
            "payload_preview": "21.5",
            "preview_encoding": "utf-8",
            "truncated": False,
            "expires_in": None,
        }
    ]
    assert admin.ok("DELETE", f"/api/v1/retained?topic={topic}")["deleted"] is True
    assert admin.ok("GET", f"/api/v1/retained?filter={topic}")["items"] == []
    assert admin.request("DELETE", f"/api/v1/retained?topic={topic}").status == 404


def test_publish_reaches_subscribers(admin_broker: AdminBroker, paho: Paho) -> None:
    admin = admin_broker()
    topic = unique("pub")
    sub = paho(admin)
    sub.subscribe(topic, qos=1)
    body = {
        "topic": topic,
        "payload": "aGVsbG8=",
        "encoding": "base64",
        "qos": 1,
        "properties": {"content_type": "text/plain", "user_properties": [["k", "v"]]},
    }
    assert admin.ok("POST", "/api/v1/publish", body) == {"topic": topic, "sessions": 1}
    got = sub.wait_messages(1)[0]
    assert (got.topic, got.payload, got.qos) == (topic, b"hello", 1)
    assert got.prop("ContentType") == "text/plain"
    assert got.prop("UserProperty") == [("k", "v")]


@pytest.mark.parametrize(
    ("method", "path", "body", "raw", "headers", "status", "says"),
    [
        ("GET", "/api/v1/subscriptions?filter=a/%23/b", None, None, {}, 400, "filter"),
        ("GET", "/api/v1/retained?filter=a%2B", None, None, {}, 400, "filter"),
        ("GET", "/api/v1/clients?limit=100000", None, None, {}, 400, "limit"),
        ("GET", "/api/v1/sessions?cursor=-1", None, None, {}, 400, "cursor"),
        ("GET", "/api/v1/subscriptions?cursor=1..2", None, None, {}, 400, "cursor"),
        ("GET", "/api/v1/clients?cursor=1.2", None, None, {}, 400, "cursor"),
        ("GET", "/api/v1/sessions?limit=ten", None, None, {}, 400, "limit"),
        ("GET", "/api/v1/sessions?sort=name", None, None, {}, 400, "sort"),
        ("GET", "/api/v1/clients/nobody-here", None, None, {}, 404, "nobody-here"),
        ("POST", "/api/v1/clients/nobody-here/kick", None, None, {}, 404, "nobody-here"),
        ("DELETE", "/api/v1/sessions/nobody-here", None, None, {}, 404, "nobody-here"),
        (
            "POST",
            "/api/v1/publish",
            None,
            b"{not json",
            {"Content-Type": "application/json"},
            400,
            "JSON",
        ),
        (
            "POST",
            "/api/v1/publish",
            None,
            b"topic=a",
            {"Content-Type": "text/plain"},
            415,
            "Content-Type",
        ),
        ("POST", "/api/v1/publish", [1], None, {}, 400, "object"),
        ("POST", "/api/v1/publish", {"topic": "a/#"}, None, {}, 400, "topic"),
        ("POST", "/api/v1/publish", {"topic": "a", "qos": 3}, None, {}, 400, "qos"),
        (
            "POST",
            "/api/v1/publish",
            {"topic": "a", "payload": "!", "encoding": "base64"},
            None,
            {},
            400,
            "base64",
        ),
        (
            "POST",
            "/api/v1/publish",
            {"topic": "a", "properties": {"colour": 1}},
            None,
            {},
            400,
            "colour",
        ),
        (
            "POST",
            "/api/v1/publish",
            None,
            b"BIG",
            {"Content-Type": "application/json"},
            413,
            "larger",
        ),
        ("GET", "/api/v1/nothing", None, None, {}, 404, "Not Found"),
    ],
)
def test_bad_input_gets_a_clear_json_error(
    admin_broker: AdminBroker,
    method: str,
    path: str,
    body: Any,
    raw: bytes | None,
    headers: dict[str, str],
    status: int,
    says: str,
) -> None:
    admin = admin_broker()
    if raw == b"BIG":
        raw = b"x" * 2_000_000
    reply = admin.request(method, path, body, headers=headers, raw=raw)
    assert reply.status == status, reply.body
    assert reply.body["status"] == status and says in reply.body["error"]
    if path.startswith("/api/v1/") and "nothing" not in path:
        check(method, path, status, reply.body)
    assert admin.get("/healthz").status == 200  # and the server goes on

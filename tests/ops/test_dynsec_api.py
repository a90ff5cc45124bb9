"""The dynamic security through the admin API (``/api/v1/dynsec``), against a real broker
process with ``[dynsec] enabled``: a client created by the API logs in over MQTT, disabling it
disconnects it at once, an ACL added to a role lets it publish, each change is a dynsec audit
line (who, from where, what) beside the admin audit line, the state file holds every change,
bad input is refused naming the field, and nothing is served without the admin login."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.admin_client import Admin, AdminBroker, check
from support.clients import unique


def test_clients_created_disabled_and_roles_edited_through_the_api(
    dynsec_admin: tuple[Admin, Path], paho: Callable[..., Any], tmp_path: Path
) -> None:
    admin, state = dynsec_admin
    broker = admin.broker
    name = unique("sensor")

    # create: it logs in over MQTT with that password, and the state file has it at once
    mark = broker.log_mark()
    created = admin.ok("POST", "/api/v1/dynsec/clients", {"username": name, "password": "s3cret"})
    assert created["username"] == name and "disabled" not in created
    assert name in {c["username"] for c in json.loads(state.read_text())["clients"]}
    for line in (  # the log lines come through a pipe: waited for
        f"dynsec: admin-api/the bearer token from 127.0.0.1 | createClient | username={name}",
        "admin audit: the bearer token from 127.0.0.1: POST /api/v1/dynsec/clients -> 200",
    ):
        assert broker.wait_for_log(re.escape(line), since=mark), line
    assert "s3cret" not in broker.log_since(mark)
    listed = admin.ok("GET", "/api/v1/dynsec/clients")
    assert {"admin", name} <= {c["username"] for c in listed["items"]}
    assert admin.ok("GET", f"/api/v1/dynsec/clients/{name}")["username"] == name
    client = paho(admin, user=name, password="s3cret")

    # a role's ACL added through the API, then removed
    role = admin.ok(
        "POST",
        "/api/v1/dynsec/roles/admin/acls",
        {"acltype": "publishClientSend", "topic": "sensors/#", "allow": True, "priority": 3},
    )
    assert {"acltype": "publishClientSend", "topic": "sensors/#", "priority": 3, "allow": True} in (
        role["acls"]
    )
    roles = admin.ok("GET", "/api/v1/dynsec/roles")
    assert "sensors/#" in json.dumps(roles)
    body = {"acltype": "publishClientSend", "topic": "sensors/#"}
    role = admin.ok("DELETE", "/api/v1/dynsec/roles/admin/acls", body)
    assert "sensors/#" not in json.dumps(role)
    missing = admin.request("DELETE", "/api/v1/dynsec/roles/admin/acls", body)
    assert missing.status == 404 and "ACL not found" in missing.body["error"]

    # disabled while connected: disconnected at once, refused from then on, audited
    mark = broker.log_mark()
    disabled = admin.ok("POST", f"/api/v1/dynsec/clients/{name}/disable")
    assert disabled["disabled"] is True
    gone = client.wait_disconnected()
    assert gone.from_server
    refused = paho(admin, user=name, password="s3cret", connect=False)
    assert refused.connect(expect_success=False) == 0x87
    assert broker.wait_for_log(re.escape(f"| disableClient | username={name}"), since=mark)
    assert json.loads(state.read_text())["clients"][1].get("disabled") is True
    enabled = admin.ok("POST", f"/api/v1/dynsec/clients/{name}/enable")
    assert "disabled" not in enabled
    paho(admin, user=name, password="s3cret")

    # deleted: gone from the listing and the file
    assert admin.ok("DELETE", f"/api/v1/dynsec/clients/{name}") == {"deleted": name}
    assert admin.request("GET", f"/api/v1/dynsec/clients/{name}").status == 404
    assert name not in state.read_text()


def test_bad_input_and_logins_are_refused(dynsec_admin: tuple[Admin, Path], tmp_path: Path) -> None:
    admin, _ = dynsec_admin
    for body, field in (
        ({"password": "x"}, "username"),
        ({"username": "u"}, "password"),
        ({"username": "u", "password": "x", "roles": "admin"}, "roles"),
        ({"username": "u", "password": "x", "roles": [3]}, "roles[0]"),
    ):
        reply = admin.request("POST", "/api/v1/dynsec/clients", body)
        assert reply.status == 400 and reply.body["error"].startswith(field + ":"), reply.body
        check("POST", "/api/v1/dynsec/clients", 400, reply.body)
    unknown = admin.request(
        "POST", "/api/v1/dynsec/clients", {"username": "u", "password": "x", "roles": ["nope"]}
    )
    assert unknown.status == 404 and unknown.body["error"] == "createClient: Role not found"
    twice = admin.request("POST", "/api/v1/dynsec/clients", {"username": "admin", "password": "x"})
    assert twice.status == 400 and "Client already exists" in twice.body["error"]
    acl = admin.request("POST", "/api/v1/dynsec/roles/admin/acls", {"acltype": "x", "topic": "t"})
    assert acl.status == 400 and acl.body["error"].startswith("acltype:")
    assert admin.request("POST", "/api/v1/dynsec/clients/nobody/disable").status == 404

    # without the token: refused, and nothing was created
    anonymous = {"Authorization": ""}
    for method, path in (("GET", "/api/v1/dynsec/clients"), ("POST", "/api/v1/dynsec/clients")):
        reply = admin.request(
            method, path, {"username": "intruder", "password": "x"}, headers=anonymous
        )
        assert reply.status == 401, (method, reply.body)
    names = [c["username"] for c in admin.ok("GET", "/api/v1/dynsec/clients")["items"]]
    assert names == ["admin"]


def test_404_without_the_dynamic_security(admin_broker: AdminBroker) -> None:
    admin = admin_broker()
    for method, path in (
        ("GET", "/api/v1/dynsec/clients"),
        ("POST", "/api/v1/dynsec/clients"),
        ("GET", "/api/v1/dynsec/roles"),
        ("POST", "/api/v1/dynsec/clients/someone/disable"),
    ):
        reply = admin.request(method, path, {"username": "u", "password": "x"})
        assert reply.status == 404 and "not enabled" in reply.body["error"], (path, reply.body)


def test_groups_roles_and_passwords_through_the_api(
    dynsec_admin: tuple[Admin, Path], paho: Callable[..., Any], tmp_path: Path
) -> None:
    """Roles created with ACLs and deleted, groups with clients and roles, a client's roles
    and password: each a dynsec command (in the state file, audited, the password not)."""
    admin, state = dynsec_admin
    broker = admin.broker
    admin.ok("POST", "/api/v1/dynsec/clients", {"username": "dev", "password": "old"})

    # a role with an ACL, given to a group the client is in: the client may publish
    mark = broker.log_mark()
    acl = {"acltype": "publishClientSend", "topic": "dev/#", "allow": True, "priority": 2}
    role = admin.ok("POST", "/api/v1/dynsec/roles", {"rolename": "writer", "acls": [acl]})
    assert role == {"rolename": "writer", "acls": [acl]}
    assert admin.ok("GET", "/api/v1/dynsec/roles/writer") == role
    group = admin.ok("POST", "/api/v1/dynsec/groups", {"groupname": "fleet", "textname": "Fleet"})
    assert group == {"groupname": "fleet", "textname": "Fleet", "clients": [], "roles": []}
    group = admin.ok(
        "POST", "/api/v1/dynsec/groups/fleet/roles", {"rolename": "writer", "priority": 4}
    )
    assert group["roles"] == [{"rolename": "writer", "priority": 4}]
    group = admin.ok("POST", "/api/v1/dynsec/groups/fleet/clients", {"username": "dev"})
    assert group["clients"] == [{"username": "dev"}]
    assert admin.ok("GET", "/api/v1/dynsec/groups")["items"] == [group]
    assert admin.ok("GET", "/api/v1/dynsec/clients/dev")["groups"] == [{"groupname": "fleet"}]
    for line in (
        "| createRole | rolename=writer",
        "| createGroup | groupname=fleet",
        "| addGroupRole | groupname=fleet rolename=writer priority=4",
        "| addGroupClient | groupname=fleet username=dev",
        "admin audit: the bearer token from 127.0.0.1: POST /api/v1/dynsec/groups/fleet/clients",
    ):
        assert broker.wait_for_log(re.escape(line), since=mark), line
    client = paho(admin, user="dev", password="old")
    assert client.acked[client.publish("dev/1", b"x", qos=1).mid] == 0x10  # allowed, no one
    assert client.acked[client.publish("other", b"x", qos=1).mid] == 0x87

    # the password changed: the old one no longer logs in; neither is logged
    mark = broker.log_mark()
    admin.ok("POST", "/api/v1/dynsec/clients/dev/password", {"password": "new-s3cret"})
    assert broker.wait_for_log(re.escape("| setClientPassword | username=dev"), since=mark)
    assert broker.wait_for_log("POST /api/v1/dynsec/clients/dev/password", since=mark)
    assert "new-s3cret" not in broker.log_since(mark)
    old = paho(admin, user="dev", password="old", connect=False)
    assert old.connect(expect_success=False) == 0x86
    paho(admin, user="dev", password="new-s3cret")

    # a client's own roles
    client_json = admin.ok("POST", "/api/v1/dynsec/clients/dev/roles", {"rolename": "writer"})
    assert client_json["roles"] == [{"rolename": "writer"}]
    client_json = admin.ok("DELETE", "/api/v1/dynsec/clients/dev/roles/writer")
    assert client_json["roles"] == []

    # taken apart: out of the group, the group's role removed, the role and group deleted
    group = admin.ok("DELETE", "/api/v1/dynsec/groups/fleet/clients/dev")
    assert group["clients"] == []
    assert admin.ok("DELETE", "/api/v1/dynsec/groups/fleet/roles/writer")["roles"] == []
    assert admin.ok("DELETE", "/api/v1/dynsec/roles/writer") == {"deleted": "writer"}
    assert admin.ok("DELETE", "/api/v1/dynsec/groups/fleet") == {"deleted": "fleet"}
    saved = json.loads(state.read_text())
    assert saved["groups"] == [] and [r["rolename"] for r in saved["roles"]] == ["admin"]
    for path in ("/api/v1/dynsec/roles/writer", "/api/v1/dynsec/groups/fleet"):
        missing = admin.request("GET", path)
        assert missing.status == 404 and "not found" in missing.body["error"], path
        check("GET", path, 404, missing.body)

    # bad input names the field
    for path, body, field in (
        ("/api/v1/dynsec/roles", {"rolename": "r", "acls": [{"acltype": "x"}]}, "acls[0].acltype"),
        ("/api/v1/dynsec/roles", {"rolename": "r", "acls": "all"}, "acls"),
        ("/api/v1/dynsec/groups", {"roles": []}, "groupname"),
        ("/api/v1/dynsec/clients/dev/password", {"password": ""}, "password"),
        ("/api/v1/dynsec/clients/dev/roles", {"rolename": "admin", "priority": "1"}, "priority"),
    ):
        reply = admin.request("POST", path, body)
        assert reply.status == 400 and reply.body["error"].startswith(field + ":"), reply.body
    twice = admin.request("POST", "/api/v1/dynsec/roles", {"rolename": "admin"})
    assert twice.status == 400 and twice.body["error"] == "createRole: Role already exists"


def test_every_dynsec_route_needs_the_login_and_is_documented(
    dynsec_admin: tuple[Admin, Path], tmp_path: Path
) -> None:
    from support.admin_client import OPENAPI

    from mqttbroker.ops.dynsec_api import DynsecApi

    admin, _ = dynsec_admin
    routes = [(r.method, r.path) for r in DynsecApi().routes()]  # type: ignore[attr-defined]
    assert len(routes) == 23
    for method, path in routes:
        assert method.lower() in OPENAPI["paths"].get(path, {}), (method, path)
        concrete = path.replace("{", "").replace("}", "")
        reply = admin.request(method, concrete, {}, headers={"Authorization": ""})
        assert reply.status == 401, (method, path, reply.status)
    # nothing was changed by those
    assert admin.ok("GET", "/api/v1/dynsec/groups")["items"] == []
    assert [r["rolename"] for r in admin.ok("GET", "/api/v1/dynsec/roles")["items"]] == ["admin"]

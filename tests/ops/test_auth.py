"""Who may use the admin server: off loopback only with a login configured; a wrong token, an
unknown user and a wrong password get the same answer; failed logins are logged and limited;
state-changing calls need the token or the CSRF header; no CORS unless configured."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from ops_support import Admin, basic, check
from support.launcher import run_broker

from mqttbroker.security.passwords import make_entry_line

TOKEN = "s3cret-token-for-tests"


def test_non_loopback_without_login_is_refused_at_start(tmp_path: Path) -> None:
    config = tmp_path / "open.toml"
    config.write_text('[admin]\nhost = "0.0.0.0"\n')
    for args in (("check-config", str(config)), ("--config", str(config), "--memory")):
        result = run_broker(*args)
        assert result.returncode == 2, result
        assert f"{config}: admin.host: '0.0.0.0' is not a loopback address" in result.stderr
        assert "token_file" in result.stderr


def test_a_token_variable_that_is_not_set_stops_the_start(tmp_path: Path) -> None:
    config = tmp_path / "env.toml"
    config.write_text('[admin]\nhost = "0.0.0.0"\ntoken_env = "MQTTBROKER_TEST_UNSET_TOKEN"\n')
    result = run_broker("--config", str(config), "--memory", "--port", "0")
    assert result.returncode == 2
    assert "admin.token_env: the environment variable MQTTBROKER_TEST_UNSET_TOKEN is not set" in (
        result.stderr
    )


@pytest.fixture
def guarded(admin_broker: Callable[..., Admin], tmp_path: Path) -> Admin:
    """Bound to every interface (not loopback), with a token file and one admin user."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    passwords = tmp_path / "passwd"
    passwords.write_text(
        make_entry_line("ops", b"ops-pw", 1000)
        + "\n"
        + make_entry_line("viewer", b"v-pw", 1000)
        + "\n"
    )
    return admin_broker(
        f'[admin]\nhost = "0.0.0.0"\ntoken_file = {str(token)!r}\nadmin_users = "ops"\n'
        f"[security]\npassword_file = {str(passwords)!r}\nallow_anonymous = true\n"
    )


def test_unauthenticated_and_wrong_credentials_are_refused_alike(guarded: Admin) -> None:
    refused = [
        guarded.get("/api/v1/clients"),
        guarded.get("/metrics"),
        guarded.get("/api/v1/clients", headers={"Authorization": "Bearer wrong"}),
        guarded.get("/api/v1/clients", headers=basic("ops", "wrong-pw")),  # a user, wrong password
        guarded.get("/api/v1/clients", headers=basic("nobody", "ops-pw")),  # no such user
    ]
    for reply in refused:
        assert reply.status == 401
        assert reply.body == {"error": "authentication required", "status": 401}
        assert reply.headers["WWW-Authenticate"] == 'Basic realm="mqttbroker"'
        check("GET", "/api/v1/clients", 401, reply.body)
    # A user of the password file who is not in admin_users: the same answer too.
    assert guarded.get("/api/v1/clients", headers=basic("viewer", "v-pw")).body == refused[0].body
    log = guarded.broker.log_text()
    assert "admin: failed login from 127.0.0.1: wrong bearer token" in log
    assert "admin: failed login from 127.0.0.1: wrong user name or password (user 'nobody')" in log


def test_the_token_and_admin_users_get_in(guarded: Admin) -> None:
    assert (
        guarded.get("/api/v1/clients", headers={"Authorization": f"Bearer {TOKEN}"}).status == 200
    )
    assert guarded.get("/metrics", headers=basic("ops", "ops-pw")).status == 200
    # The health checks and the dashboard's files need no login (probes, the sign-in page).
    assert guarded.get("/healthz").status == 200
    assert guarded.get("/readyz").status == 200
    assert guarded.get("/").status == 200


def test_failed_logins_are_limited(guarded: Admin) -> None:
    for _ in range(5):
        assert guarded.get("/api/v1/sessions", headers={"Authorization": "Bearer no"}).status == 401
    blocked = guarded.get("/api/v1/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
    assert blocked.status == 429  # even the right token, until the window has passed
    assert int(blocked.headers["Retry-After"]) > 0


def test_state_changing_calls_need_the_token_or_the_csrf_header(guarded: Admin) -> None:
    body = {"topic": "csrf/test"}
    login = basic("ops", "ops-pw")
    reply = guarded.request("POST", "/api/v1/publish", body, headers=login, csrf=False)
    assert reply.status == 403 and "X-MQTTBroker-CSRF" in reply.body["error"]
    assert guarded.request("POST", "/api/v1/publish", body, headers=login).status == 200
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert (
        guarded.request("POST", "/api/v1/publish", body, headers=bearer, csrf=False).status == 200
    )


def test_no_cors_unless_configured(admin_broker: Callable[..., Admin]) -> None:
    plain = admin_broker()
    origin = {"Origin": "https://elsewhere.example"}
    reply = plain.get("/api/v1/overview", headers=origin)
    assert "Access-Control-Allow-Origin" not in reply.headers
    assert plain.request("OPTIONS", "/api/v1/publish", headers=origin).status == 403
    allowed = admin_broker('[admin]\ncors_origins = "https://elsewhere.example"\n')
    preflight = allowed.request("OPTIONS", "/api/v1/publish", headers=origin)
    assert preflight.status == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://elsewhere.example"
    assert "X-MQTTBroker-CSRF" in preflight.headers["Access-Control-Allow-Headers"]
    other = allowed.get("/api/v1/overview", headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in other.headers


def test_the_acl_of_the_api_user_applies_to_publish(
    admin_broker: Callable[..., Admin], tmp_path: Path
) -> None:
    passwords = tmp_path / "passwd"
    passwords.write_text(make_entry_line("ops", b"ops-pw", 1000) + "\n")
    acl = tmp_path / "acl"
    acl.write_text("user ops\ntopic write ops/#\n")
    admin = admin_broker(
        f'[admin]\nadmin_users = "ops"\n[security]\npassword_file = {str(passwords)!r}\n'
        f"acl_file = {str(acl)!r}\n"
    )
    login = basic("ops", "ops-pw")
    assert admin.request("POST", "/api/v1/publish", {"topic": "ops/x"}, headers=login).status == 200
    denied = admin.request("POST", "/api/v1/publish", {"topic": "other/x"}, headers=login)
    assert denied.status == 403 and "ACL" in denied.body["error"]

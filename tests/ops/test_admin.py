"""ops/admin.py, the admin server: who may use it, how it resists guessers and local processes,
TLS and readiness.

Who may use the admin server: off loopback only with a login configured; a wrong token, an
unknown user and a wrong password get the same answer; failed logins are logged and limited;
state-changing calls need the token or the CSRF header; no CORS unless configured.

The admin server against local processes and guessers: on loopback it answers only loopback
host names (DNS rebinding); it needs a login while MQTT has one; every state-changing call is
logged; parallel wrong passwords are limited and spend a password-check budget of their own,
not the MQTT logins'; an oversized request line is logged in one line, not a traceback each.

The admin server over TLS (the listeners' keys), and /readyz: 200 while the broker can serve,
503 with the reason when the store cannot commit or the broker is shutting down.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.admin_client import ADMIN_LINE, Admin, AdminBroker, basic, check
from support.certs import client_context, make_certificates
from support.clients import (
    TIMEOUT,
    Paho,
    unique,
    wait_for,
)
from support.launcher import free_port, run_broker
from support.password_files import password_file

from mqttbroker.broker.core import Broker
from mqttbroker.broker.options import BrokerOptions
from mqttbroker.config import Config, ListenerConfig
from mqttbroker.ops.admin import FAILURES_ALLOWED, loopback_host, mqtt_protection
from mqttbroker.server.app import Server

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
def guarded(admin_broker: AdminBroker, tmp_path: Path) -> Admin:
    """Bound to every interface (not loopback), with a token file and one admin user."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    passwords = password_file(tmp_path / "passwd", {"ops": b"ops-pw", "viewer": b"v-pw"}, 1000)
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


def test_no_cors_unless_configured(admin_broker: AdminBroker) -> None:
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
    admin_broker: AdminBroker, tmp_path: Path
) -> None:
    passwords = password_file(tmp_path / "passwd", {"ops": b"ops-pw"}, 1000)
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


AUDIT_TOKEN = "audit-token-for-tests"
# Costly enough (tens of ms a check) that parallel checks overlap, as real ones do.
ITERATIONS = 200_000


def write_passwords(tmp_path: Path, iterations: int = 1000) -> Path:
    return password_file(tmp_path / "passwd", {"ops": b"ops-pw", "dev": b"dev-pw"}, iterations)


# -- Host names on a loopback admin server ---------------------------------------------------

ACCEPTED = ["localhost", "LocalHost:18083", "127.0.0.1", "127.0.0.1:1", "127.9.8.7:80", "[::1]"]
ACCEPTED += ["[::1]:18083", "localhost."]
REFUSED = ["evil.example", "evil.example:18083", "127.0.0.1.evil.example", "localhost.evil"]
REFUSED += ["[::2]", "[::1]x", "::1", "127.0.0.1:", "127.0.0.1:http", "10.0.0.1", "[127.0.0.1]"]
REFUSED += ["0.0.0.0", ""]


def test_loopback_host_names() -> None:
    assert [h for h in ACCEPTED if not loopback_host(h)] == []
    assert [h for h in REFUSED if loopback_host(h)] == []


def test_a_loopback_admin_answers_only_loopback_host_names(
    admin_broker: AdminBroker,
) -> None:
    admin = admin_broker()
    for host in (
        "localhost",
        f"localhost:{admin.port}",
        "127.0.0.1",
        "[::1]",
        f"[::1]:{admin.port}",
    ):
        assert admin.get("/api/v1/overview", headers={"Host": host}).status == 200, host
    for host in ("evil.example", f"evil.example:{admin.port}", "127.0.0.1.evil.example"):
        for path in ("/api/v1/retained", "/", "/healthz", "/metrics"):
            reply = admin.get(path, headers={"Host": host})
            assert reply.status == 421, (host, path, reply.status)
            assert "localhost, 127.x.x.x or [::1]" in reply.body["error"], reply.body
            assert repr(host) in reply.body["error"] and "DNS rebinding" in reply.body["error"]
    kick = admin.request("POST", "/api/v1/clients/anyone/kick", headers={"Host": "evil.example"})
    assert kick.status == 421
    assert "admin server: refused a request from 127.0.0.1 for Host 'evil.example'" in (
        admin.broker.log_text()
    )


def test_an_admin_off_loopback_takes_any_host_name(
    admin_broker: AdminBroker, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(AUDIT_TOKEN + "\n")
    admin = admin_broker(f'[admin]\nhost = "0.0.0.0"\ntoken_file = {str(token)!r}\n')
    bearer = {"Authorization": f"Bearer {AUDIT_TOKEN}", "Host": "broker.example:18083"}
    assert admin.get("/api/v1/overview", headers=bearer).status == 200


# -- a login while MQTT has one ----------------------------------------------------------------


@pytest.mark.parametrize("setting", ["password_file", "acl_file"])
def test_with_mqtt_authentication_the_admin_needs_a_login(
    admin_broker: AdminBroker, paho: Paho, tmp_path: Path, setting: str
) -> None:
    passwords = write_passwords(tmp_path)
    acl = tmp_path / "acl"
    acl.write_text("topic read public/#\n")
    path = passwords if setting == "password_file" else acl
    admin = admin_broker(f"[security]\n{setting} = {str(path)!r}\nallow_anonymous = true\n")
    client = paho(admin, client_id=unique("kept"))
    expected = (
        f"the admin server needs a login while MQTT has one (security.{setting} is set): set "
        "admin.token_file, admin.token_env or admin.admin_users"
    )
    for method, path_ in (
        ("GET", "/api/v1/retained"),
        ("GET", "/api/v1/overview"),
        ("GET", "/metrics"),
        ("POST", f"/api/v1/clients/{client.client_id}/kick"),
        ("DELETE", f"/api/v1/sessions/{client.client_id}"),
    ):
        reply = admin.request(method, path_)
        assert reply.status == 403, (method, path_, reply.status)
        assert reply.body == {"error": expected, "status": 403}
    check("GET", "/api/v1/retained", 403, reply.body)
    # The probes and the dashboard's page still answer; the client was not touched.
    assert admin.get("/healthz").status == 200 and admin.get("/readyz").status == 200
    assert admin.get("/").status == 200
    assert client.client.is_connected()
    log = admin.broker.log_text()
    assert "admin server: everything but the dashboard's files" in log and expected in log
    assert "without login (loopback only)" not in log


def test_with_dynamic_security_the_admin_needs_a_login(
    admin_broker: AdminBroker,
) -> None:
    admin = admin_broker("[dynsec]\nenabled = true\n")
    reply = admin.get("/api/v1/retained")
    assert reply.status == 403
    assert "(dynsec.enabled is set)" in reply.body["error"]


def test_certificate_user_names_are_a_login_too() -> None:
    """A listener that takes user names from client certificates puts MQTT behind a login
    even when it does not require a certificate of every client."""
    broker = Broker(BrokerOptions())
    plain = ListenerConfig()
    named = ListenerConfig(tls_certificate_username="cn")
    assert mqtt_protection(None, broker, [plain]) == ""
    assert mqtt_protection(None, broker, [plain, named]) == "listener.tls_certificate_username"


def test_without_mqtt_authentication_the_loopback_admin_stays_open(
    admin_broker: AdminBroker,
) -> None:
    admin = admin_broker()
    assert admin.get("/api/v1/retained").status == 200
    assert "without login (loopback only)" in admin.broker.log_text()


# -- the audit log -----------------------------------------------------------------------------

AUDIT = re.compile(r"admin audit: .*")


def audit_lines(admin: Admin, mark: int, count: int) -> list[str]:
    """The audit lines logged since ``mark``, once there are ``count`` of them (the log comes
    through a pipe, after the HTTP answers)."""
    wait_for(lambda: len(AUDIT.findall(admin.broker.log_since(mark))) >= count, "the audit lines")
    return [m.group(0) for m in AUDIT.finditer(admin.broker.log_since(mark))]


def test_every_state_changing_call_is_logged_once(
    admin_broker: AdminBroker, paho: Paho, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(AUDIT_TOKEN + "\n")
    passwords = write_passwords(tmp_path)
    admin = admin_broker(
        f'[admin]\ntoken_file = {str(token)!r}\nadmin_users = "ops"\n'
        f"[security]\npassword_file = {str(passwords)!r}\nallow_anonymous = true\n"
    )
    bearer = {"Authorization": f"Bearer {AUDIT_TOKEN}"}
    login = basic("ops", "ops-pw")
    topic = unique("audit")
    kicked = paho(admin, client_id=unique("kicked"))
    kept = paho(admin, client_id=unique("kept"), clean=False, expiry=300)
    mark = admin.broker.log_mark()
    admin.ok("GET", "/api/v1/clients", headers=bearer)  # reads are not audited
    admin.ok("POST", f"/api/v1/clients/{kicked.client_id}/kick", headers=login)
    admin.ok(
        "POST", "/api/v1/publish", {"topic": topic, "payload": "x", "retain": True}, headers=bearer
    )
    admin.ok("DELETE", f"/api/v1/retained?topic={topic}", headers=bearer)
    admin.ok("DELETE", f"/api/v1/sessions/{kept.client_id}", headers=login)
    missing = admin.request("DELETE", "/api/v1/sessions/nobody-here", headers=bearer)
    assert missing.status == 404
    no_csrf = admin.request("POST", "/api/v1/publish", {"topic": topic}, headers=login, csrf=False)
    assert no_csrf.status == 403
    lines = audit_lines(admin, mark, 6)
    assert lines == [
        f"admin audit: user 'ops' from 127.0.0.1: POST /api/v1/clients/{kicked.client_id}/kick"
        f" -> 200: client '{kicked.client_id}' disconnected (0x98)",
        f"admin audit: the bearer token from 127.0.0.1: POST /api/v1/publish -> 200: published "
        f"1 bytes to '{topic}' (QoS 0, retained; 0 sessions)",
        f"admin audit: the bearer token from 127.0.0.1: DELETE /api/v1/retained?topic={topic}"
        f" -> 200: retained message on '{topic}' deleted",
        f"admin audit: user 'ops' from 127.0.0.1: DELETE /api/v1/sessions/{kept.client_id}"
        f" -> 200: session '{kept.client_id}' deleted (it was connected: disconnected with 0x98)",
        "admin audit: the bearer token from 127.0.0.1: DELETE /api/v1/sessions/nobody-here"
        " -> 404: no session with client id 'nobody-here'",
        "admin audit: user 'ops' from 127.0.0.1: POST /api/v1/publish -> 403: state-changing "
        "requests need the bearer token or the X-MQTTBroker-CSRF header",
    ], "\n".join(lines)


def test_calls_without_login_are_logged_as_such(admin_broker: AdminBroker, paho: Paho) -> None:
    admin = admin_broker()
    client = paho(admin, client_id=unique("open"))
    mark = admin.broker.log_mark()
    admin.ok("POST", f"/api/v1/clients/{client.client_id}/kick")
    assert audit_lines(admin, mark, 1) == [
        f"admin audit: no login (loopback) from 127.0.0.1: POST "
        f"/api/v1/clients/{client.client_id}/kick -> 200: client '{client.client_id}' "
        "disconnected (0x98)"
    ]


# -- guessing passwords in parallel ------------------------------------------------------------


async def parallel_logins(
    base: str, attempts: list[tuple[str, str]], password: str = "wrong-pw"
) -> list[tuple[int, str]]:
    """Each attempt (source address, user) as its own connection, all at once: (status,
    error) of each."""

    async def one(address: str, user: str) -> tuple[int, str]:
        connector = aiohttp.TCPConnector(local_addr=(address, 0), force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get(
                f"{base}/api/v1/clients",
                headers=basic(user, password),
                timeout=aiohttp.ClientTimeout(total=120),
            ) as response:
                body = await response.json()
                return response.status, body["error"]

    return await asyncio.gather(*(one(address, user) for address, user in attempts))


def test_parallel_wrong_passwords_are_limited(admin_broker: AdminBroker, tmp_path: Path) -> None:
    passwords = write_passwords(tmp_path, ITERATIONS)
    admin = admin_broker(  # (MQTT's own limit per address out of the way: the admin's is tested)
        f'[admin]\nadmin_users = "ops"\n[security]\npassword_file = {str(passwords)!r}\n'
        "max_login_failures = 1000\n"
    )
    answers = asyncio.run(parallel_logins(admin.base, [("127.0.0.1", "ops")] * 40))
    statuses = [status for status, _ in answers]
    assert set(statuses) <= {401, 429}, answers
    limited = {error for status, error in answers if status == 429}
    assert limited == {"too many failed logins; try again later"}, answers
    # Counted before each check: no more than the limit get a check (one more if a check
    # ended more than a failure's drain time after the first), the rest 429 at once.
    assert statuses.count(401) <= FAILURES_ALLOWED + 1, statuses
    assert statuses.count(429) >= 40 - FAILURES_ALLOWED - 1, statuses
    # The log comes through a pipe, after the answers: wait for the lines, then count them.
    failed = "admin: failed login from 127.0.0.1"
    wait_for(lambda: admin.broker.log_text().count(failed) >= statuses.count(401), "the log")
    assert admin.broker.log_text().count(failed) == statuses.count(401)


def test_guessing_admin_passwords_leaves_mqtt_logins_their_budget(
    admin_broker: AdminBroker, paho: Paho, tmp_path: Path
) -> None:
    passwords = write_passwords(tmp_path, ITERATIONS)
    admin = admin_broker(
        f'[admin]\nadmin_users = "ops"\n[security]\npassword_file = {str(passwords)!r}\n'
        "allow_anonymous = true\n"
    )
    # 300 wrong passwords from 60 loopback addresses, 5 each (within each one's limit).
    attempts = [(f"127.0.0.{2 + n % 60}", "ops") for n in range(300)]
    answers = asyncio.run(parallel_logins(admin.base, attempts))
    busy = "too many admin password checks at once; try again later"
    assert {status for status, _ in answers} == {401, 429}, answers
    assert {error for status, error in answers if status == 429} == {busy}
    # An MQTT login that needs a password check gets one: its budget was not spent.
    dev = paho(admin, connect=False, user="dev", password=b"dev-pw")
    assert dev.connect() == 0
    log = admin.broker.log_text()
    assert "password checks are over their CPU budget: refusing admin logins with 429" in log
    assert "refusing logins with 0x89" not in log
    # The admin passes the address: its failures count for MQTT logins from there too.
    assert "admin: failed login from 127.0.0.2: wrong user name or password (user 'ops')" in log


# -- requests that are not HTTP ----------------------------------------------------------------


def test_an_oversized_request_line_is_logged_in_one_line(
    admin_broker: AdminBroker,
) -> None:
    admin = admin_broker()
    mark = admin.broker.log_mark()
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", admin.port), timeout=TIMEOUT) as sock:
            sock.sendall(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:100]
    assert admin.get("/healthz").status == 200  # the server goes on
    admin.broker.terminate()  # its log read to the end: a line still in the pipe counts too
    log = admin.broker.log_since(mark)
    lines = [line for line in log.splitlines() if "bad HTTP request" in line]
    assert len(lines) == 1, log
    assert "admin server: bad HTTP request from 127.0.0.1, answered 400: " in lines[0]
    assert "Traceback" not in log and "Error handling request" not in log


def test_admin_over_tls(start_broker: Callable[..., Any], tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    port = free_port()
    config = tmp_path / "tls.toml"
    config.write_text(
        f"[admin]\nport = {port}\ntls_cert_file = {str(certs.server_cert)!r}\n"
        f"tls_key_file = {str(certs.server_key)!r}\n"
    )
    broker = start_broker(
        extra_args=("--config", str(config), "--memory", "--admin-port", str(port))
    )
    found = broker.wait_for_log(ADMIN_LINE, TIMEOUT)
    assert found is not None and found.group(1) == "https"
    context = client_context(certs)
    url = f"https://localhost:{port}/healthz"
    with urllib.request.urlopen(url, context=context, timeout=TIMEOUT) as response:
        assert json.loads(response.read()) == {"status": "alive"}


def test_a_bad_admin_certificate_is_a_configuration_error(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    config = tmp_path / "bad.toml"
    config.write_text(f"[admin]\ntls_cert_file = {str(certs.garbage)!r}\n")
    result = run_broker("check-config", str(config))
    assert result.returncode == 2
    assert f"{config}: admin.tls_cert_file" in result.stderr, result.stderr


def test_readyz_follows_the_store_and_the_shutdown() -> None:
    async def scenario() -> list[tuple[int, dict[str, Any]]]:
        config = Config()
        config.storage.backend = "memory"
        config.listeners[0].port = 0
        config.admin.port = free_port()
        server = Server(config)
        assert server.ready() == "not every listener is bound yet"
        await server.start()
        url = f"http://127.0.0.1:{config.admin.port}/readyz"
        loop = asyncio.get_running_loop()

        def get() -> tuple[int, dict[str, Any]]:
            try:
                with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        answers = [await loop.run_in_executor(None, get)]
        server.store.failing = True  # type: ignore[attr-defined]  # as SQLiteStore sets it
        answers.append(await loop.run_in_executor(None, get))
        server.store.failing = False  # type: ignore[attr-defined]
        server.stopping = True
        answers.append(await loop.run_in_executor(None, get))
        await server.stop()
        return answers

    ready, store, stopping = asyncio.run(scenario())
    assert ready == (200, {"ready": True})
    assert store == (503, {"ready": False, "reason": "the store cannot commit (see the log)"})
    assert stopping == (503, {"ready": False, "reason": "shutting down"})

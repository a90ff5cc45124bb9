"""An admin server under test: its broker process, its address, and requests to it (urllib; a
response is (status, headers, parsed JSON or text)). Responses of the API are checked against
the OpenAPI document the broker ships (``check``). ``start_admin`` starts one;
``start_dynsec_admin`` one with the dynamic security, behind the token ``DYNSEC_TOKEN``."""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from mqttbroker.security.dynsec import Dynsec
from support.launcher import ROOT, free_port

OPENAPI = json.loads((ROOT / "mqttbroker" / "ops" / "openapi.json").read_text())
ADMIN_LINE = re.compile(r"admin server on (https?)://(\S+):(\d+)/")
TIMEOUT = 10.0
DYNSEC_TOKEN = "dynsec-api-token"  # the admin token of start_dynsec_admin's server


@dataclass
class Reply:
    status: int
    headers: Any
    body: Any

    @property
    def text(self) -> str:
        return self.body if isinstance(self.body, str) else json.dumps(self.body)


class Admin:
    def __init__(self, broker: Any, host: str, port: int) -> None:
        self.broker = broker
        self.base = f"http://{host}:{port}"
        self.port = port
        self.headers: dict[str, str] = {}  # sent with every request (a login)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
        csrf: bool = True,
    ) -> Reply:
        sent = {**self.headers, **(headers or {})}
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        if csrf and method in ("POST", "DELETE"):
            sent.setdefault("X-MQTTBroker-CSRF", "1")
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                status, got, payload = response.status, response.headers, response.read()
        except urllib.error.HTTPError as exc:
            status, got, payload = exc.code, exc.headers, exc.read()
        kind = got.get("Content-Type", "")
        parsed: Any = (
            json.loads(payload) if kind.startswith("application/json") else payload.decode()
        )
        return Reply(status, got, parsed)

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        """The JSON of a 200 answer, checked against the OpenAPI document."""
        reply = self.request(method, path, body, **kw)
        assert reply.status == 200, (reply.status, reply.body)
        check(method, path, reply.status, reply.body)
        return reply.body


AdminBroker = Callable[..., Admin]  # the admin_broker fixture (tests/ops/conftest.py)


def _operation(method: str, path: str) -> dict[str, Any]:
    path = path.split("?", 1)[0]
    for template, item in OPENAPI["paths"].items():
        pattern = "^" + re.sub(r"\{[^/]+\}", "[^/]+", template) + "$"
        if re.match(pattern, path) and method.lower() in item:
            return item[method.lower()]
    raise AssertionError(f"{method} {path} is not in openapi.json")


def check(method: str, path: str, status: int, body: Any) -> None:
    """``body`` matches the schema openapi.json gives for this answer."""
    responses = _operation(method, path)["responses"]
    assert str(status) in responses, f"{method} {path}: status {status} not documented"
    schema = responses[str(status)]["content"]["application/json"]["schema"]
    root = {**schema, "components": OPENAPI["components"]}
    jsonschema.validate(body, root, cls=jsonschema.Draft202012Validator)


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def start_admin(
    start_broker: Callable[..., Any],
    tmp_path: Path,
    config: str = "",
    args: tuple[str, ...] = (),
    memory: bool = True,
) -> Admin:
    port = free_port()
    extra: list[str] = ["--admin-port", str(port), *args]
    if config:
        path = tmp_path / f"broker-{port}.toml"
        path.write_text(config)
        extra += ["--config", str(path)]
    if memory:
        extra.append("--memory")
    broker = start_broker(extra_args=tuple(extra))
    match = broker.wait_for_log(ADMIN_LINE, TIMEOUT)
    assert match is not None, broker.log_text()
    return Admin(broker, "127.0.0.1", int(match.group(3)))


def start_dynsec_admin(start_broker: Callable[..., Any], tmp_path: Path) -> tuple[Admin, Path]:
    """A broker with the dynamic security (an ``admin`` client and role, as ``dynsec init``
    makes) and an admin server behind a bearer token; its Admin (logged in) and state file."""
    initial = tmp_path / "init.json"
    initial.write_text(json.dumps(Dynsec.initial("admin", "adminpw", 1000).to_json()))
    token = tmp_path / "token"
    token.write_text(DYNSEC_TOKEN + "\n")
    state = tmp_path / "dynamic-security.json"
    admin = start_admin(
        start_broker,
        tmp_path,
        f"[admin]\ntoken_file = {str(token)!r}\n"
        f"[dynsec]\nenabled = true\niterations = 1000\nfile = {str(state)!r}\n"
        f"import_file = {str(initial)!r}\n",
    )
    admin.headers = {"Authorization": f"Bearer {DYNSEC_TOKEN}"}
    return admin, state

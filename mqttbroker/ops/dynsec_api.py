"""The dynamic security's operations under ``/api/v1/dynsec`` (clients, roles and their ACLs).

Each call is turned into the dynamic security's own commands and run by
:meth:`~mqttbroker.security.dynsec.DynsecService.run_commands`, the path the MQTT commands take:
a change is written to the state file before the answer, applied to live connections (a
disabled or deleted client is disconnected) and logged in the dynsec audit line, with the admin
login as who and the HTTP client's address as where. A command's error is answered with its
Mosquitto wording: 404 for what does not exist, else 400. Without ``[dynsec] enabled`` every
path answers 404.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..security.dynsec import ACL_TYPES, MUTATING, SAVE_ERROR, DynsecService
from .api import API_CLIENT_ID, ApiError, json_body

PREFIX = "/api/v1/dynsec"


def _string(body: dict[str, Any], key: str, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"{key}: expected a non-empty string")
    return value


def _priority(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key}: expected an integer")
    return value


def _roles(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``roles``: role names, or ``{"rolename": ..., "priority": ...}`` objects."""
    value = body.get("roles", [])
    if not isinstance(value, list):
        raise ApiError(400, "roles: expected a list of role names")
    roles = []
    for index, item in enumerate(value):
        if isinstance(item, str) and item:
            roles.append({"rolename": item, "priority": -1})
        elif isinstance(item, dict) and isinstance(item.get("rolename"), str) and item["rolename"]:
            roles.append(
                {
                    "rolename": item["rolename"],
                    "priority": _priority(item.get("priority", -1), f"roles[{index}].priority"),
                }
            )
        else:
            raise ApiError(400, f"roles[{index}]: expected a role name")
    return roles


def _acl(body: dict[str, Any], with_rule: bool) -> dict[str, Any]:
    acltype = _string(body, "acltype")
    if acltype not in ACL_TYPES:
        raise ApiError(400, f"acltype: expected one of {', '.join(sorted(ACL_TYPES))}")
    acl: dict[str, Any] = {"acltype": acltype, "topic": _string(body, "topic")}
    if with_rule:
        allow = body.get("allow", False)
        if not isinstance(allow, bool):
            raise ApiError(400, "allow: expected true or false")
        acl["allow"] = allow
        acl["priority"] = _priority(body.get("priority", 0), "priority")
    return acl


class DynsecApi:
    """The handlers; ``service`` is set once the broker has started its dynamic security."""

    def __init__(self) -> None:
        self.service: DynsecService | None = None

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(f"{PREFIX}/clients", self.list_clients),
            web.post(f"{PREFIX}/clients", self.create_client),
            web.get(f"{PREFIX}/clients/{{username}}", self.get_client),
            web.delete(f"{PREFIX}/clients/{{username}}", self.delete_client),
            web.post(f"{PREFIX}/clients/{{username}}/disable", self.disable_client),
            web.post(f"{PREFIX}/clients/{{username}}/enable", self.enable_client),
            web.get(f"{PREFIX}/roles", self.list_roles),
            web.post(f"{PREFIX}/roles/{{rolename}}/acls", self.add_acl),
            web.delete(f"{PREFIX}/roles/{{rolename}}/acls", self.remove_acl),
        ]

    async def _run(self, request: web.Request, command: dict[str, Any]) -> dict[str, Any]:
        """One command through the service; its ``data`` ({} if none), or ApiError."""
        service = self.service
        if service is None:
            raise ApiError(404, "the dynamic security is not enabled ([dynsec] enabled)")
        who = f"{API_CLIENT_ID}/{request.get('who', '?')}"
        answers = await service.run_commands([command], who, request.remote or "?")
        answer = answers[0] if answers else {"error": "no answer"}
        error = answer.get("error")
        name = command["command"]
        if error is not None:
            if str(error).startswith(SAVE_ERROR):
                raise ApiError(500, f"{name}: {error}")
            status = 404 if str(error).endswith("not found") else 400
            raise ApiError(status, f"{name}: {error}")
        if name in MUTATING:  # the admin audit line says what was done
            args = " ".join(
                f"{k}={v!r}" for k, v in command.items() if k in ("username", "rolename", "topic")
            )
            request["audit"] = f"dynsec {name} {args}".rstrip()
        data = answer.get("data")
        return data if isinstance(data, dict) else {}

    async def list_clients(self, request: web.Request) -> web.Response:
        data = await self._run(request, {"command": "listClients", "verbose": True})
        return web.json_response({"items": data["clients"], "total": data["totalCount"]})

    async def get_client(self, request: web.Request) -> web.Response:
        username = request.match_info["username"]
        data = await self._run(request, {"command": "getClient", "username": username})
        return web.json_response(data["client"])

    async def create_client(self, request: web.Request) -> web.Response:
        if self.service is None:
            await self._run(request, {"command": "listClients"})  # 404
        body = await json_body(request)
        command: dict[str, Any] = {
            "command": "createClient",
            "username": _string(body, "username"),
            "password": _string(body, "password"),
            "roles": _roles(body),
        }
        for key in ("clientid", "textname", "textdescription"):
            if body.get(key) is not None:
                command[key] = _string(body, key)
        await self._run(request, command)
        data = await self._run(request, {"command": "getClient", "username": command["username"]})
        return web.json_response(data["client"])

    async def _switch(self, request: web.Request, name: str) -> web.Response:
        username = request.match_info["username"]
        await self._run(request, {"command": name, "username": username})
        data = await self._run(request, {"command": "getClient", "username": username})
        return web.json_response(data["client"])

    async def disable_client(self, request: web.Request) -> web.Response:
        return await self._switch(request, "disableClient")

    async def enable_client(self, request: web.Request) -> web.Response:
        return await self._switch(request, "enableClient")

    async def delete_client(self, request: web.Request) -> web.Response:
        username = request.match_info["username"]
        await self._run(request, {"command": "deleteClient", "username": username})
        return web.json_response({"deleted": username})

    async def list_roles(self, request: web.Request) -> web.Response:
        data = await self._run(request, {"command": "listRoles", "verbose": True})
        return web.json_response({"items": data["roles"], "total": data["totalCount"]})

    async def _acl_change(self, request: web.Request, name: str, with_rule: bool) -> web.Response:
        if self.service is None:
            await self._run(request, {"command": "listRoles"})  # 404
        rolename = request.match_info["rolename"]
        acl = _acl(await json_body(request), with_rule)
        await self._run(request, {"command": name, "rolename": rolename, **acl})
        data = await self._run(request, {"command": "getRole", "rolename": rolename})
        return web.json_response(data["role"])

    async def add_acl(self, request: web.Request) -> web.Response:
        return await self._acl_change(request, "addRoleACL", True)

    async def remove_acl(self, request: web.Request) -> web.Response:
        return await self._acl_change(request, "removeRoleACL", False)

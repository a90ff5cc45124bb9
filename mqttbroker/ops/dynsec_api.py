"""The dynamic security's operations under ``/api/v1/dynsec``: clients (and their passwords
and roles), groups (and their clients and roles), roles (and their ACLs).

Each call is turned into the dynamic security's own commands and run by
:meth:`~mqttbroker.security.dynsec.DynsecService.run_commands`, the path the MQTT commands take:
a change is written to the state file before the answer, applied to live connections (a
disabled or deleted client is disconnected) and logged in the dynsec audit line, with the admin
login as who and the HTTP client's address as where. A command's error is answered with its
Mosquitto wording: 404 for what does not exist, else 400. Without ``[dynsec] enabled`` every
path answers 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..security.dynsec import ACL_TYPES, MUTATING, SAVE_ERROR, DynsecService
from .api import API_CLIENT_ID, ApiError, json_body

PREFIX = "/api/v1/dynsec"
# kind -> the key that names one (in paths and commands), and its plural (list keys, paths)
_NAMES = {"Client": ("username", "clients"), "Group": ("groupname", "groups"),
          "Role": ("rolename", "roles")}  # fmt: skip
# the links an API call adds or removes: path -> (command suffix, holder kind, member kind)
_LINKS = {
    "clients/{username}/roles": ("ClientRole", "Client", "Role"),
    "groups/{groupname}/clients": ("GroupClient", "Group", "Client"),
    "groups/{groupname}/roles": ("GroupRole", "Group", "Role"),
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _string(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"{key}: expected a non-empty string")
    return value


def _priority(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key}: expected an integer")
    return value


def _texts(body: dict[str, Any], command: dict[str, Any]) -> dict[str, Any]:
    """``command`` with the optional text fields of ``body`` (non-empty strings)."""
    for key in ("textname", "textdescription"):
        if body.get(key) is not None:
            command[key] = _string(body, key)
    return command


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


def _acl(body: dict[str, Any], with_rule: bool, where: str = "") -> dict[str, Any]:
    """An ACL of a request (``where``: its place in the body, for errors)."""
    acltype = body.get("acltype")
    if acltype not in ACL_TYPES:
        raise ApiError(400, f"{where}acltype: expected one of {', '.join(sorted(ACL_TYPES))}")
    topic = body.get("topic")
    if not isinstance(topic, str) or not topic:
        raise ApiError(400, f"{where}topic: expected a non-empty string")
    acl: dict[str, Any] = {"acltype": acltype, "topic": topic}
    if with_rule:
        allow = body.get("allow", False)
        if not isinstance(allow, bool):
            raise ApiError(400, f"{where}allow: expected true or false")
        acl["allow"] = allow
        acl["priority"] = _priority(body.get("priority", 0), f"{where}priority")
    return acl


def _bound(method: Callable[[web.Request, Any], Awaitable[web.Response]], arg: Any) -> Handler:
    """A route's handler: ``method`` with its second argument fixed."""

    async def handle(request: web.Request) -> web.Response:
        return await method(request, arg)

    return handle


class DynsecApi:
    """The handlers; ``service`` is set once the broker has started its dynamic security."""

    def __init__(self) -> None:
        self.service: DynsecService | None = None

    def routes(self) -> list[web.RouteDef]:
        routes = [
            web.post(f"{PREFIX}/clients", self.create_client),
            web.post(f"{PREFIX}/clients/{{username}}/disable", self.disable_client),
            web.post(f"{PREFIX}/clients/{{username}}/enable", self.enable_client),
            web.post(f"{PREFIX}/clients/{{username}}/password", self.set_password),
            web.post(f"{PREFIX}/groups", self.create_group),
            web.post(f"{PREFIX}/roles", self.create_role),
            web.post(f"{PREFIX}/roles/{{rolename}}/acls", self.add_acl),
            web.delete(f"{PREFIX}/roles/{{rolename}}/acls", self.remove_acl),
        ]
        for kind, (key, plural) in _NAMES.items():
            routes += [
                web.get(f"{PREFIX}/{plural}", _bound(self._list, kind)),
                web.get(f"{PREFIX}/{plural}/{{{key}}}", _bound(self._get, kind)),
                web.delete(f"{PREFIX}/{plural}/{{{key}}}", _bound(self._delete, kind)),
            ]
        for path, link in _LINKS.items():
            member = _NAMES[link[2]][0]
            routes += [
                web.post(f"{PREFIX}/{path}", _bound(self._link, link)),
                web.delete(f"{PREFIX}/{path}/{{{member}}}", _bound(self._unlink, link)),
            ]
        return routes

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
                f"{k}={v!r}"
                for k, v in command.items()
                if k in ("username", "groupname", "rolename", "topic")
            )
            request["audit"] = f"dynsec {name} {args}".rstrip()
        data = answer.get("data")
        return data if isinstance(data, dict) else {}

    async def _shown(self, request: web.Request, kind: str, name: str) -> web.Response:
        """The answer to a change: the client, group or role as it is now."""
        key = _NAMES[kind][0]
        data = await self._run(request, {"command": "get" + kind, key: name})
        return web.json_response(data[kind.lower()])

    async def _body(self, request: web.Request) -> dict[str, Any]:
        """The JSON body of a change (404 first without the dynamic security)."""
        if self.service is None:
            await self._run(request, {"command": "listClients"})  # 404
        return await json_body(request)

    async def _list(self, request: web.Request, kind: str) -> web.Response:
        plural = _NAMES[kind][1]
        data = await self._run(request, {"command": f"list{kind}s", "verbose": True})
        return web.json_response({"items": data[plural], "total": data["totalCount"]})

    async def _get(self, request: web.Request, kind: str) -> web.Response:
        return await self._shown(request, kind, request.match_info[_NAMES[kind][0]])

    async def _delete(self, request: web.Request, kind: str) -> web.Response:
        key = _NAMES[kind][0]
        name = request.match_info[key]
        await self._run(request, {"command": "delete" + kind, key: name})
        return web.json_response({"deleted": name})

    async def _link(self, request: web.Request, link: tuple[str, str, str]) -> web.Response:
        """Add a role to a client or group, or a client to a group; the holder as it is now."""
        suffix, holder, member = link
        body = await self._body(request)
        key, member_key = _NAMES[holder][0], _NAMES[member][0]
        name = request.match_info[key]
        command: dict[str, Any] = {"command": "add" + suffix, key: name}
        command[member_key] = _string(body, member_key)
        if body.get("priority") is not None:
            command["priority"] = _priority(body["priority"], "priority")
        await self._run(request, command)
        return await self._shown(request, holder, name)

    async def _unlink(self, request: web.Request, link: tuple[str, str, str]) -> web.Response:
        suffix, holder, member = link
        key, member_key = _NAMES[holder][0], _NAMES[member][0]
        name = request.match_info[key]
        command = {"command": "remove" + suffix, key: name}
        command[member_key] = request.match_info[member_key]
        await self._run(request, command)
        return await self._shown(request, holder, name)

    async def create_client(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        command: dict[str, Any] = {
            "command": "createClient",
            "username": _string(body, "username"),
            "password": _string(body, "password"),
            "roles": _roles(body),
        }
        if body.get("clientid") is not None:
            command["clientid"] = _string(body, "clientid")
        await self._run(request, _texts(body, command))
        return await self._shown(request, "Client", command["username"])

    async def set_password(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        username = request.match_info["username"]
        command = {"command": "setClientPassword", "username": username}
        command["password"] = _string(body, "password")
        await self._run(request, command)
        return await self._shown(request, "Client", username)

    async def create_group(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        groupname = _string(body, "groupname")
        command = {"command": "createGroup", "groupname": groupname, "roles": _roles(body)}
        await self._run(request, _texts(body, command))
        return await self._shown(request, "Group", groupname)

    async def create_role(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        rolename = _string(body, "rolename")
        acls = body.get("acls", [])
        if not isinstance(acls, list) or not all(isinstance(a, dict) for a in acls):
            raise ApiError(400, "acls: expected a list of ACL objects")
        command = {
            "command": "createRole",
            "rolename": rolename,
            "acls": [_acl(acl, True, f"acls[{i}].") for i, acl in enumerate(acls)],
        }
        await self._run(request, _texts(body, command))
        return await self._shown(request, "Role", rolename)

    async def _switch(self, request: web.Request, name: str) -> web.Response:
        username = request.match_info["username"]
        await self._run(request, {"command": name, "username": username})
        return await self._shown(request, "Client", username)

    async def disable_client(self, request: web.Request) -> web.Response:
        return await self._switch(request, "disableClient")

    async def enable_client(self, request: web.Request) -> web.Response:
        return await self._switch(request, "enableClient")

    async def _acl_change(self, request: web.Request, name: str, with_rule: bool) -> web.Response:
        rolename = request.match_info["rolename"]
        acl = _acl(await self._body(request), with_rule)
        await self._run(request, {"command": name, "rolename": rolename, **acl})
        return await self._shown(request, "Role", rolename)

    async def add_acl(self, request: web.Request) -> web.Response:
        return await self._acl_change(request, "addRoleACL", True)

    async def remove_acl(self, request: web.Request) -> web.Response:
        return await self._acl_change(request, "removeRoleACL", False)

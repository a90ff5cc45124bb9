"""Dynamic security, wire-compatible with Mosquitto's plugin: clients, groups and roles with
ordered ACL entries, managed by JSON commands on ``$CONTROL/dynamic-security/v1`` (answers on
``.../v1/response``), so that ``mosquitto_ctrl dynsec ...`` works against this broker.

This module is the model and the command handling, without I/O (:class:`Dynsec`), the
logins of its clients (:class:`DynsecAuthenticator`, with the password file's limits on failed
logins and hashing) and the broker's Authorizer over it (:class:`DynsecAuthorizer`), the state file (:func:`load_state`, :func:`save_state`: Mosquitto's
``dynamic-security.json``, written atomically) and :class:`DynsecService`, the small edge that
takes commands from the broker as an internal subscriber, persists and answers.

Decisions follow Mosquitto's: a client's roles (highest priority first), then its groups'
roles (groups by the client's priority in them, each group's roles by priority); in each role
the ACLs of the kind asked (``publishClientSend`` to publish, ``publishClientReceive`` to
receive, ``subscribeLiteral`` then ``subscribePattern`` to subscribe), highest priority first;
the first ACL that matches decides, and if none does, the default ACL access does. A client
without a user name gets the anonymous group's roles. A user name the dynamic security does
not know is denied everything (its login is left to the password file, if any).

Who may send commands is itself an ACL: ``publishClientSend`` on the command topic (the
``admin`` role of ``mosquitto_ctrl dynsec init``). Anyone else's command is refused by the
authorizer, logged, and never answered. Commands on the command topic are delivered to no
other subscriber (they may carry passwords).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..broker.auth import LoginRequest
from ..broker.router import UNRETAINED
from ..broker.sink import Sink
from ..broker.topics import valid_topic_filter
from ..protocol.fastpath import encode_topic
from ..protocol.reasons import ReasonCode
from .filters import Levels, covers, matches, overlaps, split
from .passwords import MAX_ITERATIONS, write_atomically

if TYPE_CHECKING:
    from ..broker.core import Broker
    from ..broker.session import Session
    from .authenticator import FileAuthenticator

log = logging.getLogger("mqttbroker.security.dynsec")
audit = logging.getLogger("mqttbroker.security.dynsec.audit")

COMMAND_TOPIC = "$CONTROL/dynamic-security/v1"
RESPONSE_TOPIC = COMMAND_TOPIC + "/response"
SERVICE_CLIENT_ID = "$dynsec"

PUBLISH_SEND = "publishClientSend"
PUBLISH_RECEIVE = "publishClientReceive"
SUBSCRIBE_LITERAL = "subscribeLiteral"
SUBSCRIBE_PATTERN = "subscribePattern"
UNSUBSCRIBE_LITERAL = "unsubscribeLiteral"
UNSUBSCRIBE_PATTERN = "unsubscribePattern"
ACL_TYPES = (
    PUBLISH_SEND,
    PUBLISH_RECEIVE,
    SUBSCRIBE_LITERAL,
    SUBSCRIBE_PATTERN,
    UNSUBSCRIBE_LITERAL,
    UNSUBSCRIBE_PATTERN,
)
DEFAULT_ACCESS_TYPES = (PUBLISH_SEND, PUBLISH_RECEIVE, "subscribe", "unsubscribe")
# mosquitto_ctrl dynsec init's defaults, and Mosquitto's when the file has none
DEFAULT_ACCESS = {
    PUBLISH_SEND: False,
    PUBLISH_RECEIVE: True,
    "subscribe": False,
    "unsubscribe": True,
}

DEFAULT_ITERATIONS = 210_000  # PBKDF2-SHA-512 for passwords set here (Mosquitto's own: 101)
SALT_BYTES = 12
_CACHE_SIZE = 4096


class DynsecError(Exception):
    """A state file that cannot be loaded."""


# -- the model ---------------------------------------------------------------------------------


@dataclass(slots=True)
class PasswordHash:
    """Mosquitto's dynamic-security password: PBKDF2-HMAC-SHA-512 of the password with the salt
    (stored base64) and iteration count; the hash is stored base64 too."""

    hash: bytes
    salt: bytes
    iterations: int

    @classmethod
    def make(cls, password: str, iterations: int = DEFAULT_ITERATIONS) -> PasswordHash:
        salt = secrets.token_bytes(SALT_BYTES)
        return cls(_derive(password.encode(), salt, iterations), salt, iterations)

    def verify(self, password: bytes) -> bool:
        return hmac.compare_digest(_derive(password, self.salt, self.iterations), self.hash)


def _derive(password: bytes, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha512", password, salt, iterations)


@dataclass(slots=True)
class Acl:
    acltype: str
    topic: str
    allow: bool
    priority: int = 0


@dataclass(slots=True)
class Role:
    rolename: str
    textname: str | None = None
    textdescription: str | None = None
    acls: list[Acl] = field(default_factory=list)

    def ordered_acls(self) -> list[Acl]:
        """By kind (Mosquitto's order), then highest priority first (ties: as added)."""
        return sorted(self.acls, key=lambda a: (ACL_TYPES.index(a.acltype), -a.priority))

    def acls_json(self) -> list[dict[str, Any]]:
        return [
            {"acltype": a.acltype, "topic": a.topic, "priority": a.priority, "allow": a.allow}
            for a in self.ordered_acls()
        ]


@dataclass(slots=True)
class Client:
    username: str
    password: PasswordHash | None = None
    clientid: str | None = None
    textname: str | None = None
    textdescription: str | None = None
    disabled: bool = False
    roles: dict[str, int] = field(default_factory=dict)  # rolename -> priority (-1: none given)


@dataclass(slots=True)
class Group:
    groupname: str
    textname: str | None = None
    textdescription: str | None = None
    roles: dict[str, int] = field(default_factory=dict)
    clients: dict[str, int] = field(default_factory=dict)  # username -> priority


def _by_priority(items: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(items.items(), key=lambda item: (-item[1], item[0]))


def _named(key: str, name: str, priority: int) -> dict[str, Any]:
    entry: dict[str, Any] = {key: name}
    if priority != -1:
        entry["priority"] = priority
    return entry


def _named_list(key: str, links: dict[str, int]) -> list[dict[str, Any]]:
    """Links (roles, groups, clients) as JSON, highest priority first."""
    return [_named(key, name, priority) for name, priority in _by_priority(links)]


def _texts(
    target: dict[str, Any],
    item: Client | Group | Role,
    name_key: str = "textname",
    description_key: str = "textdescription",
) -> None:
    """The text name and description of ``item`` that are set, into ``target``."""
    if item.textname is not None:
        target[name_key] = item.textname
    if item.textdescription is not None:
        target[description_key] = item.textdescription


def _file_entry(key: str, name: str, item: Client | Group | Role) -> dict[str, Any]:
    """The start of a client's, group's or role's entry in the state file."""
    entry: dict[str, Any] = {key: name}
    _texts(entry, item, "textName", "textDescription")
    return entry


def _links(raw: dict[str, Any], key: str, name: str, known: dict[str, Any]) -> dict[str, int]:
    """A state file's list of roles, groups or clients with priorities (names in ``known``)."""
    return {
        item[name]: int(item.get("priority", -1))
        for item in raw.get(key, [])
        if item[name] in known
    }


@dataclass(slots=True)
class _Compiled:
    """One user's ACLs of each kind in the order they are tried (allow, split topic)."""

    send: list[tuple[bool, Levels]] = field(default_factory=list)
    receive: list[tuple[bool, Levels]] = field(default_factory=list)
    # (literal, allow, topic as written, split): literal ACLs are compared as strings
    subscribe: list[tuple[bool, bool, str, Levels]] = field(default_factory=list)
    unsubscribe: list[tuple[bool, bool, str, Levels]] = field(default_factory=list)
    receive_denies: bool = False  # some receive ACL denies


def _first(rules: list[tuple[bool, Levels]], topic: str, default: bool) -> bool:
    levels = split(topic)
    for allow, pattern in rules:
        if matches(pattern, levels):
            return allow
    return default


def _first_filter(
    rules: list[tuple[bool, bool, str, Levels]], topic_filter: str, default: bool
) -> bool:
    levels = split(topic_filter)
    for literal, allow, text, pattern in rules:
        if (text == topic_filter) if literal else covers(pattern, levels):
            return allow
    return default


class Dynsec:
    """The dynamic security's state and its commands (no I/O). ``generation`` moves on with
    every change, so that cached decisions are dropped."""

    def __init__(self, iterations: int = DEFAULT_ITERATIONS) -> None:
        self.clients: dict[str, Client] = {}
        self.groups: dict[str, Group] = {}
        self.roles: dict[str, Role] = {}
        self.default_access: dict[str, bool] = dict(DEFAULT_ACCESS)
        self.anonymous_group: str | None = None
        self.iterations = iterations
        self.generation = 0
        self._cache: dict[str | None, _Compiled | None] = {}
        self._stand_in: PasswordHash | None = None

    def changed(self) -> None:
        self.generation += 1
        self._cache.clear()

    def copy(self) -> Dynsec:
        """A copy of the state that commands may change without touching this one (see
        :meth:`adopt`)."""
        other = Dynsec(self.iterations)
        other.clients = copy.deepcopy(self.clients)
        other.groups = copy.deepcopy(self.groups)
        other.roles = copy.deepcopy(self.roles)
        other.default_access = dict(self.default_access)
        other.anonymous_group = self.anonymous_group
        other.generation = self.generation
        return other

    def adopt(self, other: Dynsec) -> None:
        """Take the tables of ``other`` (a changed :meth:`copy`) as this state's own."""
        self.clients = other.clients
        self.groups = other.groups
        self.roles = other.roles
        self.default_access = other.default_access
        self.anonymous_group = other.anonymous_group
        self.changed()

    # -- Mosquitto's dynamic-security.json --------------------------------------------------

    @classmethod
    def from_json(cls, data: Any, iterations: int = DEFAULT_ITERATIONS) -> Dynsec:
        """From the decoded contents of a dynamic-security.json (DynsecError if malformed)."""
        if not isinstance(data, dict):
            raise DynsecError("not a JSON object")
        state = cls(iterations)
        try:
            access = data.get("defaultACLAccess", {})
            for key in DEFAULT_ACCESS_TYPES:
                value = access.get(key)
                if isinstance(value, bool):
                    state.default_access[key] = value
            for raw in data.get("roles", []):
                role = Role(raw["rolename"], raw.get("textName"), raw.get("textDescription"))
                for acl in raw.get("acls", []):
                    if acl.get("acltype") in ACL_TYPES and isinstance(acl.get("topic"), str):
                        role.acls.append(
                            Acl(
                                acl["acltype"],
                                acl["topic"],
                                acl.get("allow") is True,
                                int(acl.get("priority", 0)),
                            )
                        )
                state.roles[role.rolename] = role
            for raw in data.get("clients", []):
                client = Client(
                    raw["username"],
                    clientid=raw.get("clientid"),
                    textname=raw.get("textName"),
                    textdescription=raw.get("textDescription"),
                    disabled=raw.get("disabled") is True,
                )
                if "password" in raw and "salt" in raw:
                    iters = int(raw.get("iterations", 101))
                    if not 1 <= iters <= MAX_ITERATIONS:
                        raise DynsecError(
                            f"client {client.username!r}: iterations {iters} out of range "
                            f"(1 to {MAX_ITERATIONS}: a bound, so that one entry cannot stall "
                            "every login)"
                        )
                    client.password = PasswordHash(
                        base64.b64decode(raw["password"], validate=True),
                        base64.b64decode(raw["salt"], validate=True),
                        iters,
                    )
                client.roles = _links(raw, "roles", "rolename", state.roles)
                state.clients[client.username] = client
            for raw in data.get("groups", []):
                group = Group(raw["groupname"], raw.get("textName"), raw.get("textDescription"))
                group.roles = _links(raw, "roles", "rolename", state.roles)
                group.clients = _links(raw, "clients", "username", state.clients)
                state.groups[group.groupname] = group
            anonymous = data.get("anonymousGroup")
            if isinstance(anonymous, str) and anonymous in state.groups:
                state.anonymous_group = anonymous
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DynsecError(f"malformed: {exc!r}") from None
        return state

    def to_json(self) -> dict[str, Any]:
        """The state as Mosquitto's plugin writes it (its own file loads it)."""
        clients = []
        for client in self._sorted(self.clients):
            entry = _file_entry("username", client.username, client)
            if client.clientid is not None:
                entry["clientid"] = client.clientid
            if client.password is not None:
                entry["password"] = base64.b64encode(client.password.hash).decode()
                entry["salt"] = base64.b64encode(client.password.salt).decode()
                entry["iterations"] = client.password.iterations
            if client.disabled:
                entry["disabled"] = True
            entry["roles"] = _named_list("rolename", client.roles)
            clients.append(entry)
        groups = [
            {
                **_file_entry("groupname", group.groupname, group),
                "roles": _named_list("rolename", group.roles),
                "clients": _named_list("username", group.clients),
            }
            for group in self._sorted(self.groups)
        ]
        roles = [
            {**_file_entry("rolename", role.rolename, role), "acls": role.acls_json()}
            for role in self._sorted(self.roles)
        ]
        result: dict[str, Any] = {
            "defaultACLAccess": dict(self.default_access),
            "clients": clients,
            "groups": groups,
            "roles": roles,
        }
        if self.anonymous_group is not None:
            result["anonymousGroup"] = self.anonymous_group
        return result

    @staticmethod
    def _sorted(table: dict[str, Any]) -> list[Any]:
        return [table[name] for name in sorted(table)]

    @classmethod
    def initial(cls, admin: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> Dynsec:
        """What ``mosquitto_ctrl dynsec init FILE ADMIN`` makes: one client in an ``admin``
        role that may send commands, read the answers and $SYS, and nothing else."""
        state = cls(iterations)
        role = Role("admin")
        for acltype, topic in (
            (PUBLISH_SEND, "$CONTROL/dynamic-security/#"),
            (PUBLISH_RECEIVE, "$CONTROL/dynamic-security/#"),
            (SUBSCRIBE_PATTERN, "$CONTROL/dynamic-security/#"),
            (PUBLISH_RECEIVE, "$SYS/#"),
            (SUBSCRIBE_PATTERN, "$SYS/#"),
            (PUBLISH_RECEIVE, "#"),
            (SUBSCRIBE_PATTERN, "#"),
            (UNSUBSCRIBE_PATTERN, "#"),
        ):
            role.acls.append(Acl(acltype, topic, True))
        state.roles["admin"] = role
        state.clients[admin] = Client(
            admin,
            PasswordHash.make(password, iterations),
            textname="Dynsec admin user",
            roles={"admin": -1},
        )
        return state

    # -- decisions --------------------------------------------------------------------------

    def compiled(self, username: str | None) -> _Compiled | None:
        """The ACLs of ``username`` (None: anonymous) in order; None: a user it does not know."""
        if username in self._cache:
            return self._cache[username]
        result: _Compiled | None = _Compiled()
        assert result is not None
        role_names: list[str] = []
        if username is None:
            group = self.groups.get(self.anonymous_group or "")
            if group is not None:
                role_names = [name for name, _ in _by_priority(group.roles)]
        else:
            client = self.clients.get(username)
            if client is None:
                result = None
            else:
                role_names = [name for name, _ in _by_priority(client.roles)]
                memberships = {
                    g.groupname: g.clients[username]
                    for g in self.groups.values()
                    if username in g.clients
                }
                for groupname, _ in _by_priority(memberships):
                    role_names.extend(n for n, _ in _by_priority(self.groups[groupname].roles))
        if result is not None:
            for name in role_names:
                role = self.roles.get(name)
                if role is None:
                    continue
                for acl in role.ordered_acls():
                    levels = split(acl.topic)
                    if acl.acltype == PUBLISH_SEND:
                        result.send.append((acl.allow, levels))
                    elif acl.acltype == PUBLISH_RECEIVE:
                        result.receive.append((acl.allow, levels))
                        result.receive_denies |= not acl.allow
                    else:
                        literal = acl.acltype in (SUBSCRIBE_LITERAL, UNSUBSCRIBE_LITERAL)
                        target = (
                            result.subscribe
                            if acl.acltype in (SUBSCRIBE_LITERAL, SUBSCRIBE_PATTERN)
                            else result.unsubscribe
                        )
                        target.append((literal, acl.allow, acl.topic, levels))
        if len(self._cache) >= _CACHE_SIZE:
            self._cache.clear()
        self._cache[username] = result
        return result

    def can_publish(self, username: str | None, topic: str) -> bool:
        rules = self.compiled(username)
        if rules is None:
            return False
        return _first(rules.send, topic, self.default_access[PUBLISH_SEND])

    def can_receive(self, username: str | None, topic: str) -> bool:
        if topic == COMMAND_TOPIC:
            return False  # commands (and their passwords) go to the dynamic security alone
        rules = self.compiled(username)
        if rules is None:
            return False
        return _first(rules.receive, topic, self.default_access[PUBLISH_RECEIVE])

    def can_subscribe(self, username: str | None, topic_filter: str) -> bool:
        rules = self.compiled(username)
        if rules is None:
            return False
        return _first_filter(rules.subscribe, topic_filter, self.default_access["subscribe"])

    def can_unsubscribe(self, username: str | None, topic_filter: str) -> bool:
        rules = self.compiled(username)
        if rules is None:
            return False
        return _first_filter(rules.unsubscribe, topic_filter, self.default_access["unsubscribe"])

    def needs_read_check(self, username: str | None, topic_filter: str) -> bool:
        """Whether some topic of ``topic_filter`` may be refused to this user on receipt."""
        levels = split(topic_filter)
        if overlaps(split(COMMAND_TOPIC), levels):
            return True
        rules = self.compiled(username)
        if rules is None:
            return True
        if not self.default_access[PUBLISH_RECEIVE]:
            return True
        return rules.receive_denies and any(
            not allow and overlaps(pattern, levels) for allow, pattern in rules.receive
        )

    def login(self, client_id: str, username: str, password: bytes | None) -> int | None:
        """The answer to a login as ``username``: None if it is not a client of the dynamic
        security (another authenticator may know it), else a reason code (0 accepts). The
        password is checked first, so that only its owner learns that a client is disabled or
        bound to another client id (0x87). Without the failure limits and the CPU budget:
        logins go through :class:`DynsecAuthenticator`."""
        if username not in self.clients:
            return None
        if password is None or not self.verify(username, password):
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        return self.admission(client_id, username)

    def verify(self, username: str, password: bytes) -> bool:
        """Whether ``password`` is the password of client ``username``. A client without one
        (or gone meanwhile) costs a stand-in's hashing, as much as a password set here."""
        client = self.clients.get(username)
        stored = client.password if client is not None else None
        if stored is None:
            stand_in = self._stand_in
            if stand_in is None or stand_in.iterations != self.iterations:
                stand_in = PasswordHash(
                    secrets.token_bytes(64), secrets.token_bytes(SALT_BYTES), self.iterations
                )
                self._stand_in = stand_in
            stand_in.verify(password)  # the same work: no hint that there is no password
            return False
        return stored.verify(password)

    def admission(self, client_id: str, username: str) -> int:
        """Once its password is right: 0x87 if client ``username`` is disabled or bound to
        another client id, else 0."""
        client = self.clients.get(username)
        if client is None:
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        if client.disabled or client.clientid not in (None, client_id):
            return ReasonCode.NOT_AUTHORIZED
        return ReasonCode.SUCCESS

    # -- commands -----------------------------------------------------------------------------

    def handle(self, payload: bytes) -> tuple[bytes, list[dict[str, Any]]]:
        """Run the commands of one message; the response payload, and what each command was
        (its name, arguments and error, for the audit log). ``generation`` moves on if
        anything changed."""
        return self.handle_document(decode(payload))

    def handle_document(self, document: Any) -> tuple[bytes, list[dict[str, Any]]]:
        """:meth:`handle` for a payload already decoded (``NOT_JSON``: it was not JSON)."""
        outcomes: list[dict[str, Any]] = []
        responses: list[dict[str, Any]] = []
        if document is NOT_JSON:
            responses.append({"command": "Unknown command", "error": "Payload not valid JSON"})
        else:
            commands = document.get("commands") if isinstance(document, dict) else None
            if isinstance(commands, list):
                for command in commands:
                    responses.append(self._one(command, outcomes))
            else:
                responses.append(
                    {"command": "Unknown command", "error": "Invalid/missing commands"}
                )
        body = json.dumps({"responses": responses}, separators=(",", ":"), ensure_ascii=False)
        return body.encode(), outcomes

    def _one(self, command: Any, outcomes: list[dict[str, Any]]) -> dict[str, Any]:
        if not isinstance(command, dict):
            return {"command": "Unknown command", "error": "Command not an object"}
        name = command.get("command")
        if not isinstance(name, str):
            return {"command": "Unknown command", "error": "Missing command"}
        correlation = command.get("correlationData")
        handler = _HANDLERS.get(name)
        data: dict[str, Any] | None = None
        if handler is None:
            error: str | None = "Unknown command"
        else:
            try:
                data = handler(self, command)
                error = None
            except _Refused as exc:
                error = str(exc)
        response: dict[str, Any] = {"command": name}
        if error is not None:
            response["error"] = error
        elif data is not None:
            response["data"] = data
        if isinstance(correlation, str):
            response["correlationData"] = correlation
        outcomes.append({"command": name, "args": command, "error": error})
        return response

    # one method per command: the response's data (None: none), or _Refused(error)

    def _client(self, command: dict[str, Any]) -> Client:
        return _find(self.clients, command, "username", "Client not found")

    def _group(self, command: dict[str, Any]) -> Group:
        return _find(self.groups, command, "groupname", "Group not found")

    def _role(self, command: dict[str, Any]) -> Role:
        return _find(self.roles, command, "rolename", "Role not found")

    def _password(self, command: dict[str, Any]) -> PasswordHash:
        made = command.get(PREHASHED)
        if isinstance(made, PasswordHash):
            return made
        password = command.get("password")
        if not isinstance(password, str) or not password:
            raise _Refused("Invalid/missing password")
        return PasswordHash.make(password, self.iterations)

    def _role_list(self, command: dict[str, Any], key: str) -> dict[str, int] | None:
        """``roles``/``groups`` of a create/modify command: name -> priority (None: absent)."""
        items = command.get(key)
        if items is None:
            return None
        if not isinstance(items, list):
            raise _Refused(f"Invalid/missing {key}")
        table = self.roles if key == "roles" else self.groups
        which = "rolename" if key == "roles" else "groupname"
        result: dict[str, int] = {}
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get(which), str):
                raise _Refused(f"Invalid/missing {key}")
            if item[which] not in table:
                raise _Refused("Role not found" if key == "roles" else "Group not found")
            result[item[which]] = _priority(item)
        return result

    def cmd_getDefaultACLAccess(self, command: dict[str, Any]) -> dict[str, Any]:
        return {
            "acls": [
                {"acltype": kind, "allow": self.default_access[kind]}
                for kind in DEFAULT_ACCESS_TYPES
            ]
        }

    def cmd_setDefaultACLAccess(self, command: dict[str, Any]) -> None:
        acls = command.get("acls")
        if not isinstance(acls, list):
            raise _Refused("Missing/invalid actions array")
        for acl in acls:  # unknown kinds and access words are passed over, as Mosquitto does
            if not isinstance(acl, dict) or acl.get("acltype") not in DEFAULT_ACCESS_TYPES:
                continue
            access = acl.get("access")
            if access in ("allow", "deny"):
                self.default_access[acl["acltype"]] = access == "allow"
        self.changed()

    def cmd_getAnonymousGroup(self, command: dict[str, Any]) -> dict[str, Any]:
        return {"group": {"groupname": self.anonymous_group or ""}}

    def cmd_setAnonymousGroup(self, command: dict[str, Any]) -> None:
        self.anonymous_group = self._group(command).groupname
        self.changed()

    # clients

    def cmd_createClient(self, command: dict[str, Any]) -> None:
        username = _name(command, "username")
        if username in self.clients:
            raise _Refused("Client already exists")
        clientid = _text(command, "clientid")
        password = self._password(command) if "password" in command else None
        roles = self._role_list(command, "roles") or {}
        groups = self._role_list(command, "groups") or {}
        self.clients[username] = Client(
            username,
            password,
            clientid,
            _text(command, "textname"),
            _text(command, "textdescription"),
            roles=roles,
        )
        for groupname, priority in groups.items():
            self.groups[groupname].clients[username] = priority
        self.changed()

    def cmd_deleteClient(self, command: dict[str, Any]) -> None:
        username = self._client(command).username
        del self.clients[username]
        _unlink(username, [group.clients for group in self.groups.values()])
        self.changed()

    def cmd_enableClient(self, command: dict[str, Any]) -> None:
        self._client(command).disabled = False
        self.changed()

    def cmd_disableClient(self, command: dict[str, Any]) -> None:
        self._client(command).disabled = True
        self.changed()

    def cmd_setClientId(self, command: dict[str, Any]) -> None:
        client = self._client(command)
        client.clientid = _text(command, "clientid") or None
        self.changed()

    def cmd_setClientPassword(self, command: dict[str, Any]) -> None:
        client = self._client(command)
        client.password = self._password(command)
        self.changed()

    def cmd_modifyClient(self, command: dict[str, Any]) -> None:
        client = self._client(command)
        roles = self._role_list(command, "roles")
        groups = self._role_list(command, "groups")
        password = self._password(command) if "password" in command else None
        if "clientid" in command:
            client.clientid = _text(command, "clientid") or None
        _set_texts(client, command)
        if password is not None:
            client.password = password
        if roles is not None:
            client.roles = roles
        if groups is not None:
            for group in self.groups.values():
                group.clients.pop(client.username, None)
            for groupname, priority in groups.items():
                self.groups[groupname].clients[client.username] = priority
        self.changed()

    def _client_json(self, client: Client) -> dict[str, Any]:
        entry: dict[str, Any] = {"username": client.username}
        if client.clientid is not None:
            entry["clientid"] = client.clientid
        _texts(entry, client)
        if client.disabled:
            entry["disabled"] = True
        entry["roles"] = _named_list("rolename", client.roles)
        memberships = {
            g.groupname: g.clients[client.username]
            for g in self.groups.values()
            if client.username in g.clients
        }
        entry["groups"] = _named_list("groupname", memberships)
        return entry

    # groups

    def cmd_createGroup(self, command: dict[str, Any]) -> None:
        groupname = _name(command, "groupname")
        if groupname in self.groups:
            raise _Refused("Group already exists")
        roles = self._role_list(command, "roles") or {}
        self.groups[groupname] = Group(
            groupname, _text(command, "textname"), _text(command, "textdescription"), roles
        )
        self.changed()

    def cmd_deleteGroup(self, command: dict[str, Any]) -> None:
        group = self._group(command)
        if group.groupname == self.anonymous_group:
            raise _Refused("Deleting the anonymous group is forbidden")
        del self.groups[group.groupname]
        self.changed()

    def cmd_modifyGroup(self, command: dict[str, Any]) -> None:
        group = self._group(command)
        roles = self._role_list(command, "roles")
        _set_texts(group, command)
        if roles is not None:
            group.roles = roles
        self.changed()

    def _group_json(self, group: Group) -> dict[str, Any]:
        entry: dict[str, Any] = {"groupname": group.groupname}
        _texts(entry, group)
        entry["clients"] = [{"username": n} for n, _ in _by_priority(group.clients)]
        entry["roles"] = _named_list("rolename", group.roles)
        return entry

    # roles

    def _acl(self, command: dict[str, Any]) -> Acl:
        acltype, topic = _acl_key(command)
        if not valid_topic_filter(topic):
            raise _Refused("Invalid ACL topic")
        return Acl(acltype, topic, command.get("allow") is True, _priority(command, 0))

    def _acls(self, command: dict[str, Any]) -> list[Acl] | None:
        """The ``acls`` of a create/modify role command, each checked (None: absent)."""
        acls = command.get("acls")
        if acls is None:
            return None
        if not isinstance(acls, list) or not all(isinstance(a, dict) for a in acls):
            raise _Refused("Invalid/missing acls")
        return [self._acl(acl) for acl in acls]

    def cmd_createRole(self, command: dict[str, Any]) -> None:
        rolename = _name(command, "rolename")
        if rolename in self.roles:
            raise _Refused("Role already exists")
        role = Role(rolename, _text(command, "textname"), _text(command, "textdescription"))
        role.acls = self._acls(command) or []
        self.roles[rolename] = role
        self.changed()

    def cmd_deleteRole(self, command: dict[str, Any]) -> None:
        rolename = self._role(command).rolename
        del self.roles[rolename]
        _unlink(rolename, [client.roles for client in self.clients.values()])
        _unlink(rolename, [group.roles for group in self.groups.values()])
        self.changed()

    def cmd_modifyRole(self, command: dict[str, Any]) -> None:
        role = self._role(command)
        new = self._acls(command)
        _set_texts(role, command)
        if new is not None:
            role.acls = new
        self.changed()

    def cmd_addRoleACL(self, command: dict[str, Any]) -> None:
        role = self._role(command)
        acl = self._acl(command)
        if any(a.acltype == acl.acltype and a.topic == acl.topic for a in role.acls):
            raise _Refused("ACL with this topic already exists")
        role.acls.append(acl)
        self.changed()

    def cmd_removeRoleACL(self, command: dict[str, Any]) -> None:
        role = self._role(command)
        acltype, topic = _acl_key(command)
        kept = [a for a in role.acls if not (a.acltype == acltype and a.topic == topic)]
        if len(kept) == len(role.acls):
            raise _Refused("ACL not found")
        role.acls = kept
        self.changed()

    def _role_json(self, role: Role) -> dict[str, Any]:
        entry: dict[str, Any] = {"rolename": role.rolename}
        _texts(entry, role)
        entry["acls"] = role.acls_json()
        return entry

    # the commands that are alike for clients, groups and roles (registered in _HANDLERS)

    def _linked(self, command: dict[str, Any], kind: str) -> tuple[dict[str, int], str]:
        """For add/remove ``kind`` (ClientRole, GroupClient, GroupRole): the table of links
        the command changes and the name it adds or removes, looked up in Mosquitto's order."""
        if kind == "ClientRole":
            client = self._client(command)
            return client.roles, self._role(command).rolename
        if kind == "GroupClient":
            name = self._client(command).username
            return self._group(command).clients, name
        group = self._group(command)
        return group.roles, self._role(command).rolename

    def _add_link(self, command: dict[str, Any], kind: str, already: str) -> None:
        links, name = self._linked(command, kind)
        if name in links:
            raise _Refused(already)
        links[name] = _priority(command)
        self.changed()

    def _remove_link(self, command: dict[str, Any], kind: str) -> None:
        links, name = self._linked(command, kind)
        links.pop(name, None)
        self.changed()

    def _get(self, command: dict[str, Any], kind: str) -> dict[str, Any]:
        table, single, find, show = _KINDS[kind]
        return {single: getattr(self, show)(getattr(self, find)(command))}

    def _list(self, command: dict[str, Any], kind: str) -> dict[str, Any]:
        table, _single, _find, show = _KINDS[kind]
        items: dict[str, Any] = getattr(self, table)
        names, total = _page(items, command)
        if command.get("verbose") is True:
            return {"totalCount": total, table: [getattr(self, show)(items[n]) for n in names]}
        return {"totalCount": total, table: names}


# The key under which the service hands a password hashed off the event loop to the model.
PREHASHED = "\x00hash"


_T = TypeVar("_T")


class _Refused(Exception):
    """A command's error, as Mosquitto words it."""


_NAME_ERRORS = {
    "username": "Invalid/missing username",
    "groupname": "Invalid/missing groupname",
    "rolename": "Invalid/missing rolename",
}


def _name(command: dict[str, Any], key: str) -> str:
    value = command.get(key)
    if not isinstance(value, str) or not value:
        raise _Refused(_NAME_ERRORS[key])
    return value


def _find(table: dict[str, _T], command: dict[str, Any], key: str, missing: str) -> _T:
    """The client, group or role a command names by ``key``; _Refused(``missing``) if none."""
    item = table.get(_name(command, key))
    if item is None:
        raise _Refused(missing)
    return item


def _text(command: dict[str, Any], key: str) -> str | None:
    value = command.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Refused(f"Invalid/missing {key}")
    return value


def _unlink(name: str, tables: list[dict[str, int]]) -> None:
    """A deleted client or role out of the links that name it."""
    for table in tables:
        table.pop(name, None)


def _set_texts(item: Client | Group | Role, command: dict[str, Any]) -> None:
    """The text name and description a modify command gives, if it gives them."""
    if "textname" in command:
        item.textname = _text(command, "textname")
    if "textdescription" in command:
        item.textdescription = _text(command, "textdescription")


def _acl_key(command: dict[str, Any]) -> tuple[str, str]:
    """The ACL type and topic of an add/remove ACL command, checked as Mosquitto does."""
    acltype = command.get("acltype")
    if not isinstance(acltype, str):
        raise _Refused("Invalid/missing acltype")
    if acltype not in ACL_TYPES:
        raise _Refused("Unknown acltype")
    topic = command.get("topic")
    if not isinstance(topic, str):
        raise _Refused("Invalid/missing topic")
    return acltype, topic


def _priority(item: dict[str, Any], default: int = -1) -> int:
    value = item.get("priority", default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return int(value)


def _page(table: dict[str, Any], command: dict[str, Any]) -> tuple[list[str], int]:
    names = sorted(table)
    count = command.get("count", -1)
    offset = command.get("offset", 0)
    count = count if isinstance(count, int) and not isinstance(count, bool) else -1
    offset = offset if isinstance(offset, int) and not isinstance(offset, bool) else 0
    offset = max(offset, 0)
    page = names[offset:] if count < 0 else names[offset : offset + count]
    return page, len(names)


# kind -> (the table's attribute and list key, get's key, the lookup, the JSON of one)
_KINDS = {
    "Client": ("clients", "client", "_client", "_client_json"),
    "Group": ("groups", "group", "_group", "_group_json"),
    "Role": ("roles", "role", "_role", "_role_json"),
}
# add/remove kind -> the error of adding a link that exists
_LINKS = {
    "ClientRole": "Client is already in this role",
    "GroupClient": "Client is already in this group",
    "GroupRole": "Group is already in this role",
}
_Handler = Callable[[Dynsec, dict[str, Any]], dict[str, Any] | None]
_HANDLERS: dict[str, _Handler] = {
    name[len("cmd_") :]: getattr(Dynsec, name) for name in dir(Dynsec) if name.startswith("cmd_")
}
for _kind in _KINDS:
    _HANDLERS["get" + _kind] = partial(Dynsec._get, kind=_kind)
    _HANDLERS["list" + _kind + "s"] = partial(Dynsec._list, kind=_kind)
for _kind, _already in _LINKS.items():
    _HANDLERS["add" + _kind] = partial(Dynsec._add_link, kind=_kind, already=_already)
    _HANDLERS["remove" + _kind] = partial(Dynsec._remove_link, kind=_kind)
COMMANDS = frozenset(_HANDLERS)
MUTATING = frozenset(n for n in COMMANDS if not n.startswith(("get", "list")))


def audit_arguments(args: dict[str, Any]) -> str:
    """A command's arguments for the audit log, passwords left out."""
    parts = []
    for key, value in args.items():
        if key in ("command", "password", PREHASHED):
            continue
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        parts.append(f"{key}={text}")
    return " ".join(parts).encode("unicode_escape").decode("ascii")


# -- the state file ------------------------------------------------------------------------------


def load_state(path: str | Path, iterations: int = DEFAULT_ITERATIONS) -> Dynsec:
    """A dynamic-security.json (ours or Mosquitto's); DynsecError if unreadable or malformed."""
    try:
        data = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise DynsecError(f"{path}: {exc}") from None
    try:
        return Dynsec.from_json(data, iterations)
    except DynsecError as exc:
        raise DynsecError(f"{path}: {exc}") from None


def save_state(path: str | Path, state: Dynsec) -> None:
    """Write the whole state atomically (:func:`.passwords.write_atomically`: a crash leaves
    the old or the new state, whole); a new file is readable by its owner only."""
    write_atomically(path, json.dumps(state.to_json(), indent="\t").encode(), 0o600)


# -- the broker's interfaces ---------------------------------------------------------------------


class DynsecAuthorizer:
    """The broker's Authorizer over a :class:`Dynsec`; its ``generation`` is the state's, so
    connections drop their cached answers at every change."""

    def __init__(self, state: Dynsec) -> None:
        self.state = state

    @property
    def generation(self) -> int:
        return self.state.generation

    @generation.setter
    def generation(self, value: int) -> None:
        self.state.generation = value

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        allowed = self.state.can_publish(username, topic)
        if not allowed and topic == COMMAND_TOPIC:
            log.warning(
                "dynsec: client %s (user %r) is not an admin: its commands are ignored",
                client_id,
                username,
            )
        return allowed

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return self.state.can_subscribe(username, topic_filter)

    def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
        return self.state.can_receive(username, topic)

    def needs_read_check(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return self.state.needs_read_check(username, topic_filter)

    def can_unsubscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return self.state.can_unsubscribe(username, topic_filter)


class DynsecAuthenticator:
    """Logins of the dynamic security's clients, within the limits of the password file's
    logins: the failed logins per address and user name and the CPU budget of
    :meth:`.authenticator.FileAuthenticator.guarded` (``files``, the password file's
    authenticator, holds them, with or without a password file). Runs on a worker thread."""

    def __init__(self, state: Dynsec, files: FileAuthenticator) -> None:
        self.state = state
        self.files = files

    def check_password(self, login: LoginRequest) -> int | None:
        """A reason code (0 accepts), or None if the user name is not a client of the dynamic
        security (not its login to answer)."""
        state = self.state
        client_id, username, address = login.client_id, login.username, login.address
        if username is None or username not in state.clients:
            return None
        code = self.files.guarded(
            client_id, username, login.password, address, partial(state.verify, username), True
        )
        if code == ReasonCode.SUCCESS:
            code = state.admission(client_id, username)
        if code:
            log.info(
                "client %s from %s: dynsec login refused for user %r (0x%02X)",
                client_id,
                address,
                username,
                code,
            )
        return code


# -- the edge: commands in, state to disk, answers out ------------------------------------------


class DynsecService(Sink):
    """Takes the commands published on the command topic as an internal subscriber (a session
    of its own, never stored), runs them in order, writes the state to ``path`` before the
    answer goes out, then applies the change to live connections: subscriptions rechecked
    (a revoked right stops deliveries), disabled and deleted clients disconnected. Every
    command is an audit log line (who, from where, what, the outcome).

    ``run_blocking`` runs a function off the event loop and returns an awaitable of its result
    (password hashing, the file's fsync); ``spawn`` starts a coroutine."""

    def __init__(
        self,
        broker: Broker,
        state: Dynsec,
        path: str | Path | None,
        spawn: Callable[[Any], Any],
        run_blocking: Callable[[Callable[[], Any]], Any],
    ) -> None:
        from dataclasses import replace

        from ..broker.session import Session
        from ..broker.topics import Subscription

        self.broker = broker
        self.state = state
        self.path = Path(path) if path else None
        self.spawn = spawn
        self.run_blocking = run_blocking
        self._busy = False
        self._lock = asyncio.Lock()  # one message at a time (MQTT's and the admin API's)
        self._task: Any = None  # the running drain (a reference keeps it alive)
        session = Session(SERVICE_CLIENT_ID, replace(broker.options, queue_qos0=True))
        session.sink = self
        self.session: Session = session
        broker.router.track_origin = True  # who sent each command (the audit log)
        self._subscription = Subscription(session, COMMAND_TOPIC, 2, no_local=True)
        broker.router.subscribe(self._subscription)
        session.add_subscription(self._subscription)
        self._forget_retained()

    def _forget_retained(self) -> None:
        """Delete retained messages under ``$CONTROL/dynamic-security/`` that a version
        before the router refused to keep them stored (commands, with their passwords)."""
        from ..broker.message import Message

        retained = self.broker.router.retained
        for message in list(retained.match(UNRETAINED + "#", self.broker.clock())):
            log.warning("dynsec: deleting the retained message on %r", message.topic)
            retained.store(Message(message.topic, b"", retain=True))

    def wake(self) -> None:
        if not self._busy:
            self._busy = True
            self._task = self.spawn(self._drain())

    async def _drain(self) -> None:
        try:
            queue = self.session.queue
            while queue:
                delivery = queue.popleft()
                if not queue:
                    self.session.queue_emptied()
                self.session.queued_bytes -= delivery.message.size
                message = delivery.message
                try:
                    await self._run(message.payload, message.origin_id, message.origin_user)
                except Exception:
                    log.exception("dynsec: a command failed")
        finally:
            self._busy = False
        if self.session.queue:
            self.wake()

    async def _run(self, payload: bytes, client_id: str | None, username: str | None) -> None:
        """One command message from MQTT: run (:meth:`execute`), then answered."""
        response = await self.execute(
            decode(payload), f"{client_id}/{username}", self._address(client_id)
        )
        self._respond(response)

    async def run_commands(
        self, commands: list[dict[str, Any]], who: str, where: str
    ) -> list[dict[str, Any]]:
        """Commands of another front end (the admin API) through the same path as those of
        MQTT (saved before the answer, applied to live connections, audited with ``who`` and
        ``where``); their answers, as in a response payload's ``responses``. Nothing is
        published on the response topic."""
        response = await self.execute({"commands": commands}, who, where)
        answers: list[dict[str, Any]] = json.loads(response)["responses"]
        return answers

    async def execute(self, document: Any, who: str, where: str) -> bytes:
        """One command message (decoded). Commands that change something run on a copy of the
        state, written to disk first: only once it is there does the copy become the state and
        the answer go out. A copy that cannot be written changes nothing, and each of the
        message's commands is answered with an error (logged). Messages run one at a time,
        whichever front end sent them. Returns the response payload."""
        async with self._lock:
            return await self._execute(document, who, where)

    async def _execute(self, document: Any, who: str, where: str) -> bytes:
        await self._prehash(document)
        state = self.state
        work = state.copy() if _mutates(document) else state
        before = work.generation
        users = set(state.clients)
        response, outcomes = work.handle_document(document)
        changed = work.generation != before
        unsaved = ""
        if changed and self.path is not None:
            path = self.path
            try:
                await self.run_blocking(lambda: save_state(path, work))
            except Exception as exc:  # disk full, permissions...: not saved, so not done
                detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                unsaved = f"{path}: {detail}"
                log.error(
                    "dynsec: cannot write the state to %s; the commands of %s change "
                    "nothing and are answered with an error",
                    unsaved,
                    who,
                )
                response = _failed(response, f"{SAVE_ERROR}: {unsaved}")
        for outcome in outcomes:
            error = outcome["error"]
            if unsaved and not error:
                error = f"{SAVE_ERROR}: {unsaved}"
            if outcome["command"] in MUTATING or error:
                audit.info(
                    "dynsec: %s from %s | %s | %s%s",
                    who,
                    where,
                    outcome["command"],
                    audit_arguments(outcome["args"]),
                    f" | error: {error}" if error else "",
                )
        if changed and not unsaved:
            if work is not state:
                state.adopt(work)
            self._apply(users - set(state.clients))
        return response

    async def _prehash(self, document: Any) -> None:
        """Hash the passwords of the commands off the event loop (PBKDF2 takes milliseconds)."""
        if not isinstance(document, dict) or not isinstance(document.get("commands"), list):
            return
        for command in document["commands"]:
            if (
                isinstance(command, dict)
                and command.get("command") in ("createClient", "setClientPassword", "modifyClient")
                and isinstance(command.get("password"), str)
                and command["password"]
            ):
                password: str = command["password"]
                iterations = self.state.iterations
                command[PREHASHED] = await self.run_blocking(
                    partial(PasswordHash.make, password, iterations)
                )

    def _address(self, client_id: str | None) -> str:
        for conn in self.broker.connections:
            if conn.client_id == client_id:
                return str(conn.peer)
        return "?"

    def _apply(self, deleted: set[str]) -> None:
        """The new rules on live connections: the clients ``deleted`` and those disabled (or
        whose client id is no longer theirs) are disconnected, every subscription rechecked."""
        broker = self.broker
        clients = self.state.clients
        for conn in list(broker.connections):
            username = conn.username
            if username is None or conn.session is None:
                continue
            client = clients.get(username)
            why = None
            if username in deleted:
                why = "client deleted"
            elif client is not None and client.disabled:
                why = "client disabled"
            elif client is not None and client.clientid not in (None, conn.client_id):
                why = "client id no longer allowed"
            if why is not None:
                log.info(
                    "dynsec: disconnecting client %s (user %r): %s", conn.client_id, username, why
                )
                conn.disconnect(ReasonCode.NOT_AUTHORIZED, why)
        broker.recheck_subscriptions()

    def _respond(self, payload: bytes) -> None:
        from ..broker.message import Message

        broker = self.broker
        router = broker.router
        match = router.lookup(RESPONSE_TOPIC)
        if match is None:
            return
        now = broker.clock()
        message = Message.received(
            RESPONSE_TOPIC, encode_topic(RESPONSE_TOPIC), payload, 0, False, None, now
        )
        router.publish(message, match, None, now)  # subscribers' output is flushed as usual

    def close(self) -> None:
        removed = self.session.remove_subscription(COMMAND_TOPIC)
        if removed is not None:
            self.broker.router.unsubscribe(removed)


NOT_JSON = object()
SAVE_ERROR = "State not saved, nothing changed"


def _mutates(document: Any) -> bool:
    """Whether some command of a decoded message may change the state."""
    commands = document.get("commands") if isinstance(document, dict) else None
    return isinstance(commands, list) and any(
        isinstance(command, dict) and command.get("command") in MUTATING for command in commands
    )


def _failed(response: bytes, error: str) -> bytes:
    """``response`` (a message's answers) with every command answered with ``error``."""
    answers = json.loads(response)["responses"]
    for answer in answers:
        answer.pop("data", None)
        answer.setdefault("error", error)
    body = json.dumps({"responses": answers}, separators=(",", ":"), ensure_ascii=False)
    return body.encode()


def decode(payload: bytes) -> Any:
    """A command payload decoded; ``NOT_JSON`` if it is not JSON."""
    try:
        return json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return NOT_JSON

"""The ACL file: who may publish (write) and subscribe/receive (read) where.

When an ACL file is configured, everything it does not allow is denied, and a denial always beats
an allowance, whatever the order of the lines.

Syntax (Mosquitto's ``acl_file``, plus a few keywords of ours)
------------------------------------------------------------------
Blank lines and lines starting with ``#`` are ignored. Rules belong to the section they are in:

``user NAME``
    starts the rules of the clients that logged in as NAME;
``client ID`` (ours)
    starts the rules of the connections with client identifier ID, whoever they logged in as
    (client identifiers prove nothing by themselves: combine with ``user`` rules);
``anonymous`` (ours)
    goes back to the first section, which holds the rules of clients without a user name;
``all`` (ours)
    starts rules that apply to every client.

Rules:

``topic [read|write|readwrite|deny] TOPIC``
    allows (or with ``deny``, refuses both ways) TOPIC, a topic or a filter with ``+``/``#``, for
    the current section; without an access word, ``readwrite``;
``pattern [read|write|readwrite|deny] TOPIC``
    the same for every client, wherever the line is, after replacing ``%u`` by the client's user
    name and ``%c`` by its client identifier;
``allow read|write|readwrite TOPIC`` and ``deny read|write|readwrite TOPIC`` (ours)
    allow or deny one access for the current section, with ``%u``/``%c`` replaced; ``publish``
    is a synonym of ``write`` and ``subscribe`` of ``read``.

``write`` is needed to publish (and for a will to be published); ``read`` to subscribe and to
receive messages. A subscription is allowed only if one ``read`` rule matches every topic its
filter can match and no ``read`` denial matches all of them. What happens to a filter that some
denial can match only in part (``sensors/#`` under ``topic read #`` plus
``topic deny sensors/secret``) depends on ``[security] acl_partly_denied``:

* ``filter`` (the default, as Mosquitto does): the subscription is granted and the denied topics
  are withheld at delivery (:meth:`AclRules.needs_read_check` marks it when subscribing, and only
  such subscriptions check each message);
* ``refuse``: the subscription is refused (0x87).

A filter that a denial matches whole (``secret/x`` itself) is refused either way (Mosquitto
grants it and delivers nothing through it).

A rule with ``%u`` does nothing for a client without a user name. A substituted value that is
empty or holds ``/``, ``+`` or ``#`` (or would start the topic with ``$``) cannot be placed safely:
such a client gets nothing from the allowances that use it, and each denial that uses it
refuses that client everything of its access.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..broker.topics import valid_topic_filter
from .errors import SecurityFileError, read_file
from .filters import Levels, covers, matches, overlaps, split

READ = 1
WRITE = 2
READWRITE = READ | WRITE

_TOPIC_ACCESS = {"read": READ, "write": WRITE, "readwrite": READWRITE}
_RULE_ACCESS = {
    "read": READ,
    "subscribe": READ,
    "write": WRITE,
    "publish": WRITE,
    "readwrite": READWRITE,
}
_PLACEHOLDER = re.compile(r"%[uc]")
_UNSAFE = ("/", "+", "#")
_CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Rule:
    allow: bool
    access: int  # READ, WRITE or both
    topic: str  # as written
    substitute: bool  # %u / %c are placeholders
    line: int


@dataclass(slots=True)
class _Compiled:
    """The rules that apply to one (client id, user name), substituted and split."""

    allow_read: list[Levels] = field(default_factory=list)
    allow_write: list[Levels] = field(default_factory=list)
    deny_read: list[Levels] = field(default_factory=list)
    deny_write: list[Levels] = field(default_factory=list)
    deny_all_read: bool = False
    deny_all_write: bool = False

    def add(self, rule: Rule, levels: Levels | None) -> None:
        """``levels`` None: the substitution was unsafe for this client."""
        for bit, allows, denies in (
            (READ, self.allow_read, self.deny_read),
            (WRITE, self.allow_write, self.deny_write),
        ):
            if not rule.access & bit:
                continue
            if levels is None:
                if not rule.allow:
                    if bit == READ:
                        self.deny_all_read = True
                    else:
                        self.deny_all_write = True
            elif rule.allow:
                allows.append(levels)
            else:
                denies.append(levels)


def _allowed(deny_all: bool, denies: list[Levels], allows: list[Levels], topic: str) -> bool:
    """One access (read or write) to ``topic``: a denial wins over any allowance."""
    if deny_all:
        return False
    levels = split(topic)
    if any(matches(d, levels) for d in denies):
        return False
    return any(matches(a, levels) for a in allows)


_SKIP = object()  # the rule does not apply (%u without a user name)


def _substitute(template: str, client_id: str, username: str | None) -> str | None | object:
    """The rule's topic for this client; None if a value cannot be placed safely; _SKIP if the
    rule does not apply."""
    if "%u" in template and username is None:
        return _SKIP
    values = {"%u": username or "", "%c": client_id}
    for key, value in values.items():
        if key in template and (not value or any(ch in value for ch in _UNSAFE)):
            return None
    result = _PLACEHOLDER.sub(lambda m: values[m.group(0)], template)  # one pass: no re-expansion
    if result.startswith("$") and not template.startswith("$"):
        return None
    return result


@dataclass(eq=False)
class AclRules:
    """A parsed ACL file (immutable; a reload builds a new one)."""

    source: str
    anonymous: list[Rule]
    users: dict[str, list[Rule]]
    clients: dict[str, list[Rule]]
    everyone: list[Rule]
    _cache: dict[tuple[str, str | None], _Compiled] = field(
        default_factory=dict, init=False, repr=False
    )

    @property
    def rule_count(self) -> int:
        return (
            len(self.anonymous)
            + sum(len(r) for r in self.users.values())
            + sum(len(r) for r in self.clients.values())
            + len(self.everyone)
        )

    # -- loading --------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> AclRules:
        return cls.parse(read_file(path), str(path))

    @classmethod
    def parse(cls, data: bytes, source: str) -> AclRules:
        anonymous: list[Rule] = []
        users: dict[str, list[Rule]] = {}
        clients: dict[str, list[Rule]] = {}
        everyone: list[Rule] = []
        section = anonymous
        for number, raw in enumerate(data.splitlines(), 1):
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise SecurityFileError(source, "not valid UTF-8", number) from None
            if not text or text.startswith("#"):
                continue
            parts = text.split(None, 1)
            keyword = parts[0]
            rest = parts[1].strip() if len(parts) > 1 else ""

            fail = partial(SecurityFileError, source, line=number)

            if keyword in ("user", "client"):
                if not rest:
                    raise fail(f"'{keyword}' needs a name")
                table = users if keyword == "user" else clients
                section = table.setdefault(rest, [])
            elif keyword in ("anonymous", "all"):
                if rest:
                    raise fail(f"'{keyword}' takes nothing after it")
                section = anonymous if keyword == "anonymous" else everyone
            elif keyword in ("topic", "pattern"):
                words = rest.split(None, 1)
                if not words:
                    raise fail(f"'{keyword}' needs a topic")
                if words[0] in _TOPIC_ACCESS or words[0] == "deny":
                    if len(words) < 2:
                        raise fail(f"'{keyword} {words[0]}' needs a topic")
                    access_word, topic = words[0], words[1].strip()
                else:
                    access_word, topic = "readwrite", rest
                allow = access_word != "deny"
                access = _TOPIC_ACCESS.get(access_word, READWRITE)
                substitute = keyword == "pattern"
                _check_topic(topic, substitute, fail)
                rule = Rule(allow, access, topic, substitute, number)
                (everyone if substitute else section).append(rule)
            elif keyword in ("allow", "deny"):
                words = rest.split(None, 1)
                if len(words) < 2 or words[0] not in _RULE_ACCESS:
                    raise fail(
                        f"expected '{keyword} read|write|readwrite TOPIC' (or subscribe|publish)"
                    )
                topic = words[1].strip()
                _check_topic(topic, True, fail)
                section.append(
                    Rule(keyword == "allow", _RULE_ACCESS[words[0]], topic, True, number)
                )
            else:
                raise fail(
                    f"unknown keyword {keyword!r} (known: user, client, anonymous, all, topic, "
                    "pattern, allow, deny)"
                )
        return cls(source, anonymous, users, clients, everyone)

    # -- decisions ------------------------------------------------------------------------

    def compiled(self, client_id: str, username: str | None) -> _Compiled:
        key = (client_id, username)
        found = self._cache.get(key)
        if found is not None:
            return found
        result = _Compiled()
        sections = [
            self.anonymous if username is None else self.users.get(username, []),
            self.clients.get(client_id, []),
            self.everyone,
        ]
        for rules in sections:
            for rule in rules:
                if not rule.substitute:
                    result.add(rule, split(rule.topic))
                    continue
                topic = _substitute(rule.topic, client_id, username)
                if topic is _SKIP:
                    continue
                result.add(rule, split(topic) if isinstance(topic, str) else None)
        if len(self._cache) >= _CACHE_SIZE:
            self._cache.clear()
        self._cache[key] = result
        return result

    def can_write(self, client_id: str, username: str | None, topic: str) -> bool:
        rules = self.compiled(client_id, username)
        return _allowed(rules.deny_all_write, rules.deny_write, rules.allow_write, topic)

    def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
        rules = self.compiled(client_id, username)
        return _allowed(rules.deny_all_read, rules.deny_read, rules.allow_read, topic)

    def can_subscribe(
        self, client_id: str, username: str | None, topic_filter: str, partly: bool = False
    ) -> bool:
        """``partly``: grant a filter that a denial reaches only in part (its denied topics are
        then withheld at delivery); otherwise refuse it."""
        rules = self.compiled(client_id, username)
        if rules.deny_all_read:
            return False
        levels = split(topic_filter)
        denied = covers if partly else overlaps
        if any(denied(d, levels) for d in rules.deny_read):
            return False
        return any(covers(a, levels) for a in rules.allow_read)

    def needs_read_check(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        """Whether a read denial can match some topic of ``topic_filter``."""
        levels = split(topic_filter)
        return any(overlaps(d, levels) for d in self.compiled(client_id, username).deny_read)


def _check_topic(topic: str, substitute: bool, fail: Callable[[str], SecurityFileError]) -> None:
    probe = _PLACEHOLDER.sub("x", topic) if substitute else topic
    if not valid_topic_filter(probe):
        raise fail(f"invalid topic filter {topic!r}")


class AclAuthorizer:
    """The broker's Authorizer backed by an ACL file; ``replace`` swaps in reloaded rules and
    moves ``generation`` on, so connections drop the answers they cached."""

    def __init__(self, rules: AclRules, partly_denied: str = "filter") -> None:
        self.rules = rules
        self.generation = 0
        # "filter": grant a subscription a denial reaches in part and withhold the denied topics
        # at delivery; "refuse": refuse it (see the module docstring)
        self.partly = partly_denied == "filter"

    def replace(self, rules: AclRules) -> None:
        self.rules = rules
        self.generation += 1

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        return self.rules.can_write(client_id, username, topic)

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return self.rules.can_subscribe(client_id, username, topic_filter, self.partly)

    def needs_read_check(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        return self.partly and self.rules.needs_read_check(client_id, username, topic_filter)

    def can_read(self, client_id: str, username: str | None, topic: str) -> bool:
        return self.rules.can_read(client_id, username, topic)

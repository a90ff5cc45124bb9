"""Authentication and authorization from files: the password file (:mod:`.passwords`), the ACL file
(:mod:`.acl`), SCRAM (:mod:`.scram`), and :func:`build_security`, which makes the broker's
Authenticator and Authorizer from the ``[security]`` configuration and reloads both files on
demand (SIGHUP).

``[security]`` keys: ``password_file`` (none: user names are not checked, so a client that gives
one is as anonymous as one that does not), ``acl_file`` (none: everyone may publish and subscribe
anywhere; set: everything it does not allow is denied), and ``allow_anonymous`` (clients without
a user name, the default for every listener without its own ``allow_anonymous``; when absent,
each listener allows them only if it is local-only: see :func:`listener_anonymous`);
``max_login_failures`` and ``login_failure_window`` (failed logins per address and user name:
see :mod:`.authenticator`); ``min_iterations`` (weaker password-file entries stop the load);
``secret_file`` (the installation's secret: :func:`.authenticator.load_secret`).

``[dynsec]`` (:mod:`.dynsec`): with ``enabled``, the dynamic security's clients log in and its
roles decide every right (``security.acl_file`` must then be unset); user names it does not know
are left to the password file. Its state is ``file`` (default
``<data_dir>/dynamic-security.json``), started from ``import_file`` when absent.

``[jwt]`` (:mod:`.tokens`) and ``[http_auth]`` (:mod:`.http_backend`) are two more login
sources; ``[security] chain`` orders all four (:mod:`.chain`). Without ``chain``, the configured
ones in the order dynsec, password_file, jwt, http: a configuration written before the chain
existed behaves as it did.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..broker.auth import Authenticator, Authorizer
from ..broker.policy import ListenerPolicy
from ..config import configured_sources, is_loopback
from .acl import AclAuthorizer, AclRules
from .authenticator import FileAuthenticator, LoginFailures, load_secret
from .chain import AskingAuthorizer, AuthChain, ChainAuthenticator, ChainAuthorizer
from .dynsec import (
    Dynsec,
    DynsecAuthorizer,
    DynsecError,
    load_state,
    save_state,
)
from .errors import SecurityFileError
from .http_backend import HttpBackend
from .passwords import PasswordFile
from .tokens import TokenVerifier

if TYPE_CHECKING:
    from ..config import Config, ListenerConfig

__all__ = [
    "AclAuthorizer",
    "AclRules",
    "FileAuthenticator",
    "PasswordFile",
    "Security",
    "SecurityFileError",
    "anonymous_default",
    "listener_anonymous",
    "listener_policy",
    "build_security",
    "is_loopback",
    "local_only",
]

log = logging.getLogger("mqttbroker.security")


def local_only(listener: ListenerConfig) -> bool:
    """Whether only this machine's own clients reach ``listener``: it binds to loopback and is
    not behind a proxy (``ws_trusted_proxies``, ``proxy_protocol``), which may bind to loopback
    but serves whoever the proxy serves."""
    return is_loopback(listener.host) and not (
        listener.ws_trusted_proxies or listener.proxy_protocol
    )


def listener_anonymous(listener: ListenerConfig, setting: bool | None) -> bool:
    """Whether clients without a user name may connect to ``listener``: its own
    ``allow_anonymous``, else ``setting`` ([security] allow_anonymous), else only if it is
    local-only."""
    if listener.allow_anonymous is not None:
        return listener.allow_anonymous
    return local_only(listener) if setting is None else setting


def listener_policy(listener: ListenerConfig, setting: bool | None) -> ListenerPolicy:
    """What the broker is told about the connections ``listener`` accepts: its anonymous rule
    (see :func:`listener_anonymous`; ``setting`` is [security] allow_anonymous), whether it is
    local-only, and how the log names it."""
    return ListenerPolicy(
        allow_anonymous=listener_anonymous(listener, setting),
        local=local_only(listener),
        kind=listener.kind,
    )


def anonymous_default(listeners: Iterable[ListenerConfig]) -> bool:
    """Anonymous access is on by default only when every listener is local-only."""
    listeners = list(listeners)
    return bool(listeners) and all(local_only(listener) for listener in listeners)


class Security:
    """The broker's authenticator and authorizer, and the files they come from."""

    def __init__(
        self,
        authenticator: FileAuthenticator,
        authorizer: AclAuthorizer | None,
        password_file: str = "",
        acl_file: str = "",
        min_iterations: int = 0,
        dynsec: Dynsec | None = None,
        dynsec_path: str = "",
        chain: list[str] | None = None,
        tokens: TokenVerifier | None = None,
        http: HttpBackend | None = None,
    ) -> None:
        self.authenticator = authenticator  # the password file's (also the admin server's)
        self.authorizer = authorizer
        # The dynamic security ([dynsec]), if enabled, and where its state is kept ("": memory)
        self.dynsec = dynsec
        self.dynsec_path = dynsec_path
        self.tokens = tokens  # [jwt]
        self.http = http  # [http_auth]
        self.broker_authenticator: Authenticator = authenticator
        # The login sources in order (None: none configured, the anonymous rule alone: the
        # password file's authenticator without a file answers at once)
        names = list(chain or ())
        # an HTTP service with acl_url alone orders rights, but logs nobody in
        logins = [n for n in names if n != "http" or (http is not None and http.settings.url)]
        self.chain = AuthChain(logins, authenticator, dynsec, tokens, http) if logins else None
        if self.chain is not None:
            self.broker_authenticator = ChainAuthenticator(self.chain)
        self.chain_authorizer: ChainAuthorizer | None = None
        self.broker_authorizer: Authorizer | None = self._rights(names, authorizer)
        self.password_file = password_file
        self.acl_file = acl_file
        self.min_iterations = min_iterations

    def _rights(self, names: list[str], acl: AclAuthorizer | None) -> Authorizer | None:
        """The broker's authorizer: the rule sources in chain order (see :mod:`.chain`); one
        of them alone is asked directly (no cost over a broker without the chain)."""
        rules: list[tuple[str, object]] = []
        for name in names:
            if name == "dynsec" and self.dynsec is not None:
                rules.append((name, DynsecAuthorizer(self.dynsec)))
            elif name == "password_file" and acl is not None:
                rules.append((name, acl))
            elif name == "http" and self.http is not None and self.http.settings.acl_url:
                rules.append((name, None))
        if acl is not None and ("password_file", acl) not in rules:
            rules.insert(0, ("password_file", acl))  # an ACL without a password file: first
        token_rights = self.tokens is not None and bool(self.tokens.settings.acl_claim)
        asking = any(part is None for _, part in rules)
        if not token_rights and not asking and len(rules) <= 1:
            return rules[0][1] if rules else None  # type: ignore[return-value]
        kind = AskingAuthorizer if asking else ChainAuthorizer
        self.chain_authorizer = kind(rules, self.tokens, self.http)
        return self.chain_authorizer

    def reload(self) -> bool:
        """Read the files again (the JWT keys too). A file that fails to load is reported (file and line) and its
        previous contents stay in force; True if everything reloaded. Connections stay up; the
        new rules apply to what clients do next."""
        ok = True
        if self.password_file:
            try:
                passwords = PasswordFile.load(self.password_file, self.min_iterations)
            except SecurityFileError as exc:
                log.error("reload: %s; keeping the previous password file", exc)
                ok = False
            else:
                self.authenticator.replace_passwords(passwords)
                for warning in passwords.warnings:
                    log.warning("%s", warning)
                log.info("reloaded password file %s (%d users)", self.password_file, len(passwords))
        if self.acl_file and self.authorizer is not None:
            try:
                rules = AclRules.load(self.acl_file)
            except SecurityFileError as exc:
                log.error("reload: %s; keeping the previous ACL rules", exc)
                ok = False
            else:
                self.authorizer.replace(rules)
                log.info(
                    "reloaded ACL file %s (%d rules, generation %d)",
                    self.acl_file,
                    rules.rule_count,
                    self.authorizer.generation,
                )
        if self.tokens is not None:
            try:
                self.tokens.reload()
            except SecurityFileError as exc:
                log.error("reload: %s; keeping the previous JWT keys", exc)
                ok = False
            else:
                log.info("reloaded the JWT keys")
        return ok


def build_security(config: Config) -> Security:
    """The Security of ``config``: loads the files (SecurityFileError names file and line)."""
    settings = config.security
    allow_anonymous = settings.allow_anonymous
    if allow_anonymous is None:
        allow_anonymous = anonymous_default(config.listeners)
    password_file = os.path.abspath(settings.password_file) if settings.password_file else ""
    acl_file = os.path.abspath(settings.acl_file) if settings.acl_file else ""
    passwords = PasswordFile.load(password_file, settings.min_iterations) if password_file else None
    rules = AclRules.load(acl_file) if acl_file else None
    secret_file = settings.secret_file
    if not secret_file and config.storage.backend != "memory":
        secret_file = str(Path(config.data_dir) / "auth-secret")
    authenticator = FileAuthenticator(
        passwords,
        allow_anonymous,
        failures=LoginFailures(settings.max_login_failures, settings.login_failure_window),
        secret=load_secret(secret_file) if secret_file and passwords is not None else None,
    )
    authorizer = AclAuthorizer(rules, settings.acl_partly_denied) if rules is not None else None
    if passwords is not None:
        for warning in passwords.warnings:
            log.warning("%s", warning)
        log.info("password file %s: %d users", password_file, len(passwords))
    anonymous = [
        f"listener[{i}] ({listener.host}:{listener.port})"
        for i, listener in enumerate(config.listeners)
        if listener_anonymous(listener, settings.allow_anonymous)
    ]
    certificates = any(lst.tls_certificate_username != "none" for lst in config.listeners)
    dynsec, dynsec_path = _build_dynsec(config)
    chain = settings.chain or configured_sources(config)
    tokens = http = None
    if "jwt" in chain:
        tokens = TokenVerifier(config.jwt)
        log.info("JWT logins: algorithms %s", ", ".join(config.jwt.algorithms))
    if "http" in chain:
        http = HttpBackend(config.http_auth)
        log.info("HTTP auth backend: %s", config.http_auth.url or config.http_auth.acl_url)
    if len(chain) > 1 or tokens is not None or http is not None:
        log.info("login sources, in order: %s", ", ".join(chain))
    if not chain and not anonymous and not certificates:
        log.warning(
            "anonymous access is off, there is no password file and no listener takes user "
            "names from client certificates: every client will be refused. To accept clients "
            "without a user name, start with --allow-anonymous or set allow_anonymous = true "
            "in [security] (or in a [[listener]])"
        )
    if rules is not None:
        log.info("ACL file %s: %d rules", acl_file, rules.rule_count)
        if passwords is None and rules.users:
            log.warning(
                "the ACL file has user rules but there is no password file: user names are not "
                "checked, so any client may claim them"
            )
    if anonymous and len(anonymous) < len(config.listeners):
        log.info("anonymous access allowed on %s only", ", ".join(anonymous))
        if passwords is None:
            log.info("without a password file, user names count as anonymous: refused elsewhere")
    else:
        defaulted = settings.allow_anonymous is None and all(
            listener.allow_anonymous is None for listener in config.listeners
        )
        log.info(
            "anonymous access %s%s",
            "allowed" if anonymous else "refused",
            " (default for these listeners)" if defaulted else "",
        )
    return Security(
        authenticator,
        authorizer,
        password_file,
        acl_file,
        settings.min_iterations,
        dynsec,
        dynsec_path,
        chain,
        tokens,
        http,
    )


def _build_dynsec(config: Config) -> tuple[Dynsec | None, str]:
    """The dynamic security's state and its file ("": kept in memory), or None if disabled:
    the file if it exists, else ``import_file`` (written to the file at once), else empty.
    A file that does not load stops the start (SecurityFileError)."""
    settings = config.dynsec
    if not settings.enabled:
        return None, ""
    path = settings.file
    if not path and config.storage.backend != "memory":
        path = str(Path(config.data_dir) / "dynamic-security.json")
    path = os.path.abspath(path) if path else ""
    try:
        if path and os.path.exists(path):
            state = load_state(path, settings.iterations)
            source = path
        elif settings.import_file:
            state = load_state(settings.import_file, settings.iterations)
            source = f"{settings.import_file} (imported)"
            if path:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                save_state(path, state)
        else:
            state = Dynsec(settings.iterations)
            source = "empty"
            log.warning(
                "dynamic security: no state and no import_file: nobody can administer it (make "
                "one with `mosquitto_ctrl dynsec init FILE admin` and set dynsec.import_file)"
            )
    except (DynsecError, OSError) as exc:
        raise SecurityFileError(path or settings.import_file, f"dynamic security: {exc}") from None
    log.info(
        "dynamic security: %s: %d clients, %d groups, %d roles%s",
        source,
        len(state.clients),
        len(state.groups),
        len(state.roles),
        "" if path else " (kept in memory only)",
    )
    return state, path

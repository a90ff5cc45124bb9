"""Fixtures of the access tests: the operator's auth service (``auth_service``,
support.http_service.AuthService) and our broker asking it (``asking_broker``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.cleanup import ended_after
from support.http_service import AuthService
from support.launcher import BrokerProcess


@pytest.fixture
def auth_service() -> Iterator[AuthService]:
    with ended_after(AuthService.close) as keep:
        yield keep(AuthService().start())


@pytest.fixture
def asking_broker(
    start_broker: Callable[..., BrokerProcess], tmp_path: Path, auth_service: AuthService
) -> Callable[..., BrokerProcess]:
    """``asking_broker(extra="", admin_port=0, http_extra="")``: our broker asking
    ``auth_service`` for logins and rights (``[http_auth]``; ``extra``: the file's other
    tables, ``http_extra``: more of its [http_auth] keys)."""

    def run(extra: str = "", admin_port: int = 0, http_extra: str = "") -> BrokerProcess:
        path = tmp_path / "http.toml"
        path.write_text(
            f"{extra}\n[http_auth]\nenabled = true\n"
            f'url = "http://127.0.0.1:{auth_service.port}/auth"\n'
            f'acl_url = "http://127.0.0.1:{auth_service.port}/acl"\n'
            "timeout = 20\n"
            f"{http_extra}\n"
        )
        args: tuple[str, ...] = ("--config", str(path))
        if admin_port:
            args += ("--admin-port", str(admin_port))
        return start_broker(extra_args=args)

    return run

"""Role editing on the dashboard's Security tab, in a real headless Chromium (Playwright, as
tests/ops/test_dashboard.py): a role created on the page, ACLs added and removed, the role
deleted; each change checked through the admin API, and no console errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.admin_client import DYNSEC_TOKEN, Admin
from support.dashboard_page import WAIT_MS, Page

pytestmark = pytest.mark.needs_chromium


def test_security_page_edits_roles(
    dynsec_admin: tuple[Admin, Path], browser: Any, tmp_path: Path
) -> None:
    admin, _ = dynsec_admin
    ui = Page(browser, admin, tmp_path / "screenshots", DYNSEC_TOKEN)
    page = ui.open("security")
    page.wait_for_selector('#dynsec-roles-table tr[data-rolename="admin"]', timeout=WAIT_MS)

    # a role created on the page
    page.fill("#dynsec-rolename", "viewer")
    page.click("#dynsec-role-create")
    row = '#dynsec-roles-table tr[data-rolename="viewer"]'
    page.wait_for_selector(f'{row} td.acls:text-is("no ACLs")', timeout=WAIT_MS)
    assert admin.ok("GET", "/api/v1/dynsec/roles/viewer")["acls"] == []

    # two ACLs added on the page
    for acltype, topic, access, priority in (
        ("subscribePattern", "data/#", "allow", "3"),
        ("publishClientReceive", "data/secret", "deny", "9"),
    ):
        page.fill("#dynsec-acl-role", "viewer")
        page.select_option("#dynsec-acltype", acltype)
        page.fill("#dynsec-acl-topic", topic)
        page.select_option("#dynsec-acl-access", access)
        page.fill("#dynsec-acl-priority", priority)
        page.click("#dynsec-acl-add")
        page.wait_for_selector(
            f'{row} .acl[data-acltype="{acltype}"][data-topic="{topic}"]', timeout=WAIT_MS
        )
    assert admin.ok("GET", "/api/v1/dynsec/roles/viewer")["acls"] == [
        {"acltype": "publishClientReceive", "topic": "data/secret", "priority": 9, "allow": False},
        {"acltype": "subscribePattern", "topic": "data/#", "priority": 3, "allow": True},
    ]
    assert "publishClientReceive deny data/secret (9)" in page.inner_text(row)
    ui.shot("security-roles")

    # an ACL for a role that does not exist: the error shows, nothing changes
    page.fill("#dynsec-acl-role", "nosuch")
    page.fill("#dynsec-acl-topic", "x")
    page.click("#dynsec-acl-add")
    page.wait_for_selector('#dynsec-error:has-text("Role not found")', timeout=WAIT_MS)

    # one ACL removed, then the role deleted, on the page
    page.click(f'{row} .acl[data-topic="data/secret"] button')
    page.wait_for_selector(
        f'{row} .acl[data-topic="data/secret"]', state="detached", timeout=WAIT_MS
    )
    acls = admin.ok("GET", "/api/v1/dynsec/roles/viewer")["acls"]
    assert [a["topic"] for a in acls] == ["data/#"]
    page.click(f"{row} > td > button")
    page.wait_for_selector(row, state="detached", timeout=WAIT_MS)
    assert admin.request("GET", "/api/v1/dynsec/roles/viewer").status == 404
    errors = [e for e in ui.errors if "404" not in e]  # the refused ACL's answer
    assert errors == [], "\n".join(errors)

"""The console's login and registration forms count against the same guessing limits as
the API's: a locked account gets the login page again with a 429 that says when to retry."""

from __future__ import annotations

import re
from dataclasses import dataclass

from starlette.testclient import TestClient

from factories import Caller
from gpulease.server.routers.deps import SESSION_COOKIE
from gpulease.server.runtime import Runtime
from gpulease.server.services.ratelimit import AuthGuard

PASSWORD = "password-123"  # make_user's


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def form_browser(http: TestClient) -> TestClient:
    return TestClient(
        http.app, follow_redirects=False, headers={"Referer": "http://testserver/login"}
    )


def test_console_login_is_limited_per_account(http: TestClient, rt: Runtime, ann: Caller) -> None:
    clock = Clock()
    http.app.state.auth_guard = AuthGuard(rt.settings, rt.sessions, clock=clock)  # type: ignore[attr-defined]
    browser = form_browser(http)
    for _ in range(rt.settings.login_failures_per_account):
        r = browser.post("/login", data={"name": "ann", "password": "wrong-guess-1"})
        assert r.status_code == 401 and "wrong user name or password" in r.text
    r = browser.post("/login", data={"name": "ann", "password": PASSWORD})
    assert r.status_code == 429 and "too many failed logins for &#39;ann&#39;" in r.text
    assert "try again in 15 min" in r.text
    # the API counts the same failures
    r = http.post("/api/v1/auth/login", json={"name": "ann", "password": PASSWORD})
    assert r.status_code == 429
    clock.now += rt.settings.auth_window_s
    r = browser.post("/login", data={"name": "ann", "password": PASSWORD})
    assert r.status_code == 303 and r.headers["location"] == "/"


def test_console_registration_is_limited_per_address(http: TestClient, rt: Runtime) -> None:
    http.app.state.auth_guard = AuthGuard(rt.settings, rt.sessions, clock=Clock())  # type: ignore[attr-defined]
    browser = form_browser(http)
    for i in range(rt.settings.registrations_per_address):
        form = {"name": f"user{i}", "password": PASSWORD, "password_repeat": PASSWORD}
        assert browser.post("/register", data=form).status_code == 303
        browser.cookies.clear()
    form = {"name": "more", "password": PASSWORD, "password_repeat": PASSWORD}
    r = browser.post("/register", data=form)
    assert r.status_code == 429 and "accounts registered from your address" in r.text


def test_the_admin_users_page_lists_failed_logins(
    http: TestClient, rt: Runtime, ann: Caller, admin: Caller
) -> None:
    browser = form_browser(http)
    browser.post("/login", data={"name": "ann", "password": "wrong-guess-1"})
    page = TestClient(http.app, cookies={SESSION_COOKIE: admin.token}).get("/admin/users")
    assert page.status_code == 200
    failed = r'<table class="table" data-testid="failed-logins">.*?</table>'
    (table,) = re.findall(failed, page.text, re.S)
    assert "<td>ann</td>" in table and "wrong name or password" in table
    assert "wrong-guess" not in page.text
    other = TestClient(http.app, cookies={SESSION_COOKIE: ann.token}).get("/admin/users")
    assert other.status_code == 404 and "failed-logins" not in other.text

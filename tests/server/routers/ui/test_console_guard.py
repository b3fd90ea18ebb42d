"""Every console form goes through the one guard: taken from the app's own routes, so a new
form cannot dodge it. Each refuses a post from another site (by Origin, Referer, `null`, or a
cookie with neither header), sends a logged-out visitor to the login page, and answers 404 to
a signed-in user who is not an admin on the admin forms."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.routing import APIRoute
from starlette.testclient import TestClient

from factories import BrowserFactory, Caller, console_client, logged_in
from gpulease.server.routers.deps import SESSION_COOKIE

UI_PACKAGE = "gpulease.server.routers.ui."
# The JupyterLab proxy forwards to the instance's JupyterLab, which answers for itself (its
# own origin checks are tested with the proxy, test_streams_console.py); every other console
# module's POST routes are forms.
PROXY_MODULE = UI_PACKAGE + "jupyter_proxy"
# Forms that need no viewer: they still refuse other sites, but nobody is sent to log in.
PUBLIC_FORMS = {"/login", "/register", "/logout"}


def routes_of(routes: Iterable[object], prefix: str = "") -> Iterator[tuple[str, APIRoute]]:
    """(full path, route) of every route, through included routers at any depth."""
    for route in routes:
        inner = getattr(route, "original_router", None)  # an included router
        if inner is not None:
            context = getattr(route, "include_context", None)
            yield from routes_of(inner.routes, prefix + getattr(context, "prefix", ""))
        elif isinstance(route, APIRoute):
            yield prefix + route.path, route


def console_posts(app: Any) -> list[str]:
    """The paths of every POST route that a console (ui) module defines."""
    return sorted(
        {
            path
            for path, route in routes_of(app.routes)
            if "POST" in route.methods
            and route.endpoint.__module__.startswith(UI_PACKAGE)
            and route.endpoint.__module__ != PROXY_MODULE
        }
    )


def concrete(path: str) -> str:
    """A path template with every parameter filled in (the guard answers before they count)."""
    return re.sub(r"\{[^}]+\}", "1", path)


@pytest.fixture
def forms(http: TestClient) -> list[str]:
    found = console_posts(http.app)
    # the enumeration itself is checked, so that an empty or partial list fails loudly
    assert len(found) >= 29, found
    for known in ("/admin/users/grant", "/instances/{ref}/stop", "/billing/caps", "/login"):
        assert known in found
    return found


def test_every_console_post_refuses_another_site(
    ann: Caller, http: TestClient, browser: BrowserFactory, forms: list[str]
) -> None:
    victim = logged_in(browser, "ann")
    secret = victim.cookies[SESSION_COOKIE]
    bare = TestClient(http.app, follow_redirects=False, cookies={SESSION_COOKIE: secret})
    try:
        for path in forms:
            url = concrete(path)
            for headers in (
                {"Origin": "https://evil.example"},
                {"Origin": "null"},
                {"Origin": "http://testserver.evil.example"},
                {"Referer": "https://evil.example/page"},
            ):
                r = victim.post(url, headers=headers)
                assert r.status_code == 403, (path, headers, r.status_code)
                assert "another site" in r.text, (path, headers)
            # a cookie's state change with neither Origin nor Referer is not a console form
            r = bare.post(url)
            assert r.status_code == 403, (path, r.status_code, r.text[:200])
        assert victim.get("/").status_code == 200  # none of it logged ann out
    finally:
        bare.close()


def test_every_console_post_sends_a_logged_out_visitor_to_log_in(
    http: TestClient, browser: BrowserFactory, forms: list[str]
) -> None:
    visitor = browser()
    stale = console_client(http.app, cookies={SESSION_COOKIE: "glp_no_longer_valid"})
    try:
        for path in forms:
            if path in PUBLIC_FORMS:
                continue
            url = concrete(path)
            for client in (visitor, stale):
                r = client.post(url)
                assert r.status_code == 303, (path, r.status_code, r.text[:200])
                assert r.headers["location"] == f"/login?next={quote(url, safe='')}", path
    finally:
        stale.close()


def test_admin_forms_are_not_found_for_other_users(
    ann: Caller, browser: BrowserFactory, forms: list[str]
) -> None:
    user = logged_in(browser, "ann")
    admin_forms = [p for p in forms if p.startswith("/admin/")]
    assert len(admin_forms) >= 5, admin_forms
    for path in admin_forms:
        r = user.post(concrete(path), data={"user": "ann", "amount": "1000"})
        assert r.status_code == 404, (path, r.status_code)
        assert "There is no page" in r.text


def test_the_guard_answers_get_pages_too(http: TestClient, browser: BrowserFactory) -> None:
    """Pages use the same viewer: logged out goes to log in, a partial answers 401."""
    visitor = browser()
    for page in ("/billing", "/catalog", "/datasets", "/support", "/instances/new"):
        r = visitor.get(page)
        assert r.status_code == 303, page
        assert r.headers["location"] == f"/login?next={quote(page, safe='')}"
    assert visitor.get("/partials/instances/1").status_code == 401
    assert visitor.get("/admin/prices").headers["location"] == "/login?next=%2Fadmin%2Fprices"

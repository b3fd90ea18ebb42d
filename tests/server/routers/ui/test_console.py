"""The web console over HTTP: sign-in with a session cookie, the dashboard, refusals, CSRF."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from starlette.testclient import TestClient

from factories import BrowserFactory, Caller, RunnerDouble, make_running_instance
from gpulease.server.routers.deps import SESSION_COOKIE
from gpulease.server.runtime import Runtime

PASSWORD = "password-123"


def log_in(client: TestClient, name: str, password: str = PASSWORD) -> None:
    r = client.post("/login", data={"name": name, "password": password})
    assert r.status_code == 303, r.text
    assert r.headers["location"] == "/"


def test_logged_out_pages_redirect_to_login(browser: BrowserFactory) -> None:
    client = browser()
    r = client.get("/")
    assert r.status_code == 303 and r.headers["location"] == "/login"
    r = client.get("/?run=3")
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2F%3Frun%3D3"
    assert client.get("/partials/dashboard").status_code == 401
    r = client.get("/login")
    assert r.status_code == 200 and 'action="/login"' in r.text
    # a cookie that no longer works is dropped on the way to the login page
    client.cookies.set(SESSION_COOKIE, "glp_made_up")
    r = client.get("/")
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert f'{SESSION_COOKIE}=""' in r.headers["set-cookie"]


def test_login_sets_a_session_cookie_and_logout_revokes_it(
    ann: Caller, browser: BrowserFactory
) -> None:
    client = browser()
    r = client.post("/login", data={"name": "ann", "password": PASSWORD})
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=glp_")
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # plain http: a Secure cookie would never come back
    secret = client.cookies[SESSION_COOKIE]

    page = client.get("/")
    assert page.status_code == 200
    assert "ann" in page.text and "$10.0000" in page.text
    assert "Content-Security-Policy" in page.headers and page.headers["x-frame-options"] == "DENY"
    # the cookie is an ordinary session token: the API takes it too, but lists it not
    assert client.get("/api/v1/me").json()["name"] == "ann"
    assert "web session" not in [t["name"] for t in client.get("/api/v1/tokens").json()]
    assert client.get("/login").headers["location"] == "/"

    r = client.post("/logout")
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert f'{SESSION_COOKIE}=""' in r.headers["set-cookie"]
    assert client.get("/").status_code == 303
    r = client.get("/api/v1/me", headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert ann.get("/api/v1/me").status_code == 200  # other tokens of ann's still work


def test_login_over_https_sets_a_secure_cookie(ann: Caller, browser: BrowserFactory) -> None:
    client = browser("https://testserver")
    r = client.post("/login", data={"name": "ann", "password": PASSWORD})
    assert r.status_code == 303
    assert "Secure" in r.headers["set-cookie"]


def test_login_keeps_a_local_next_page_only(ann: Caller, browser: BrowserFactory) -> None:
    client = browser()
    assert 'name="next" value="/"' in client.get("/login?next=//evil.example/x").text
    assert 'name="next" value="/?run=7"' in client.get("/login?next=/%3Frun%3D7").text
    data = {"name": "ann", "password": PASSWORD}
    r = client.post("/login", data={**data, "next": "/?run=7"})
    assert r.headers["location"] == "/?run=7"
    for target in ("https://evil.example/", "//evil.example/", "/\\evil.example"):
        r = browser().post("/login", data={**data, "next": target})
        assert r.headers["location"] == "/"


@pytest.mark.parametrize(
    ("form", "status", "message"),
    [
        ({"name": "ann", "password": "wrong-password"}, 401, "wrong user name or password"),
        ({"name": "nobody", "password": PASSWORD}, 401, "wrong user name or password"),
        ({"name": "ann", "password": ""}, 422, "enter your user name and password"),
        ({}, 422, "enter your user name and password"),
    ],
)
def test_login_refusals_are_shown_on_the_form(
    ann: Caller, browser: BrowserFactory, form: dict[str, str], status: int, message: str
) -> None:
    client = browser()
    r = client.post("/login", data=form)
    assert r.status_code == status
    assert r.headers["content-type"].startswith("text/html")
    assert 'role="alert"' in r.text and message in r.text
    assert "set-cookie" not in r.headers
    if form.get("name"):
        assert f'value="{form["name"]}"' in r.text


def test_register_logs_in_with_the_signup_credit(http: TestClient, browser: BrowserFactory) -> None:
    client = browser()
    page = client.get("/register")
    assert page.status_code == 200 and "$10.00 in credit" in page.text
    r = client.post(
        "/register", data={"name": "cid", "password": PASSWORD, "password_repeat": PASSWORD}
    )
    assert r.status_code == 303 and r.headers["location"] == "/"
    assert "HttpOnly" in r.headers["set-cookie"]
    assert client.get("/api/v1/balance").json()["balance_micro"] == 10_000_000
    dashboard = client.get("/")
    assert dashboard.status_code == 200 and "$10.0000" in dashboard.text
    assert "No instances yet" in dashboard.text and "No runs yet" in dashboard.text
    # the account is a normal one: the API logs it in with the same password
    r = http.post("/api/v1/auth/login", json={"name": "cid", "password": PASSWORD})
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("name", "password", "repeat", "status", "message"),
    [
        ("ann", PASSWORD, PASSWORD, 409, "is taken; choose another"),
        ("cid", "short", "short", 422, "use at least 8 characters"),
        ("cid", PASSWORD, PASSWORD + "x", 422, "the two passwords differ"),
        ("Bad Name!", PASSWORD, PASSWORD, 422, "lowercase letters"),
        ("", PASSWORD, PASSWORD, 422, "not a valid user name"),
    ],
)
def test_register_refusals_are_shown_on_the_form(
    ann: Caller,
    browser: BrowserFactory,
    name: str,
    password: str,
    repeat: str,
    status: int,
    message: str,
) -> None:
    client = browser()
    form = {"name": name, "password": password, "password_repeat": repeat}
    r = client.post("/register", data=form)
    assert r.status_code == status
    assert 'role="alert"' in r.text and message in r.text
    assert "set-cookie" not in r.headers
    assert f'value="{password}"' not in r.text  # passwords are never echoed back


def test_register_is_refused_when_signup_is_closed(
    rt: Runtime, ann: Caller, browser: BrowserFactory
) -> None:
    rt.settings.signup_enabled = False
    client = browser()
    assert client.get("/register").status_code == 403
    r = client.post(
        "/register", data={"name": "cid", "password": PASSWORD, "password_repeat": PASSWORD}
    )
    assert r.status_code == 403 and "ask an admin" in r.text
    assert "Create an account" not in client.get("/login").text
    log_in(client, "ann")  # existing accounts still log in


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://testserver.evil.example"},
        {"Referer": "https://evil.example/page"},
    ],
)
def test_cross_site_posts_are_refused(
    ann: Caller, browser: BrowserFactory, headers: dict[str, str]
) -> None:
    attacker = browser()
    r = attacker.post("/login", data={"name": "ann", "password": PASSWORD}, headers=headers)
    assert r.status_code == 403 and "another site" in r.text
    assert "set-cookie" not in r.headers
    form = {"name": "mallory", "password": PASSWORD, "password_repeat": PASSWORD}
    assert attacker.post("/register", data=form, headers=headers).status_code == 403
    victim = browser()
    log_in(victim, "ann")
    assert victim.post("/logout", headers=headers).status_code == 403
    assert victim.get("/").status_code == 200  # still logged in
    # the same site is fine, by Origin or by Referer
    assert victim.post("/logout", headers={"Referer": "http://testserver/"}).status_code == 303
    log_in(victim, "ann")
    assert victim.post("/logout", headers={"Origin": "http://testserver"}).status_code == 303


def test_no_account_is_made_by_a_cross_site_register(
    http: TestClient, browser: BrowserFactory
) -> None:
    form = {"name": "mallory", "password": PASSWORD, "password_repeat": PASSWORD}
    r = browser().post("/register", data=form, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    r = http.post("/api/v1/auth/login", json={"name": "mallory", "password": PASSWORD})
    assert r.status_code == 401


def test_dashboard_shows_instances_queue_runs_and_notifications(
    ann: Caller,
    browser: BrowserFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    _, runner = make_running_instance(ann, tick, runner_for, "cats")
    for name in ("second", "third"):
        assert ann.post("/api/v1/instances", json={"gpu": "A100-80GB:1", "name": name})
    tick()
    run = ann.post("/api/v1/instances/cats/runs", json={"command": "python train.py"}).json()
    runner.run(run["id"], ["epoch 1 loss=0.5"], exit_code=3)
    client = browser()
    log_in(client, "ann")
    for url in ("/", "/partials/dashboard"):
        page = client.get(url)
        assert page.status_code == 200, page.text
        text = page.text
        assert 'id="instances"' in text and 'id="runs"' in text and 'id="stats"' in text
        assert "cats" in text and "A100-80GB × 1" in text and "simulated" in text
        assert "#1 in queue" in text  # third waits for a GPU
        assert "pill-running" in text and "pill-queued" in text and "pill-starting" in text
        assert "python train.py" in text and "pill-failed" in text
        assert "exit code 3" in text  # the run_finished notification
        assert "$0.9000/h" in text
    page = client.get("/").text
    assert f'data-run-id="{run["id"]}"' in page and 'data-follow="latest"' in page
    pinned = client.get(f"/?run={run['id']}").text
    assert 'data-follow="pinned"' in pinned
    stream = client.get(f"/api/v1/runs/{run['id']}/stream")
    assert stream.status_code == 200
    assert "epoch 1 loss=0.5" in stream.text and "event: end" in stream.text


def test_other_users_run_log_is_not_reachable(
    ann: Caller,
    bob: Caller,
    browser: BrowserFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    _, runner = make_running_instance(ann, tick, runner_for, "secret")
    run = ann.post("/api/v1/instances/secret/runs", json={"command": "echo ann-only"}).json()
    runner.run(run["id"], ["the secret output"], exit_code=0)
    client = browser()
    log_in(client, "bob")
    for url in (
        f"/api/v1/runs/{run['id']}/stream",
        f"/api/v1/runs/{run['id']}/logs",
        f"/api/v1/runs/{run['id']}",
    ):
        r = client.get(url)
        assert r.status_code == 404, url
        assert "the secret output" not in r.text
    page = client.get(f"/?run={run['id']}")
    assert page.status_code == 404 and "ann-only" not in page.text
    for url in ("/", "/partials/dashboard"):
        text = client.get(url).text
        assert "secret" not in text and "ann-only" not in text
    for bad in ("abc", "99999999999999999999", "-1"):
        assert client.get("/", params={"run": bad}).status_code == 404


def test_everything_a_user_typed_is_escaped(
    ann: Caller,
    browser: BrowserFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    _, runner = make_running_instance(ann, tick, runner_for, "xss")
    command = "echo '<script>alert(1)</script>' \"&\""
    run = ann.post("/api/v1/instances/xss/runs", json={"command": command}).json()
    runner.run(run["id"], ["<img src=x onerror=alert(1)>"], exit_code=0)
    client = browser()
    log_in(client, "ann")
    for url in ("/", "/partials/dashboard"):
        text = client.get(url).text
        assert "<script>alert" not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    r = client.post("/login", data={"name": '"><script>x</script>', "password": "nope-nope"})
    assert r.status_code == 401 and "<script>x" not in r.text


def test_static_assets_are_served(browser: BrowserFactory) -> None:
    client = browser()
    page = client.get("/login").text
    for asset in ("/static/console.css", "/static/favicon.svg"):
        assert asset in page
        assert client.get(asset).status_code == 200
    for asset in ("/static/js/live.js", "/static/js/logtail.js"):
        assert client.get(asset).status_code == 200


def test_cookie_cannot_change_state_through_the_api_from_another_site(http: TestClient) -> None:
    r = http.post(
        "/register",
        data={"name": "cora", "password": "password-123", "password_repeat": "password-123"},
        headers={"origin": "http://testserver"},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    evil = {"origin": "http://evil.example"}
    r = http.post("/api/v1/instances", json={"gpu": "T4:1"}, headers=evil)
    assert r.status_code == 403 and "another site" in r.json()["detail"]
    assert http.get("/api/v1/instances").json() == []  # GET with the cookie still works
    r = http.post(
        "/api/v1/instances", json={"gpu": "T4:1"}, headers={"origin": "http://testserver"}
    )
    assert r.status_code == 201, r.text

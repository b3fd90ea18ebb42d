"""Guessing resistance: failed logins per account and per address, registrations and bad
tokens per address get a 429 with Retry-After; admins see the failed logins; minting an API
token with the browser's cookie needs the password again."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import func, select
from starlette.testclient import TestClient

from factories import Caller, make_user
from gpulease.server.app import create_app
from gpulease.server.db import make_engine, make_sessionmaker, transaction
from gpulease.server.orm import AuthAttempt
from gpulease.server.routers.deps import SESSION_COOKIE
from gpulease.server.runtime import Runtime
from gpulease.server.services import ratelimit
from gpulease.server.services.ratelimit import (
    REGISTER,
    AuthGuard,
    SlidingWindow,
    address_key,
    token_name,
)

WINDOW = 900  # the default GPULEASE_AUTH_WINDOW_S
PASSWORD = "password-123"  # make_user's


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def injected_clock(http: TestClient, rt: Runtime) -> Clock:
    clock = Clock()
    http.app.state.auth_guard = AuthGuard(rt.settings, rt.sessions, clock=clock)  # type: ignore[attr-defined]
    return clock


def login(client: TestClient, name: str, password: str) -> tuple[int, dict[str, str], str]:
    r = client.post("/api/v1/auth/login", json={"name": name, "password": password})
    return r.status_code, dict(r.headers), str(r.json().get("detail", ""))


def test_wrong_passwords_lock_the_account_until_the_window_passes(
    http: TestClient, rt: Runtime, ann: Caller
) -> None:
    clock = injected_clock(http, rt)
    limit = rt.settings.login_failures_per_account
    for _ in range(limit):
        assert login(http, "ann", "wrong-guess-1")[0] == 401
        clock.now += 1
    status, headers, detail = login(http, "ann", PASSWORD)  # even the right one waits
    assert status == 429
    assert int(headers["retry-after"]) == WINDOW - limit
    assert detail.startswith("too many failed logins for 'ann'; try again in 15 min (after ")
    # another account from the same address is not locked by ann's
    make_user(http, "bob")
    assert login(http, "bob", PASSWORD)[0] == 200
    clock.now += WINDOW - limit  # the first failure leaves the window
    assert login(http, "ann", PASSWORD)[0] == 200


def test_one_address_guessing_many_accounts_is_limited(
    http: TestClient, rt: Runtime, ann: Caller
) -> None:
    clock = injected_clock(http, rt)
    rt.settings.login_failures_per_address = 5
    http.app.state.auth_guard = AuthGuard(rt.settings, rt.sessions, clock=clock)  # type: ignore[attr-defined]
    for i in range(5):
        assert login(http, f"user{i}", "guess-guess")[0] == 401
    status, headers, detail = login(http, "ann", PASSWORD)
    assert status == 429 and "from your address" in detail and int(headers["retry-after"]) > 0
    # ann from another address is not held up by this one
    elsewhere = TestClient(http.app, client=("203.0.113.9", 4000))
    assert login(elsewhere, "ann", PASSWORD)[0] == 200


def test_registrations_per_address_are_limited(http: TestClient, rt: Runtime) -> None:
    clock = injected_clock(http, rt)
    for i in range(rt.settings.registrations_per_address):
        make_user(http, f"user{i}")
    r = http.post("/api/v1/auth/register", json={"name": "more", "password": PASSWORD})
    assert r.status_code == 429 and "accounts registered from your address" in r.json()["detail"]
    assert int(r.headers["retry-after"]) == WINDOW
    clock.now += WINDOW
    make_user(http, "more")


def test_bad_bearer_tokens_from_one_address_are_limited(
    http: TestClient, rt: Runtime, ann: Caller
) -> None:
    clock = injected_clock(http, rt)
    assert ann.get("/api/v1/me").status_code == 200  # remembered as clear for a moment
    for i in range(rt.settings.token_failures_per_address):
        r = http.get("/api/v1/me", headers={"Authorization": f"Bearer glp_guess{i}"})
        assert r.status_code == 401
    r = ann.get("/api/v1/me")  # the address is held at once, whatever token it sends now
    assert r.status_code == 429 and "invalid token" in r.json()["detail"]
    assert "retry-after" in r.headers
    elsewhere = TestClient(http.app, client=("203.0.113.9", 4000))
    assert elsewhere.get("/api/v1/me", headers=ann.headers).status_code == 200
    clock.now += WINDOW
    assert ann.get("/api/v1/me").status_code == 200


def test_admins_see_failed_logins_and_others_cannot(
    http: TestClient, rt: Runtime, ann: Caller, admin: Caller
) -> None:
    injected_clock(http, rt)
    login(http, "ann", "wrong-guess-1")
    login(http, "nobody", "wrong-guess-2")
    r = admin.get("/api/v1/admin/failed-logins")
    assert r.status_code == 200, r.text
    seen = r.json()
    assert [(f["name"], f["reason"]) for f in seen] == [
        ("nobody", "wrong name or password"),
        ("ann", "wrong name or password"),
    ]
    assert seen[0]["address"] == "testclient" and seen[0]["at"].startswith("1970-01-12")
    assert "wrong-guess" not in r.text  # passwords are never kept
    r = ann.get("/api/v1/admin/failed-logins")
    assert r.status_code == 403 and "admin" in r.json()["detail"]
    assert http.get("/api/v1/admin/failed-logins").status_code == 401


def test_a_token_minted_with_the_cookie_needs_the_password(http: TestClient, ann: Caller) -> None:
    browser = TestClient(http.app, cookies={SESSION_COOKIE: ann.token})
    origin = {"Origin": "http://testserver"}
    r = browser.post("/api/v1/tokens", json={"name": "stolen"}, headers=origin)
    assert r.status_code == 403 and "needs your password" in r.json()["detail"]
    r = browser.post(
        "/api/v1/tokens", json={"name": "stolen", "password": "wrong-guess"}, headers=origin
    )
    assert r.status_code == 403 and "wrong password" in r.json()["detail"]
    r = browser.post("/api/v1/tokens", json={"name": "mine", "password": PASSWORD}, headers=origin)
    assert r.status_code == 201 and r.json()["token"].startswith("glp_")
    # a bearer token (the CLI) needs no password
    r = ann.post("/api/v1/tokens", json={"name": "ci"})
    assert r.status_code == 201
    assert [t["name"] for t in ann.get("/api/v1/tokens").json()] == ["registration", "mine", "ci"]


def test_sliding_window_forgets_attempts_one_by_one(rt: Runtime) -> None:
    clock = Clock(now=0.0)
    guard = AuthGuard(rt.settings, rt.sessions, clock=clock)
    window = SlidingWindow(REGISTER, AuthAttempt.address_key, limit=2, window=timedelta(seconds=10))

    def retry_after(key: str) -> float | None:
        with transaction(rt.sessions) as session:
            return window.retry_after(session, key, guard.now())

    guard.registered("198.51.100.7")
    clock.now = 4
    guard.registered("198.51.100.7")
    assert retry_after("198.51.100.7") == 6
    clock.now = 10  # the first one is out; one is left
    assert retry_after("198.51.100.7") is None
    guard.registered("198.51.100.7")
    assert retry_after("198.51.100.7") == 4  # until the one at 4 leaves
    assert retry_after("198.51.100.8") is None


def test_replicas_share_the_counts(
    http: TestClient, rt: Runtime, ann: Caller, database_url: str
) -> None:
    """Two server processes on one database, each with its guard and its own connections:
    what one counted, the other refuses."""
    rt.settings.login_failures_per_account = rt.settings.token_failures_per_address = 2
    clock = injected_clock(http, rt)
    engine = make_engine(database_url)
    try:
        other_app = create_app(rt.settings, runtime=rt, reconcilers=False)
        other_guard = AuthGuard(rt.settings, make_sessionmaker(engine), clock=clock)
        other_app.state.auth_guard = other_guard
        with TestClient(other_app) as other:
            for _ in range(2):
                assert login(http, "ann", "wrong-guess-1")[0] == 401
            status, headers, detail = login(other, "ann", PASSWORD)
            assert status == 429 and "failed logins for 'ann'" in detail
            assert int(headers["retry-after"]) == WINDOW
            for i in range(2):
                r = other.get("/api/v1/me", headers={"Authorization": f"Bearer glp_guess{i}"})
                assert r.status_code == 401
            r = http.get("/api/v1/me", headers=ann.headers)
            assert r.status_code == 429 and "invalid token from your address" in r.json()["detail"]
            clock.now += WINDOW
            assert login(other, "ann", PASSWORD)[0] == 200
            assert http.get("/api/v1/me", headers=ann.headers).status_code == 200
    finally:
        engine.dispose()


def test_what_another_replica_counts_is_seen_within_a_second(
    http: TestClient, rt: Runtime, ann: Caller, database_url: str
) -> None:
    """A read that found an address clear is trusted for CLEAR_FOR_S: the wrong tokens that
    another replica counts meanwhile hold the address back no later than that."""
    rt.settings.token_failures_per_address = 2
    clock = injected_clock(http, rt)
    assert ann.get("/api/v1/me").status_code == 200
    engine = make_engine(database_url)
    try:
        other_guard = AuthGuard(rt.settings, make_sessionmaker(engine), clock=clock)
        for i in range(2):
            other_guard.token_failed("testclient", f"glp_guess{i}")
        assert ann.get("/api/v1/me").status_code == 200  # the read of a moment ago
        clock.now += ratelimit.CLEAR_FOR_S
        r = ann.get("/api/v1/me")
        assert r.status_code == 429 and "invalid token from your address" in r.json()["detail"]
    finally:
        engine.dispose()


def test_guessing_one_token_from_many_addresses_is_limited(
    http: TestClient, rt: Runtime, ann: Caller
) -> None:
    clock = injected_clock(http, rt)
    laptop = ann.post("/api/v1/tokens", json={"name": "laptop"}).json()["token"]
    name = token_name(laptop)
    assert name == laptop[:10] and name.startswith("glp_")
    limit = rt.settings.token_failures_per_token

    def me(address: str, token: str) -> httpx.Response:
        client = TestClient(http.app, client=(address, 4000))
        return client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"})

    for i in range(limit):  # each from an address of its own, far below its own limit
        assert me(f"198.51.100.{i + 1}", f"{name}{'x' * 30}{i}").status_code == 401
        clock.now += 1
    r = me("203.0.113.9", laptop)  # a fresh address, the right token: it waits too
    assert r.status_code == 429
    assert "invalid token that begins like this one" in r.json()["detail"]
    assert int(r.headers["retry-after"]) == WINDOW - limit
    assert ann.get("/api/v1/me").status_code == 200  # ann's other tokens are not held up
    # tokens that begin like no token of the database are counted per address only
    for i in range(limit + 1):
        assert me(f"192.0.2.{i + 1}", f"glp_nosuch{'y' * 30}{i}").status_code == 401
    clock.now += WINDOW - limit
    assert me("203.0.113.9", laptop).status_code == 200


def test_odd_bearer_headers_get_a_401(http: TestClient, rt: Runtime) -> None:
    injected_clock(http, rt)
    for token in ("glp_", "glp_" + "z" * 5000, "x", "glp_\u00e9t\u00e9-and-more-characters"):
        r = http.get("/api/v1/me", headers={"Authorization": f"Bearer {token}".encode()})
        assert r.status_code == 401, (token[:20], r.text)
    long_address = TestClient(http.app, client=("a" * 300, 4000))
    assert long_address.get("/api/v1/me", headers={"Authorization": "Bearer q"}).status_code == 401


def test_a_nul_in_a_login_is_a_4xx(http: TestClient, database_url: str) -> None:
    status, _, detail = login(http, "ann\u0000", "pass\u0000word")
    if database_url.startswith("postgresql"):  # PostgreSQL refuses NUL in text
        assert (status, detail) == (
            422,
            "invalid request: text cannot contain NUL (\\u0000) characters",
        )
    else:
        assert status == 401
    r = http.post("/api/v1/auth/register", json={"name": "ann\u0000", "password": PASSWORD})
    assert r.status_code == 422


def test_old_attempts_are_pruned_but_the_latest_failed_logins_stay(
    http: TestClient, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ratelimit, "FAILED_LOGINS_KEPT", 2)
    clock = injected_clock(http, rt)
    for i in range(3):
        login(http, f"user{i}", "wrong-guess-1")
        http.get("/api/v1/me", headers={"Authorization": f"Bearer glp_guess{i}"})
        clock.now += 1
    assert attempts(rt) == {"login": 3, "token": 3}
    clock.now += WINDOW
    http.get("/api/v1/me", headers={"Authorization": "Bearer glp_guess-later"})
    assert attempts(rt) == {"login": 2, "token": 1}
    guard = http.app.state.auth_guard  # type: ignore[attr-defined]
    with transaction(rt.sessions) as session:
        assert [f.name for f in guard.failed_logins(session)] == ["user2", "user1"]


def test_refused_logins_are_noted_once_a_minute_per_address(
    http: TestClient, rt: Runtime, admin: Caller
) -> None:
    clock = injected_clock(http, rt)
    for _ in range(rt.settings.login_failures_per_account):
        login(http, "ann", "wrong-guess-1")
    for _ in range(5):
        assert login(http, "ann", "wrong-guess-2")[0] == 429
        clock.now += 10
    assert attempts(rt)["login-refused"] == 1
    clock.now += 20
    assert login(http, "ann", "wrong-guess-3")[0] == 429
    seen = admin.get("/api/v1/admin/failed-logins").json()
    assert [f["reason"] for f in seen[:3]] == [
        "rate limited",
        "rate limited",
        "wrong name or password",
    ]


def attempts(rt: Runtime) -> dict[str, int]:
    with transaction(rt.sessions) as session:
        rows = session.execute(
            select(AuthAttempt.kind, func.count()).group_by(AuthAttempt.kind)
        ).all()
    return dict(rows)


def test_one_ipv6_64_is_one_address(http: TestClient, rt: Runtime, ann: Caller) -> None:
    """A host holds a whole /64: rotating addresses inside it does not reset the count."""
    injected_clock(http, rt)
    for i in range(rt.settings.token_failures_per_address):
        guesser = TestClient(http.app, client=(f"2001:db8:0:1::{i + 1:x}", 4000))
        r = guesser.get("/api/v1/me", headers={"Authorization": f"Bearer glp_guess{i}"})
        assert r.status_code == 401
    same_net = TestClient(http.app, client=("2001:db8:0:1:ffff::9", 4000))
    assert same_net.get("/api/v1/me", headers=ann.headers).status_code == 429
    next_net = TestClient(http.app, client=("2001:db8:0:2::1", 4000))
    assert next_net.get("/api/v1/me", headers=ann.headers).status_code == 200


def test_address_keys() -> None:
    assert address_key("2001:db8::1") == address_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert address_key("::ffff:198.51.100.7") == address_key("198.51.100.7") == "198.51.100.7"
    assert address_key("198.51.100.8") != address_key("198.51.100.7")
    assert address_key("testclient") == "testclient"


def test_failed_logins_go_to_the_servers_log(
    http: TestClient, rt: Runtime, ann: Caller, caplog: pytest.LogCaptureFixture
) -> None:
    injected_clock(http, rt)
    with caplog.at_level(logging.WARNING, logger="gpulease.server.services.ratelimit"):
        login(http, "ann", "wrong-guess-1")
    (record,) = [r for r in caplog.records if r.name.endswith("ratelimit")]
    assert "'ann'" in record.getMessage() and "testclient" in record.getMessage()
    assert "wrong-guess" not in caplog.text

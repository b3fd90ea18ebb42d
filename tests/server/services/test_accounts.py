"""Accounts and tokens through the API: registration, login, tokens, roles, refusals."""

from __future__ import annotations

from starlette.testclient import TestClient

from factories import Caller, make_user


def test_register_grants_signup_credit_and_logs_in(http: TestClient, ann: Caller) -> None:
    assert ann.get("/api/v1/me").json()["name"] == "ann"
    assert ann.get("/api/v1/balance").json()["balance_micro"] == 10_000_000
    r = http.post("/api/v1/auth/login", json={"name": "ann", "password": "password-123"})
    assert r.status_code == 200
    assert r.json()["token"].startswith("glp_")


def test_wrong_password_and_unknown_user_are_401(http: TestClient, ann: Caller) -> None:
    for body in ({"name": "ann", "password": "nope-nope-1"}, {"name": "zed", "password": "x" * 9}):
        r = http.post("/api/v1/auth/login", json=body)
        assert r.status_code == 401
        assert "wrong user name or password" in r.json()["detail"]


def test_registration_refusals_say_what_to_do(http: TestClient, ann: Caller) -> None:
    r = http.post("/api/v1/auth/register", json={"name": "ann", "password": "password-123"})
    assert r.status_code == 409 and "taken" in r.json()["detail"]
    r = http.post("/api/v1/auth/register", json={"name": "cid", "password": "short"})
    assert r.status_code == 422 and "at least 8" in r.json()["detail"]
    r = http.post("/api/v1/auth/register", json={"name": "Bad Name!", "password": "password-123"})
    assert r.status_code == 422 and "lowercase" in r.json()["detail"]
    r = http.post("/api/v1/auth/register", json={"name": "cid"})
    assert r.status_code == 422 and "password" in r.json()["detail"]
    r = http.post(
        "/api/v1/auth/register", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422


def test_no_token_and_bad_token_are_401(http: TestClient) -> None:
    r = http.get("/api/v1/instances")
    assert r.status_code == 401 and "gpulease login" in r.json()["detail"]
    r = http.get("/api/v1/instances", headers={"Authorization": "Bearer glp_made_up"})
    assert r.status_code == 401


def test_tokens_create_list_revoke(ann: Caller) -> None:
    r = ann.post("/api/v1/tokens", json={"name": "laptop"})
    assert r.status_code == 201
    secret, info = r.json()["token"], r.json()["info"]
    assert secret.startswith(info["prefix"])
    listed = ann.get("/api/v1/tokens").json()
    assert "laptop" in [t["name"] for t in listed]
    assert all("token" not in t and "hash" not in str(t) for t in listed)
    laptop = Caller(ann.http, secret, "ann")
    assert laptop.get("/api/v1/me").status_code == 200
    assert ann.delete(f"/api/v1/tokens/{info['id']}").status_code == 204
    r = laptop.get("/api/v1/me")
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    # a revoked token creates nothing
    r = laptop.post("/api/v1/instances", json={"gpu": "T4:1"})
    assert r.status_code == 401
    assert ann.get("/api/v1/instances").json() == []


def test_other_users_tokens_are_invisible(http: TestClient, ann: Caller) -> None:
    token_id = ann.post("/api/v1/tokens", json={"name": "ci"}).json()["info"]["id"]
    bob = make_user(http, "bob")
    assert "ci" not in [t["name"] for t in bob.get("/api/v1/tokens").json()]
    r = bob.delete(f"/api/v1/tokens/{token_id}")
    assert r.status_code == 404
    assert ann.get("/api/v1/tokens").json()[-1]["revoked_at"] is None


def test_admin_endpoints_are_403_for_users(ann: Caller, admin: Caller) -> None:
    for url in ("/api/v1/admin/users", "/api/v1/nodes"):
        r = ann.get(url)
        assert r.status_code == 403 and "admin" in r.json()["detail"]
        assert admin.get(url).status_code == 200
    r = ann.post("/api/v1/admin/grants", json={"user": "ann", "amount": "100"})
    assert r.status_code == 403
    assert ann.get("/api/v1/balance").json()["balance_micro"] == 10_000_000


def test_admin_grants_credit(ann: Caller, admin: Caller) -> None:
    r = admin.post("/api/v1/admin/grants", json={"user": "ann", "amount": "2.50"})
    assert r.status_code == 201, r.text
    assert ann.get("/api/v1/balance").json()["balance_micro"] == 12_500_000
    for amount, word in (
        ("-5", "positive"),
        ("1e30", "billion"),
        ("abc", "amount"),
        ("0.0000001", "decimals"),
    ):
        r = admin.post("/api/v1/admin/grants", json={"user": "ann", "amount": amount})
        assert r.status_code == 422 and word in r.json()["detail"], r.text
    r = admin.post("/api/v1/admin/grants", json={"user": "nobody", "amount": "1"})
    assert r.status_code == 404
    assert ann.get("/api/v1/balance").json()["balance_micro"] == 12_500_000


def test_catalog_shows_prices_and_simulated_counts(ann: Caller) -> None:
    models = {m["name"]: m for m in ann.get("/api/v1/gpus").json()}
    assert models["T4"]["hourly_micro"] == 250_000
    assert models["A100-40GB"]["hourly_micro"] == 900_000
    assert models["A100-80GB"]["hourly_micro"] == 900_000
    assert {"P100", "V100", "RTX4090", "H100-80GB", "CPU"} <= set(models)
    assert (models["A100-80GB"]["free"], models["A100-80GB"]["total"]) == (2, 2)
    assert models["A100-80GB"]["simulated"] == 2
    assert models["H100-80GB"]["total"] == 0
    assert not models["CPU"]["is_gpu"]

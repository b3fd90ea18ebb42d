"""The admin console (nodes, users and grants, prices) and the Billing page's ledger and caps."""

from __future__ import annotations

import re
from collections.abc import Callable

from starlette.testclient import TestClient

from factories import BrowserFactory, Caller, RunnerDouble, logged_in

ADMIN_PAGES = ("/admin", "/admin/nodes", "/admin/users", "/admin/prices")


def as_admin(browser: BrowserFactory) -> TestClient:
    return logged_in(browser, "admin", "admin-password-1")


def text(html: str) -> str:
    return html.replace("&#39;", "'").replace("&amp;", "&")


def balance(caller: Caller) -> int:
    return int(caller.get("/api/v1/balance").json()["balance_micro"])


def test_admin_pages_are_for_admins_only(
    ann: Caller, admin: Caller, browser: BrowserFactory
) -> None:
    anonymous = browser()
    for path in ADMIN_PAGES:
        r = anonymous.get(path)
        assert r.status_code == 303, path
        assert r.headers["location"].startswith("/login?next=%2Fadmin"), path
    user = logged_in(browser, "ann")
    for path in ADMIN_PAGES:
        r = user.get(path)
        assert r.status_code == 404 and "Page not found" in r.text, path
        assert "Grant credit" not in r.text and "Revenue" not in r.text
    posts = {
        "/admin/users/grant": {"user": "ann", "amount": "100"},
        "/admin/users/ann/caps": {"max_hourly": "5"},
        "/admin/prices/offpeak": {"start": "22:00", "end": "06:00", "discount": "50"},
        "/admin/prices/vouchers": {"amount": "100", "code": "FREE-MONEY"},
    }
    for path, form in posts.items():
        assert user.post(path, data=form).status_code == 404, path
        assert anonymous.post(path, data=form).status_code == 303, path
    assert balance(ann) == 10_000_000  # the sign-up credit only: no grant went through
    assert admin.get("/api/v1/admin/vouchers").json() == []
    assert admin.get("/api/v1/offpeak").json() == []
    assert ann.get("/api/v1/limits").json()["admin_max_hourly_micro"] is None


def test_nodes_page_lists_gpus_holders_and_the_heat_map(
    ann: Caller,
    browser: BrowserFactory,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    made = ann.post("/api/v1/instances", json={"gpu": "T4:1", "name": "cats"}).json()
    tick()
    runner_for(int(made["id"])).ready()
    r = as_admin(browser).get("/admin")
    assert r.status_code == 200
    html = text(r.text)
    assert 'href="/admin" class="active"' in html  # the admin tab
    assert "A100-80GB" in html and "T4" in html
    assert html.count("tag-sim") == 3  # every simulated GPU is marked
    assert "ann/cats" in html and html.count(">free<") == 2
    assert html.count("simulated, no readings") == 3  # never an invented number
    assert re.search(r"held of 3", html)
    src = re.search(r'data-src="([^"]+)"', html)
    assert src and src.group(1) == "/api/v1/admin/gpu-heatmap?minutes=60&bucket_s=60"
    assert "/static/js/heatmap.js?v=" in html and "<script>" not in html
    assert 'data-testid="revenue-summary"' in html
    assert as_admin(browser).get("/admin/nodes").text.count("tag-sim") == 3


def test_users_page_lists_balances_and_caps(
    ann: Caller, bob: Caller, browser: BrowserFactory
) -> None:
    assert ann.put("/api/v1/limits", json={"monthly_budget": "8"}).status_code == 200
    html = text(as_admin(browser).get("/admin/users").text)
    for name in ("admin", "ann", "bob"):
        assert f'data-user="{name}"' in html
    assert re.search(r'data-testid="balance-ann">\$10\.0000', html)
    assert "$8.00" in html  # ann's own monthly budget
    assert '<option value="bob">bob ($10.0000)</option>' in html


GRANT_REFUSALS = [
    (
        {"user": "ann", "amount": "lots"},
        422,
        "amount: 'lots' is not an amount; write it like 12.50",
    ),
    ({"user": "ann", "amount": ""}, 422, "enter an amount to grant, like 25.00"),
    ({"user": "ann", "amount": "-5"}, 422, "amount cannot be negative"),
    ({"user": "ann", "amount": "0"}, 422, "a credit grant must be a positive amount"),
    ({"user": "ann", "amount": "5000000000"}, 422, "larger than a billion credits"),
    ({"user": "ann", "amount": "0.0000001"}, 422, "amount"),
    ({"user": "", "amount": "5"}, 422, "choose the user to grant credit to"),
    ({"user": "nobody", "amount": "5"}, 404, "no user named 'nobody'"),
]


def test_grant_and_caps_forms_refuse_bad_input_then_apply(
    ann: Caller, browser: BrowserFactory
) -> None:
    client = as_admin(browser)
    for form, status, says in GRANT_REFUSALS:
        r = client.post("/admin/users/grant", data={**form, "memo": "kept memo"})
        assert r.status_code == status, (form, r.text)
        html = text(r.text)
        assert 'class="alert"' in html and says in html, (form, html)
        assert 'value="kept memo"' in html  # what was typed is kept
    assert balance(ann) == 10_000_000

    r = client.post(
        "/admin/users/grant", data={"user": "ann", "amount": "$25.50", "memo": "course credit"}
    )
    assert r.status_code == 303
    assert re.fullmatch(r"/admin/users\?granted=\d+", r.headers["location"])
    page = client.get(r.headers["location"])
    assert "Granted $25.5000 to ann." in page.text
    assert balance(ann) == 35_500_000
    (line,) = [x for x in ann.get("/api/v1/usage").json()["ledger"] if x["kind"] == "grant"]
    assert line["memo"] == "course credit (by admin)" and line["amount_micro"] == 25_500_000
    assert client.get("/admin/users", params={"granted": "999999"}).status_code == 200
    cross = client.post(
        "/admin/users/grant",
        data={"user": "ann", "amount": "1"},
        headers={"Origin": "http://evil.example"},
    )
    assert cross.status_code == 403 and "another site" in cross.text
    assert balance(ann) == 35_500_000

    r = client.post("/admin/users/ann/caps", data={"max_hourly": "1.50", "monthly_budget": ""})
    assert r.status_code == 303 and r.headers["location"] == "/admin/users?capped=ann"
    assert "Saved the caps of ann." in client.get(r.headers["location"]).text
    caps = ann.get("/api/v1/limits").json()
    assert caps["admin_max_hourly_micro"] == 1_500_000
    assert caps["admin_monthly_budget_micro"] is None
    bad = client.post("/admin/users/ann/caps", data={"max_hourly": "fast"})
    assert bad.status_code == 422 and "max hourly spend: 'fast' is not an amount" in text(bad.text)
    missing = client.post("/admin/users/nobody/caps", data={"max_hourly": "1"})
    assert missing.status_code == 404 and "no user named" in missing.text


def test_prices_page_shows_the_catalog_and_edits_off_peak_windows(
    admin: Caller, browser: BrowserFactory
) -> None:
    client = as_admin(browser)
    html = text(client.get("/admin/prices").text)
    assert 'data-testid="price-table"' in html
    assert "$0.9000" in html and "$0.2500" in html  # A100 and T4 on demand
    assert "$18.0000" in html  # A100's daily block (20 h), in the same format
    assert "17 % below 24 h on demand" in html  # a daily block is 20 h of 24 (16.67 %)
    assert "pricing.yaml" in html and "GPULEASE_PRICING_FILE" in html and "restart" in html
    assert "No off-peak windows" in html and "No vouchers" in html

    form = {"weekdays": "mon-fri", "start": "22:00", "end": "06:00", "discount": "30%"}
    r = client.post("/admin/prices/offpeak", data=form)
    assert r.status_code == 303 and r.headers["location"] == "/admin/prices?done=window-added"
    (window,) = admin.get("/api/v1/offpeak").json()
    assert window["weekdays"] == ["mon", "tue", "wed", "thu", "fri"]
    assert (window["start"], window["end"], window["discount_percent"]) == ("22:00", "06:00", "30")
    html = text(client.get("/admin/prices").text)
    assert "mon, tue, wed, thu, fri" in html and "30 %" in html
    for changes, says in [
        ({"discount": "nan"}, "discount 'nan' is not a number; write a percentage above 0"),
        ({"discount": "inf"}, "discount 'inf' is not a number"),
        ({"discount": "-Infinity %"}, "is not a number"),
        ({"discount": "-10"}, "discount '-10' is out of range"),
        ({"discount": "0"}, "above 0 % and at most 100 %"),
        ({"discount": "150"}, "at most 100 %"),
        ({"discount": "100.5%"}, "discount '100.5%' is out of range"),
        ({"start": "25:00"}, "'25:00' is not a time of day"),
        ({"weekdays": "someday"}, "someday"),
        ({}, "overlaps an existing off-peak window"),
    ]:
        bad = client.post("/admin/prices/offpeak", data={**form, **changes})
        assert bad.status_code == 422, (changes, bad.text)
        assert says in text(bad.text), (changes, text(bad.text))
    r = client.post(f"/admin/prices/offpeak/{window['id']}/delete")
    assert r.status_code == 303 and admin.get("/api/v1/offpeak").json() == []
    gone = client.post(f"/admin/prices/offpeak/{window['id']}/delete")
    assert gone.status_code == 404 and "there is no off-peak window" in gone.text


def test_vouchers_are_created_and_listed(
    ann: Caller, admin: Caller, browser: BrowserFactory
) -> None:
    client = as_admin(browser)
    form = {
        "amount": "5",
        "code": "cats-2026",
        "max_redemptions": "10",
        "per_user_limit": "1",
        "expires": "2099-12-31",
    }
    r = client.post("/admin/prices/vouchers", data=form)
    assert r.status_code == 303
    (voucher,) = admin.get("/api/v1/admin/vouchers").json()
    assert voucher["code"] == "CATS-2026" and voucher["amount_micro"] == 5_000_000
    assert voucher["expires_at"].startswith("2100-01-01")  # the end of the day typed
    assert ann.post("/api/v1/vouchers/redeem", json={"code": "cats-2026"}).status_code == 200
    html = text(client.get("/admin/prices").text)
    assert "CATS-2026" in html and "1 of 10" in html and "2100-01-01 00:00 UTC" in html
    for changes, status, says in [
        ({"amount": "x"}, 422, "amount: 'x' is not an amount"),
        ({"amount": ""}, 422, "a voucher needs an amount"),
        ({"max_redemptions": "many"}, 422, "max redemptions must be a whole number"),
        ({"per_user_limit": "0"}, 422, "the per-user limit must be from 1"),
        ({"expires": "31/12/2099"}, 422, "the expiry must be a date like 2026-12-31"),
        ({"expires": "2001-01-01", "code": "OLD-ONE"}, 422, "the expiry is in the past"),
        ({}, 409, "a voucher CATS-2026 exists already"),
    ]:
        bad = client.post("/admin/prices/vouchers", data={**form, **changes})
        assert bad.status_code == status, (changes, bad.text)
        assert says in text(bad.text), (changes, text(bad.text))
    assert len(admin.get("/api/v1/admin/vouchers").json()) == 1


def test_billing_page_pages_the_ledger_and_sets_your_own_caps(
    ann: Caller, admin: Caller, browser: BrowserFactory
) -> None:
    for i in range(30):
        r = admin.post("/api/v1/admin/grants", json={"user": "ann", "amount": "1", "memo": f"g{i}"})
        assert r.status_code == 201
    client = logged_in(browser, "ann")
    first = text(client.get("/billing").text)
    assert first.count("(by admin)") == 25
    assert "g29 (by admin)" in first and "g5 (by admin)" in first and "g4 (by admin)" not in first
    older = re.search(r'href="(/billing\?[^"]*page=2[^"]*)"', first)
    assert older and "Newer" not in first
    second = text(client.get(older.group(1)).text)
    assert second.count("(by admin)") == 5 and "sign-up credit" in second
    assert "Older" not in second and "Newer" in second
    assert client.get("/billing", params={"page": "0"}).status_code == 422
    assert "No more entries" in client.get("/billing", params={"page": "9"}).text

    html = client.get("/billing").text
    assert 'id="plans"' in html and "Spot" in html and "Daily" in html
    r = client.post(
        "/billing/caps", data={"max_hourly": "2", "monthly_budget": "", "low_balance": "1"}
    )
    assert r.status_code == 303 and r.headers["location"] == "/billing?saved=caps#caps"
    caps = ann.get("/api/v1/limits").json()
    assert caps["max_hourly_micro"] == 2_000_000 and caps["monthly_budget_micro"] is None
    assert caps["low_balance_micro"] == 1_000_000
    page = client.get("/billing?saved=caps").text
    assert "Saved your spending caps." in page and 'value="2.00"' in page
    bad = client.post("/billing/caps", data={"max_hourly": "two", "low_balance": "1"})
    assert bad.status_code == 422 and 'value="two"' in bad.text
    assert "max hourly spend: 'two' is not an amount" in text(bad.text)
    assert ann.get("/api/v1/limits").json()["max_hourly_micro"] == 2_000_000

"""Console pages: the Create form with its estimate, and the Billing page."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

import pytest

from factories import BrowserFactory, Caller, RunnerDouble, logged_in
from gpulease.schemas.statements import RevenueDay
from gpulease.server.db import transaction
from gpulease.server.routers.ui.billing import revenue_chart
from gpulease.server.runtime import Runtime
from gpulease.server.services import metering

FORM = {"gpu_model": "T4", "gpu_count": "1", "template": "pytorch", "name": "cats"}


def test_create_page_lists_the_catalog_and_the_estimate_fields(
    ann: Caller, browser: BrowserFactory
) -> None:
    assert browser().get("/instances/new").headers["location"] == "/login?next=%2Finstances%2Fnew"
    page = logged_in(browser, "ann").get("/instances/new")
    assert page.status_code == 200
    html = page.text
    assert 'href="/instances/new" class="active"' in html and 'href="/billing"' in html
    assert re.search(r"A100-80GB · 80 GB · \$0\.9000/h per GPU · 2/2 free \(simulated\)", html)
    assert "T4 · 16 GB · $0.2500/h per GPU · 1/1 free (simulated)" in html
    assert "CPU only · $0.0200/h" in html
    assert "H100-80GB" in html and "not offered here" in html  # in the catalog, no node has one
    for field in ("est-model", "est-images", "est-epochs", "est-size"):
        assert f'id="{field}"' in html
    assert 'data-endpoint="/api/v1/estimate"' in html and "/static/js/estimate.js?v=" in html
    assert "<script>" not in html  # scripts come from /static only (CSP)


def test_create_posts_through_the_service_and_goes_to_the_new_instance(
    ann: Caller, browser: BrowserFactory
) -> None:
    client = logged_in(browser, "ann")
    r = client.post("/instances/new", data=FORM, headers={"Origin": "http://testserver"})
    (made,) = ann.get("/api/v1/instances").json()
    assert r.status_code == 303 and r.headers["location"] == f"/instances/{made['id']}"
    assert (made["name"], made["gpu_model"], made["gpu_count"]) == ("cats", "T4", 1)
    assert made["status"] == "queued" and made["template"] == "pytorch"
    cpu = client.post("/instances/new", data={**FORM, "gpu_model": "CPU", "name": "prep"})
    assert cpu.status_code == 303
    names = {i["name"]: i for i in ann.get("/api/v1/instances").json()}
    assert names["prep"]["gpu_count"] == 0


REFUSALS = [
    ({"name": "Not A Name"}, 422, "is not a valid instance name"),
    ({"gpu_count": "two"}, 422, "the GPU count must be a whole number"),
    ({"gpu_count": "0"}, 422, "the GPU count must be from 1 to 64"),
    ({"gpu_model": "A100-80GB", "gpu_count": "3"}, 409, "does not fit on any node"),
    ({"gpu_model": "Z9000"}, 422, "unknown GPU model"),
    ({"template": "nope"}, 422, "nope"),
]


def test_refusals_are_shown_on_the_form(ann: Caller, browser: BrowserFactory) -> None:
    client = logged_in(browser, "ann")
    for changes, status, says in REFUSALS:
        r = client.post("/instances/new", data={**FORM, **changes, "images": "12345"})
        assert r.status_code == status, (changes, r.text)
        assert 'class="alert"' in r.text and says in r.text.replace("&#39;", "'")
        assert 'value="12345"' in r.text  # what was typed is kept
    assert ann.get("/api/v1/instances").json() == []


def test_create_from_another_site_is_refused(ann: Caller, browser: BrowserFactory) -> None:
    client = logged_in(browser, "ann")
    for origin in ("http://evil.example", "null"):
        r = client.post("/instances/new", data=FORM, headers={"Origin": origin})
        assert r.status_code == 403 and "another site" in r.text
    r = client.post("/instances/new", data=FORM, headers={"Referer": "http://evil.example/x"})
    assert r.status_code == 403
    assert ann.get("/api/v1/instances").json() == []
    assert browser().post("/instances/new", data=FORM).status_code == 303  # not logged in


def test_estimate_panel_endpoint_works_with_the_session_cookie(
    ann: Caller, browser: BrowserFactory
) -> None:
    client = logged_in(browser, "ann")
    params = {"model": "resnet18", "images": "20000", "epochs": "10", "image_size": "224"}
    r = client.get("/api/v1/estimate", params={**params, "gpus": "2"})
    assert r.status_code == 200
    rows = {row["gpu_model"]: row for row in r.json()["rows"]}
    assert rows["T4"]["devices"] == 2 and rows["CPU"]["devices"] == 1
    bad = client.get("/api/v1/estimate", params={**params, "images": "-5"})
    assert bad.status_code == 422 and "images must be from 1" in bad.json()["detail"]


def _bill(
    rt: Runtime, owner: Caller, tick: Callable[[], None], runners: Callable[[int], RunnerDouble]
) -> date:
    """Bills 2 h of an A100 across the last midnight UTC and answers that midnight's day, read
    once, so that a test running across midnight still asks for the days it billed."""
    r = owner.post("/api/v1/instances", json={"gpu": "A100-80GB:1", "name": "billed"})
    instance_id = int(r.json()["id"])
    tick()
    runners(instance_id).ready()
    with transaction(rt.sessions) as session:
        seg = metering.open_segment_of(session, instance_id)
        assert seg is not None
        midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        seg.started_at = midnight - timedelta(hours=1)
        session.flush()
        metering.charge_segment(session, seg, seg.started_at + timedelta(hours=2))
    return midnight.date()


def test_billing_page_shows_balance_statement_and_csv_link(
    ann: Caller,
    browser: BrowserFactory,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    today = _bill(rt, ann, tick, runner_for)
    client = logged_in(browser, "ann")
    start = today - timedelta(days=1)
    page = client.get("/billing", params={"from": str(start), "to": str(today)})
    assert page.status_code == 200
    html = page.text
    assert 'href="/billing" class="active"' in html
    assert "$8.2000" in html  # $10 sign-up credit less 2 h of an A100 at $0.90
    assert 'data-testid="by-gpu-model"' in html and "A100-80GB" in html and "billed" in html
    assert "$1.8000" in html and "2.0000" in html  # charged; GPU-hours
    link = f"/api/v1/statement.csv?from={start}&amp;to={today}"
    assert link in html
    csv = client.get(link.replace("&amp;", "&"))
    assert csv.status_code == 200 and "billed" in csv.text
    assert "revenue-chart" not in html and "Revenue" not in html  # not an admin


def test_billing_page_refuses_bad_dates_on_the_page(ann: Caller, browser: BrowserFactory) -> None:
    client = logged_in(browser, "ann")
    r = client.get("/billing", params={"from": "2026-12-01", "to": "2026-01-01"})
    assert r.status_code == 422 and "is after to" in r.text
    assert browser().get("/billing").status_code == 303


def test_admins_see_revenue_with_a_server_drawn_chart(
    ann: Caller,
    admin: Caller,
    browser: BrowserFactory,
    rt: Runtime,
    tick: Callable[[], None],
    runner_for: Callable[[int], RunnerDouble],
) -> None:
    today = _bill(rt, ann, tick, runner_for)
    client = logged_in(browser, "admin", "admin-password-1")
    html = client.get(
        "/billing", params={"from": str(today - timedelta(days=6)), "to": str(today)}
    ).text
    assert 'data-testid="revenue-chart"' in html and "<svg" in html
    assert html.count('<rect class="bar"') == 7  # one bar a day
    assert "$1.8000" in html and "revenue-by-model" in html
    assert "/api/v1/admin/revenue.csv?from=" in html


def test_revenue_chart_scales_to_the_best_day() -> None:
    days = [
        RevenueDay(
            day=datetime(2026, 11, d, tzinfo=UTC).date(),
            gpu_seconds=3600,
            gpu_hours=1.0,
            revenue_micro=micro,
            revenue=f"${micro / 1e6:.4f}",
            by_kind={},
        )
        for d, micro in ((1, 0), (2, 500_000), (3, 1_000_000))
    ]
    chart = revenue_chart(days, "$")
    heights = [bar.height for bar in chart.bars]
    assert heights[0] == 0 and heights[2] == pytest.approx(2 * heights[1])
    assert chart.bars[2].y == pytest.approx(chart.top)
    assert chart.top_label == "$1.00" and chart.bars[1].title.startswith("2026-11-02: $0.5000")
    assert revenue_chart([], "$").bars == []

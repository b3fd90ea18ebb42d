"""The Create form's live estimate and the Billing page in a real browser."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from browser_support import (
    ADMIN_PASSWORD,
    BROWSER_MARKS,
    LiveServer,
    error_but_422,
    log_in,
    page_problems,
    running_instance,
    shot,
)
from gpulease.client import GpuleaseClient
from gpulease.schemas.accounts import RegisterRequest
from gpulease.server.db import transaction
from gpulease.server.services import metering

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = BROWSER_MARKS
sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


def test_create_form_estimates_live_and_creates(server: LiveServer, browser: Browser) -> None:
    with GpuleaseClient(server.url) as anonymous:
        anonymous.auth.register(RegisterRequest(name="dora", password="cat-breeds-2024"))
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems = page_problems(page, console=error_but_422)
    log_in(page, server.url, "dora", "cat-breeds-2024")
    page.get_by_role("link", name="Create").click()
    expect(page).to_have_url(server.url + "/instances/new")

    # resnet50, 100k images, 30 epochs on one A100 80GB: the API's row for that GPU
    expect(page.locator("#est-gpu-hours")).to_have_text("0.338")
    expect(page.locator("#est-cost")).to_have_text("$0.3037")
    expect(page.locator("#est-ncu")).to_have_text("0.0141")
    expect(page.locator("#estimate-basis")).to_contain_text("1 × A100-80GB")
    shot(page, "create-estimate.png")

    page.locator("#gpu-count").fill("2")
    expect(page.locator("#estimate-basis")).to_contain_text("2 × A100-80GB")
    page.locator("#est-model").select_option("resnet18")
    page.locator("#est-images").fill("50000")
    expect(page.locator("#est-gpu-hours")).to_have_text("0.053")
    page.locator("#est-images").fill("0")
    expect(page.locator("#estimate-error")).to_contain_text("images must be from 1")
    expect(page.locator("#estimate-result")).to_be_hidden()
    page.locator("#est-images").fill("50000")
    expect(page.locator("#estimate-result")).to_be_visible()

    page.get_by_label("Name").fill("Bad Name")
    page.get_by_role("button", name="Create instance").click()
    expect(page.get_by_role("alert").first).to_contain_text("is not a valid instance name")
    expect(page.locator("#est-images")).to_have_value("50000")  # kept across the refusal
    page.get_by_label("Name").fill("cats")
    page.get_by_role("button", name="Create instance").click()
    expect(page).to_have_url(re.compile(r"/instances/\d+$"))  # the new instance's page
    expect(page.get_by_role("heading", level=1)).to_have_text("cats")
    expect(page.locator("#instance-status")).to_contain_text("A100-80GB × 2")

    page.get_by_role("link", name="Billing").click()
    expect(page.get_by_test_id("balance")).to_have_text("$10.0000")
    expect(page.get_by_test_id("by-kind")).to_contain_text("signup_credit")
    shot(page, "billing.png")
    assert problems == []


def test_admin_billing_page_draws_daily_revenue(server: LiveServer, browser: Browser) -> None:
    instance = running_instance(server, "erin", "billed")
    with transaction(server.rt.sessions) as session:
        seg = metering.open_segment_of(session, instance.id)
        assert seg is not None
        seg.started_at -= timedelta(hours=3)
        session.flush()
        metering.charge_segment(session, seg, seg.started_at + timedelta(hours=3))

    page = browser.new_context(viewport={"width": 1280, "height": 1100}).new_page()
    log_in(page, server.url, "admin", ADMIN_PASSWORD, next_path="/billing")
    expect(page).to_have_url(server.url + "/billing")
    chart = page.get_by_test_id("revenue-chart")
    expect(chart).to_be_visible()
    expect(page.get_by_test_id("revenue-by-model")).to_contain_text("$2.7000")
    tallest = max(
        float(h or 0)
        for h in chart.locator("rect.bar").evaluate_all(
            "bars => bars.map(b => b.getAttribute('height'))"
        )
    )
    assert tallest > 100
    shot(page, "billing-admin.png")

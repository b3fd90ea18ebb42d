"""The Create form's live estimate and the Billing page in a real browser."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the live-server fixtures, shared

from datetime import timedelta  # noqa: E402

import httpx  # noqa: E402
from test_console_browser import (  # noqa: E402
    CHROMIUM,
    LiveServer,
    browser,
    server,
    shot,
)

from factories import RunnerDouble  # noqa: E402
from gpulease.client import GpuleaseClient  # noqa: E402
from gpulease.server.db import transaction  # noqa: E402
from gpulease.server.reconcilers.loop import run_once  # noqa: E402
from gpulease.server.services import metering  # noqa: E402

if TYPE_CHECKING:
    from playwright.sync_api import Browser

__all__ = ["browser", "server"]  # fixtures, used by name

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing"),
]
sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


def test_create_form_estimates_live_and_creates(server: LiveServer, browser: Browser) -> None:
    with GpuleaseClient(server.url) as anonymous:
        anonymous.register("dora", "cat-breeds-2024")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on(
        "console",
        lambda msg: (
            problems.append(f"console {msg.type}: {msg.text}")
            if msg.type == "error" and "422" not in msg.text
            else None
        ),
    )
    page.goto(server.url + "/login")
    page.get_by_label("User name").fill("dora")
    page.get_by_label("Password").fill("cat-breeds-2024")
    page.get_by_role("button", name="Log in").click()
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
    expect(page).to_have_url(server.url + "/")
    expect(page.locator("#instances")).to_contain_text("cats")
    expect(page.locator("#instances")).to_contain_text("A100-80GB × 2")

    page.get_by_role("link", name="Billing").click()
    expect(page.get_by_test_id("balance")).to_have_text("$10.0000")
    expect(page.get_by_test_id("by-kind")).to_contain_text("signup_credit")
    shot(page, "billing.png")
    assert problems == []


def test_admin_billing_page_draws_daily_revenue(server: LiveServer, browser: Browser) -> None:
    with GpuleaseClient(server.url) as anonymous:
        token = anonymous.register("erin", "cat-breeds-2024").token
    with GpuleaseClient(server.url, token) as erin:
        instance = erin.create_instance("A100-80GB:1", name="billed")
    run_once(server.rt)
    handle = server.backend.handle_for(instance.id)
    assert handle is not None
    with httpx.Client(base_url=server.url) as runner_http:
        runner = RunnerDouble(runner_http, server.backend.runners[handle].spec.token)  # type: ignore[arg-type]
        runner.ready()
    with transaction(server.rt.sessions) as session:
        seg = metering.open_segment_of(session, instance.id)
        assert seg is not None
        seg.started_at -= timedelta(hours=3)
        session.flush()
        metering.charge_segment(session, seg, seg.started_at + timedelta(hours=3))

    page = browser.new_context(viewport={"width": 1280, "height": 1100}).new_page()
    page.goto(server.url + "/login?next=/billing")
    page.get_by_label("User name").fill("admin")
    page.get_by_label("Password").fill("admin-password-1")
    page.get_by_role("button", name="Log in").click()
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

"""Every console page in a real browser, as an admin and as a renter: none logs an error, a
refused request or a Content-Security-Policy violation. On the way: a finished run's badge
stops saying "Live", the dashboard's Took column shows durations, the create form shows
whole template descriptions, mounts datasets ticked in checkboxes and lands on the new
instance, and the terminal fits its card."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from browser_support import (
    ADMIN_PASSWORD,
    BROWSER_MARKS,
    LiveServer,
    log_in,
    running_instance,
    shot,
)
from factories import RunnerDouble
from gpulease.client import GpuleaseClient
from gpulease.schemas.accounts import LoginRequest
from gpulease.schemas.runs import RunCreate
from gpulease.schemas.sweeps import SweepCreate, SweepSpace, SweepTask

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Page, Request, Response

pytestmark = BROWSER_MARKS

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

PASSWORD = "cat-breeds-2024"  # browser_support.running_instance's
# Every CSP refusal becomes a console error the listener below sees.
REPORT_CSP = """document.addEventListener("securitypolicyviolation", (e) =>
  console.error(`CSP violation: ${e.violatedDirective} ${e.blockedURI || "inline"}`));"""
DURATION = re.compile(r"^\d+ (s|min|h|d)\b")


def watched(context: BrowserContext, problems: list[str]) -> Page:
    """A page that notes each uncaught error, console error or warning, failed request and
    4xx/5xx answer into problems. A request cut short by leaving the page (a live stream's)
    is not a failure."""
    context.add_init_script(REPORT_CSP)
    page = context.new_page()
    page.on("pageerror", lambda exc: problems.append(f"{page.url}: page error: {exc}"))

    def console(msg: object) -> None:
        kind, text = getattr(msg, "type", ""), getattr(msg, "text", "")
        if kind in ("error", "warning"):
            problems.append(f"{page.url}: console {kind}: {text}")

    def failed(request: Request) -> None:
        if request.failure != "net::ERR_ABORTED":
            problems.append(f"{page.url}: {request.url} failed: {request.failure}")

    def answered(response: Response) -> None:
        if response.status >= 400:
            problems.append(f"{page.url}: {response.url} answered {response.status}")

    page.on("console", console)
    page.on("requestfailed", failed)
    page.on("response", answered)
    return page


def visit(page: Page, url: str) -> None:
    """Open a page and give its scripts a moment to run (draw, connect, first refresh)."""
    response = page.goto(url)
    assert response is not None and response.status == 200, url
    page.wait_for_load_state("load")
    page.wait_for_timeout(300)


def test_every_console_page_is_clean_for_an_admin_and_a_renter(
    server: LiveServer, browser: object
) -> None:
    base = server.url
    instance = running_instance(server, "ann", "cats")
    with GpuleaseClient(base) as anonymous:
        token = anonymous.auth.login(LoginRequest(name="ann", password=PASSWORD)).token
    handle = server.backend.handle_for(instance.id)
    assert handle is not None
    problems: list[str] = []

    # The admin, before anyone asked for help: the empty Support page speaks to the admin.
    admin_context = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    admin = watched(admin_context, problems)
    log_in(admin, base, "admin", ADMIN_PASSWORD, next_path="/admin")
    expect(admin).to_have_url(base + "/admin")
    for path in ("/admin/users", "/admin/prices", "/billing", "/settings/notifications"):
        visit(admin, base + path)
    visit(admin, base + "/support")
    expect(admin.locator("#tickets")).to_contain_text("No tickets from users")
    expect(admin.locator("#tickets")).not_to_contain_text("Ask for help")
    # This server has no SMTP: the email form is there, greyed out and disabled.
    visit(admin, base + "/settings/notifications")
    email = admin.get_by_test_id("email-form")
    for control in (email.get_by_label("Address"), email.get_by_role("button", name="Save email")):
        expect(control).to_be_disabled()
    assert float(email.evaluate("(e) => getComputedStyle(e).opacity")) < 1
    admin_context.close()

    context = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    page = watched(context, problems)
    log_in(page, base, "ann", PASSWORD)
    expect(page).to_have_url(base + "/")
    with (
        GpuleaseClient(base, token) as ann,
        httpx.Client(base_url=base) as runner_http,
    ):
        runner = RunnerDouble(runner_http, server.backend.runners[handle].spec.token)  # type: ignore[arg-type]
        done = ann.runs.create("cats", RunCreate(command="python train.py --epochs 1"))
        assert runner.call("POST", f"/runs/{done.id}/started", json={"pid": 7}).status_code == 204

        # The run page while the run goes on says Live; once it exits, Finished.
        visit(page, f"{base}/runs/{done.id}")
        badge = page.get_by_test_id("live-state")
        expect(badge).to_have_text("Live")
        # A step sent by the SDK and then printed on stdout keeps the SDK's value live
        metrics = f"/runs/{done.id}/metrics"
        now = time.time()
        sdk = [{"key": "loss", "step": 0, "value": 0.61234, "time": now, "source": "sdk"}]
        assert runner.call("POST", metrics, json={"points": sdk}).status_code == 204
        loss = "(window.gpuleaseCharts['run:loss'] || {data: [[], []]}).data[1]"
        page.wait_for_function(f"() => {loss}.length === 1")
        printed = [
            {"key": "loss", "step": s, "value": v, "time": now, "source": "stdout"}
            for s, v in ((0, 0.6123), (1, 0.5))
        ]
        assert runner.call("POST", metrics, json={"points": printed}).status_code == 204
        page.wait_for_function(f"() => {loss}.length === 2")
        assert page.evaluate(loss) == [0.61234, 0.5]
        assert (
            runner.call("POST", f"/runs/{done.id}/exit", json={"exit_code": 0}).status_code == 204
        )
        expect(badge).to_have_text("Finished")
        expect(badge).to_have_attribute("data-state", "done")
        visit(page, f"{base}/runs/{done.id}")  # and so it stays, loaded afresh
        expect(badge).to_have_text("Finished")
        page.wait_for_timeout(2500)  # past a refresh of the page's live parts
        expect(badge).to_have_text("Finished")

        waiting = ann.runs.create("cats", RunCreate(command="python eval.py"))
        visit(page, base + "/")
        took = page.locator(f'#runs tr[data-run-id="{done.id}"] [data-testid="run-took"]')
        expect(took).to_have_text(DURATION)
        expect(took).to_be_in_viewport()
        queued = page.locator(f'#runs tr[data-run-id="{waiting.id}"] [data-testid="run-took"]')
        expect(queued).to_have_text(re.compile(r"^waiting \d+ (s|min)"))
        shot(page, "pages-dashboard.png")
        visit(page, f"{base}/runs/compare?ids={done.id},{waiting.id}")

        # A sweep: its page overlays every trial's curve of the metric on one chart.
        swept = ann.sweeps.create(
            SweepCreate(
                task=SweepTask(run="python train.py --lr ${lr}", gpu=None),
                space=SweepSpace(grid={"lr": ["0.1", "0.01"]}),
                metric="val_acc",
            )
        )
        visit(page, base + "/sweeps")
        visit(page, f"{base}/sweeps/{swept.id}")
        page.wait_for_function("() => !!window.gpuleaseCharts['sweep:val_acc']")

        # The instance page: its terminal fits inside its card.
        visit(page, f"{base}/instances/{instance.id}")
        screen = page.get_by_test_id("terminal")
        expect(screen.locator(".xterm-screen")).to_be_visible()
        outer = screen.bounding_box()
        inner = screen.locator(".xterm-screen").bounding_box()
        assert outer is not None and inner is not None
        assert inner["x"] >= outer["x"] and inner["y"] >= outer["y"]
        assert inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 0.5
        assert inner["y"] + inner["height"] <= outer["y"] + outer["height"] + 0.5
        # fitted to the card, not xterm's 80 × 24 default
        assert inner["width"] > outer["width"] * 0.8, (inner, outer)
        shot(page, "pages-instance.png")
        visit(page, f"{base}/instances/{instance.id}/terminal")

        # A dataset from the console's own upload form, for the create form to mount.
        visit(page, base + "/datasets")
        page.get_by_label("Name").fill("digits")
        upload = {"name": "labels.csv", "mimeType": "text/csv", "buffer": b"file,label\n"}
        page.locator("#dataset-files").set_input_files(files=[upload])
        page.get_by_role("button", name="Upload").click()
        expect(page.locator("#datasets")).to_contain_text("digits")

        # The create form: every template with its whole description, datasets as checkboxes.
        visit(page, base + "/instances/new")
        templates = {t.name: t.description for t in ann.templates.list()}
        choices = page.locator("#template label.choice")
        expect(choices).to_have_count(len(templates))
        for choice in choices.all():
            name = choice.get_attribute("data-template")
            assert name in templates
            text = choice.locator(".choice-text")
            expect(text).to_have_text(templates[name])
            expect(text).to_be_visible()
            assert text.evaluate("(e) => e.scrollWidth <= e.clientWidth + 1"), name
        shot(page, "pages-create.png")
        page.locator('#template input[value="python"]').check()
        page.locator("#datasets").get_by_role("checkbox", name="digits").check()
        page.get_by_label("Name").fill("fresh")
        page.get_by_role("button", name="Create instance").click()
        (fresh,) = [i for i in ann.instances.list() if i.name == "fresh"]
        expect(page).to_have_url(f"{base}/instances/{fresh.id}")
        assert fresh.datasets == {"digits": 1} and fresh.template == "python"

        # A ticket through the form, then the rest of the renter's pages.
        visit(page, f"{base}/support/new?instance=cats")
        page.get_by_label("Subject").fill("slow data loader")
        page.get_by_label("What happened").fill("epochs take twice as long as yesterday")
        page.get_by_role("button", name="Open ticket").click()
        expect(page).to_have_url(re.compile(r"/support/\d+$"))
        for path in ("/support", "/catalog", "/billing", "/settings/notifications"):
            visit(page, base + path)
    context.close()
    assert problems == []

"""The web console in a real browser: sign up, the live dashboard, the live log tail."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import pytest

from browser_support import ADMIN_PASSWORD, BROWSER_MARKS, LiveServer, page_problems, shot
from factories import RunnerDouble
from gpulease.client import GpuleaseClient
from gpulease.schemas.accounts import LoginRequest
from gpulease.schemas.instances import InstanceCreate
from gpulease.schemas.ledger import GrantCreate
from gpulease.schemas.runs import RunCreate
from gpulease.server.reconcilers.loop import run_once
from gpulease.server.routers.deps import SESSION_COOKIE

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage

pytestmark = BROWSER_MARKS

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


def test_sign_up_then_watch_an_instance_and_its_log_live(
    server: LiveServer, browser: Browser
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems = page_problems(page, console=unexpected_message)

    # Logged out: the dashboard sends us to the login page.
    page.goto(server.url + "/")
    expect(page).to_have_url(server.url + "/login")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    shot(page, "login.png")

    # Sign up in the page; registration logs in and lands on the dashboard.
    page.get_by_role("link", name="Create an account").click()
    page.get_by_label("User name").fill("carol")
    page.get_by_label("Password", exact=True).fill("short")
    page.get_by_label("Repeat the password").fill("short")
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_role("alert")).to_contain_text("at least 8 characters")
    shot(page, "register-error.png")
    page.get_by_label("Password", exact=True).fill("cat-breeds-2024")
    page.get_by_label("Repeat the password").fill("cat-breeds-2024")
    page.get_by_role("button", name="Create account").click()
    expect(page).to_have_url(server.url + "/")
    expect(page.get_by_test_id("balance")).to_have_text("$10.0000")
    expect(page.get_by_test_id("user-name")).to_have_text("carol")
    page.evaluate("window.__sameDocument = true")

    cookie = next(c for c in context.cookies() if c["name"] == SESSION_COOKIE)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and cookie["path"] == "/"

    # Rent an instance with the same session, through the SDK; the page notices by itself.
    with GpuleaseClient(server.url, cookie["value"]) as client:
        instance = client.instances.create(InstanceCreate(gpu="A100-80GB:2", name="cats"))
        instances = page.locator("#instances")
        expect(instances).to_contain_text("cats")
        expect(instances.locator(".pill")).to_have_text("queued")

        run_once(server.rt)
        expect(instances.locator(".pill")).to_have_text("starting")
        handle = server.backend.handle_for(instance.id)
        assert handle is not None
        with httpx.Client(base_url=server.url) as runner_http:
            runner = RunnerDouble(runner_http, server.backend.runners[handle].spec.token)  # type: ignore[arg-type]
            runner.ready()
            expect(instances.locator(".pill")).to_have_text("running")
            expect(instances).to_contain_text("A100-80GB × 2")
            expect(instances).to_contain_text("simulated")

            # A run: its output shows up in the log tail while it happens, without a reload.
            run = client.runs.create("cats", RunCreate(command="python train.py --epochs 3"))
            assert [r["id"] for r in runner.commands()] == [run.id]
            assert (
                runner.call("POST", f"/runs/{run.id}/started", json={"pid": 7}).status_code == 204
            )
            log = page.locator("#log-output")
            post_lines(runner, run.id, 0, ["epoch 1 loss=0.912 acc=0.41", "epoch 2 loss=0.547"])
            expect(log).to_contain_text("epoch 2 loss=0.547")
            expect(page.locator("#log-status")).to_have_text("running")
            expect(page.locator("#log-label")).to_have_text(f"#{run.id} on cats")
            post_lines(runner, run.id, 2, ["epoch 3 loss=0.318 acc=0.83"], stream="stderr")
            expect(log).to_contain_text("epoch 3 loss=0.318 acc=0.83")
            expect(log.locator(".stderr")).to_have_text("epoch 3 loss=0.318 acc=0.83\n")
            r = runner.call("POST", f"/runs/{run.id}/exit", json={"exit_code": 0})
            assert r.status_code == 204
            expect(page.locator("#log-status")).to_have_text("succeeded")
            expect(page.locator("#log-note")).to_have_text("Exited with code 0.")
            runs = page.locator("#runs")
            expect(runs.locator(".pill")).to_have_text("succeeded")
            expect(page.locator("#notifications")).to_contain_text("run finished")
            assert log.inner_text().splitlines() == [
                "epoch 1 loss=0.912 acc=0.41",
                "epoch 2 loss=0.547",
                "epoch 3 loss=0.318 acc=0.83",
            ]
    # Credit granted elsewhere shows up in the balance by itself.
    with GpuleaseClient(server.url) as anonymous:
        admin_token = anonymous.auth.login(
            LoginRequest(name="admin", password=ADMIN_PASSWORD)
        ).token
    with GpuleaseClient(server.url, admin_token) as admin:
        admin.admin.grant(GrantCreate(user="carol", amount="25.00"))
    expect(page.get_by_test_id("balance")).to_have_text("$35.0000")
    assert page.evaluate("window.__sameDocument") is True, "the page reloaded"
    shot(page, "dashboard.png")

    # Log out, then back in through the form: a wrong password is said on the form.
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(server.url + "/login")
    page.get_by_label("User name").fill("carol")
    page.get_by_label("Password").fill("not-my-password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_have_text("wrong user name or password")
    page.get_by_label("Password").fill("cat-breeds-2024")
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(server.url + "/")
    expect(page.locator("#log-output")).to_contain_text("epoch 3 loss=0.318")
    context.close()
    assert problems == []


def unexpected_message(msg: ConsoleMessage) -> bool:
    """Errors and warnings, but for Chromium's note of each 4xx page it loads: the forms
    answer refusals with 401 and 422."""
    expected_refusal = msg.text.startswith("Failed to load resource") and any(
        f"status of {code} " in msg.text for code in (401, 422)
    )
    return msg.type in ("error", "warning") and not expected_refusal


def post_lines(
    runner: RunnerDouble, run_id: int, first_seq: int, lines: list[str], stream: str = "stdout"
) -> None:
    chunks = [
        {"seq": first_seq + i, "stream": stream, "data": line + "\n", "time": time.time()}
        for i, line in enumerate(lines)
    ]
    r = runner.call("POST", f"/runs/{run_id}/logs", json={"chunks": chunks})
    assert r.status_code == 204, r.text

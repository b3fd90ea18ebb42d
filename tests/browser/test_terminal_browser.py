"""The browser terminal and JupyterLab, in a real browser, against a real server and runner.

The instance's shell and JupyterLab run in the bubblewrap sandbox when it works here (as
every multi-user server runs them). JupyterLab is installed once into the environment
cache (tests/processes.ENV_CACHE), so only the first run on a checkout pays for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from browser_support import BROWSER_MARKS, log_in, shot
from gpulease.runner.sandbox import probe
from processes import Platform, running_platform

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

PASSWORD = "password-123"
# The first run installs JupyterLab into the environment cache (PyPI): allow for that.
JUPYTER_START_MS = 300_000

pytestmark = BROWSER_MARKS

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    """A real server (SQLite) whose runners sandbox when bubblewrap works here."""
    unsandboxed = {"GPULEASE_UNSANDBOXED_SINGLE_USER": "true"} if probe() is not None else {}
    with running_platform(
        tmp_path, f"sqlite:///{tmp_path / 'gpulease.db'}", "T4:2", unsandboxed
    ) as p:
        yield p


def logged_in(browser: Browser, platform: Platform, name: str) -> BrowserContext:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    log_in(page, platform.url, name, PASSWORD)
    page.wait_for_url(f"{platform.url}/")
    page.close()
    return context


def screen_text(page: Page) -> str:
    """What the xterm.js screen shows, line by line (its buffer, not pixels)."""
    return str(
        page.evaluate(
            """() => {
              const b = window.gpuleaseTerminal.buffer.active;
              const lines = [];
              for (let i = 0; i < b.length; i++) lines.push(b.getLine(i).translateToString(true));
              return lines.join("\\n");
            }"""
        )
    )


def test_terminal_and_jupyterlab_in_the_browser_for_the_owner_only(
    platform: Platform, browser: Browser
) -> None:
    platform.cli("register", "--server", platform.url, "--name", "ann", "--password", PASSWORD)
    platform.cli(
        "instance", "create", "--gpu", "T4:1", "--template", "python", "--name", "box", "--wait"
    )
    instance_id = int(platform.cli_json("instance", "show", "box")["id"])  # type: ignore[index]
    r = httpx.post(
        f"{platform.url}/api/v1/auth/register", json={"name": "bob", "password": PASSWORD}
    )
    assert r.status_code == 201, r.text

    ann = logged_in(browser, platform, "ann")
    page = ann.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    # Someone typing a command in the run box as the page loads keeps the keyboard when the
    # terminal connects (it used to take the focus, and their keystrokes went to the shell).
    page.add_init_script(
        "document.addEventListener('DOMContentLoaded', () => {"
        " const box = document.getElementById('run-command'); if (box) box.focus(); })"
    )
    page.goto(f"{platform.url}/instances/{instance_id}")
    state = page.locator("#terminal [data-terminal-state]")
    expect(state).to_have_text("connected", timeout=30_000)
    assert page.evaluate("document.activeElement && document.activeElement.id") == "run-command"
    page.get_by_label("Command").fill("echo typed")
    expect(page.get_by_label("Command")).to_have_value("echo typed")
    page.get_by_label("Command").fill("")
    page.locator("[data-testid=terminal]").click()
    page.keyboard.type("echo hel''lo from $(hostname)\n")
    page.wait_for_function(
        """() => {
          const b = window.gpuleaseTerminal && window.gpuleaseTerminal.buffer.active;
          if (!b) return false;
          for (let i = 0; i < b.length; i++) {
            if (b.getLine(i).translateToString(true).startsWith("hello from")) return true;
          }
          return false;
        }""",
        timeout=30_000,
    )
    lines = screen_text(page).splitlines()
    if "GPULEASE_UNSANDBOXED_SINGLE_USER" not in platform.extra_env:
        assert f"hello from gpulease-{instance_id}" in lines  # the sandbox's own hostname
    shot(page, "terminal-instance-page.png")
    assert problems == []

    # JupyterLab: the button starts it (installing it once per node) and opens it
    with ann.expect_page(timeout=JUPYTER_START_MS) as opened:
        page.click("[data-testid=open-jupyterlab]")
    lab = opened.value
    lab.wait_for_url(f"**/instances/{instance_id}/jupyter/lab**", timeout=JUPYTER_START_MS)
    expect(lab.locator("#jp-main-dock-panel")).to_be_visible(timeout=60_000)
    # a notebook on the instance's own Python: its kernel talks over the proxied WebSocket
    lab.locator(".jp-LauncherCard[data-category=Notebook]").first.click()
    # Shift+Enter before the kernel is connected and idle runs nothing: wait for it first
    expect(lab.get_by_text("| Idle")).to_be_visible(timeout=60_000)
    cell = lab.locator(".jp-Notebook .jp-Cell .cm-content").first
    cell.click()
    lab.keyboard.type("import sys; print(sys.prefix); 1+1")
    lab.keyboard.press("Shift+Enter")
    result = lab.locator(".jp-OutputArea-executeResult").first
    expect(result).to_contain_text("2", timeout=60_000)
    # ... the instance's venv layer over the template's (envs/layer.py)
    expect(lab.locator(".jp-OutputArea-output").first).to_contain_text(".gpulease/venv")
    shot(lab, "jupyterlab-notebook.png")

    # ... on an origin of its own, which never receives the console's cookie
    lab_origin = lab.evaluate("() => location.origin")
    port = platform.url.rsplit(":", 1)[1]
    assert lab_origin == f"http://{instance_id}.jupyter.localhost:{port}"
    sent_to_lab = {c["name"] for c in ann.cookies([f"{lab_origin}/instances/{instance_id}/"])}
    assert "gpulease_session" not in sent_to_lab and "gpulease_jupyter" in sent_to_lab
    sent_to_console = {c["name"] for c in ann.cookies([f"{platform.url}/"])}
    assert "gpulease_session" in sent_to_console and "gpulease_jupyter" not in sent_to_console
    # (from the page: Playwright's own HTTP client does not resolve *.localhost as browsers do)
    status = lab.evaluate(
        "async (url) => { const r = await fetch(url); return [r.status, await r.text()]; }",
        f"/instances/{instance_id}/jupyter/api/status",
    )
    assert status[0] == 200 and "started" in json.loads(status[1])
    # script in a notebook's output, as an attacker's job would write it: it cannot mint a
    # token with the owner's console cookie, nor reach the console through the lab's host
    attempts = lab.evaluate(
        """async (console) => {
          const tried = {};
          for (const [name, url] of [["console", console + "/api/v1/tokens"],
                                     ["same host", "/api/v1/tokens"]]) {
            try {
              const r = await fetch(url, {method: "POST", credentials: "include",
                headers: {"Content-Type": "application/json"},
                body: JSON.stringify({name: "stolen"})});
              tried[name] = r.status;
            } catch (e) { tried[name] = "blocked"; }
          }
          tried.cookie = document.cookie;
          return tried;
        }""",
        platform.url,
    )
    assert attempts["console"] == "blocked", attempts
    assert attempts["same host"] in (404, "blocked"), attempts
    assert "gpulease_session" not in attempts["cookie"]
    assert "gpulease_jupyter" not in attempts["cookie"]  # HttpOnly
    assert "stolen" not in str(platform.cli_json("token", "ls"))
    # the console's own host does not serve JupyterLab
    response = ann.request.get(f"{platform.url}/instances/{instance_id}/jupyter/api/status")
    assert response.status == 404

    # bob sees neither
    bob = logged_in(browser, platform, "bob")
    other = bob.new_page()
    for path in ("terminal", "jupyter/lab", "jupyter/api/status"):
        response = other.goto(f"{platform.url}/instances/{instance_id}/{path}")
        assert response is not None and response.status == 404, path
    shot(other, "terminal-other-user-404.png")
    closed = other.evaluate(
        """(url) => new Promise((resolve) => {
          const ws = new WebSocket(url);
          ws.onopen = () => resolve("open");
          ws.onclose = (e) => resolve("closed " + e.code);
        })""",
        f"{platform.url.replace('http', 'ws')}/instances/{instance_id}/terminal/ws",
    )
    assert closed.startswith("closed")
    # nor the owner's JupyterLab at its own origin: bob has no cookie of that host
    response = other.goto(f"{lab_origin}/instances/{instance_id}/jupyter/lab")
    assert response is not None and response.status == 401

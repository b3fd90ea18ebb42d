"""In a real browser: a page served under an instance's Jupyter origin (what a notebook's
output, an installed package or a planted config shows there) cannot read the console's
cookie, cannot read the console's answers, and cannot change anything with the cookie.

The console is at gpu.localhost and JupyterLab at N.jupyter.gpu.localhost, as a provider
would deploy them under one domain: the two are same-site, so the browser does attach the
console's SameSite=Lax cookie to the page's requests, and it is the server that refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from browser_support import (
    ADMIN_PASSWORD,
    BROWSER_MARKS,
    LiveServer,
    log_in,
    running_instance,
    serving,
)
from gpulease.backends.fake import FakeBackend
from gpulease.client import GpuleaseClient
from gpulease.schemas.accounts import LoginRequest
from gpulease.server.app import create_app
from gpulease.server.routers.deps import SESSION_COOKIE
from gpulease.server.runtime import build_runtime
from gpulease.server.settings import Settings

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Route

pytestmark = BROWSER_MARKS

sync_api = pytest.importorskip("playwright.sync_api")

PASSWORD = "cat-breeds-2024"  # running_instance's
PLANTED = """<!doctype html><title>notebook output</title><p>planted</p>"""

ATTACK = """async ([consoleUrl, instance, password]) => {
  const out = {cookie: document.cookie};
  const tryFetch = async (key, url, options) => {
    try {
      const r = await fetch(url, {credentials: "include", ...options});
      out[key] = r.type === "opaque" ? "opaque" : r.status + " " + (await r.text());
    } catch (e) {
      out[key] = "blocked";
    }
  };
  await tryFetch("me", consoleUrl + "/api/v1/me", {});
  await tryFetch("mint", consoleUrl + "/api/v1/tokens", {
    method: "POST",
    headers: {"content-type": "application/json"},
    body: JSON.stringify({name: "stolen", password}),
  });
  await tryFetch("stop", consoleUrl + "/instances/" + instance + "/stop", {
    method: "POST",
    mode: "no-cors",
    headers: {"content-type": "application/x-www-form-urlencoded"},
    body: "",
  });
  return out;
}"""


STOP = """async ([consoleUrl, instance]) => {
  await fetch(consoleUrl + "/instances/" + instance + "/stop", {
    method: "POST",
    headers: {"content-type": "application/x-www-form-urlencoded"},
    body: "",
  });
}"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    """The real app under uvicorn, its Jupyter hosts under the console's own domain."""
    settings = Settings(
        home=tmp_path / "home",
        simulated_gpus="A100-80GB:2",
        admin_password=ADMIN_PASSWORD,
        jupyter_domain="jupyter.gpu.localhost",
    )
    backend = FakeBackend()
    rt = build_runtime(settings, backend)
    try:
        with serving(create_app(settings, runtime=rt, reconcilers=False)) as url:
            yield LiveServer(url, rt, backend)
    finally:
        rt.engine.dispose()


def test_a_page_on_the_jupyter_origin_cannot_read_or_use_the_console_cookie(
    browser: Browser, server: LiveServer
) -> None:
    instance = running_instance(server, "ann", "box")
    port = server.url.rsplit(":", 1)[1]
    console_url = f"http://gpu.localhost:{port}"
    lab_url = f"http://{instance.id}.jupyter.gpu.localhost:{port}"
    context = browser.new_context()
    page = context.new_page()
    log_in(page, console_url, "ann", PASSWORD)
    page.wait_for_url(f"{console_url}/")
    (cookie,) = [c for c in context.cookies() if c["name"] == SESSION_COOKIE]
    assert cookie["domain"] == "gpu.localhost" and cookie["httpOnly"]

    def plant(route: Route) -> None:
        route.fulfill(status=200, content_type="text/html", body=PLANTED)

    lab = context.new_page()
    lab.route(f"{lab_url}/planted", plant)
    lab.goto(f"{lab_url}/planted")
    with lab.expect_request(lambda r: r.url.endswith("/stop")) as stop_request:
        seen = lab.evaluate(ATTACK, [console_url, instance.id, PASSWORD])

    assert SESSION_COOKIE not in seen["cookie"]
    assert seen["me"] == "blocked"  # no CORS answer: the console's data stays unread
    assert seen["mint"] == "blocked"
    # the form post goes out with the cookie (same site), and the server refuses it below
    assert seen["stop"] in ("opaque", "blocked")  # an opaque answer, or one Chromium drops
    assert f"{SESSION_COOKIE}=" in stop_request.value.all_headers().get("cookie", "")
    with GpuleaseClient(server.url) as anonymous:
        token = anonymous.auth.login(LoginRequest(name="ann", password=PASSWORD)).token
    with GpuleaseClient(server.url, token) as ann:
        assert ann.instances.get(str(instance.id)).status == "running"
        assert "stolen" not in [t.name for t in ann.tokens.list()]
        # the same request from the console's own page is what stops it
        page.evaluate(STOP, [console_url, instance.id])
        assert ann.instances.get(str(instance.id)).status == "stopping"
    context.close()

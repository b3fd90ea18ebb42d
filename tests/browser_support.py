"""What the browser tests share: Debian's Chromium, screenshots, the console's login form,
and the app served in process by uvicorn."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from factories import RunnerDouble
from gpulease.backends.fake import FakeBackend
from gpulease.client import GpuleaseClient
from gpulease.schemas.accounts import RegisterRequest
from gpulease.schemas.instances import InstanceCreate, InstancePublic
from gpulease.server.reconcilers.loop import run_once
from gpulease.server.runtime import Runtime
from processes import ADMIN_PASSWORD

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage, Page

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "browser"

__all__ = ["ADMIN_PASSWORD"]  # the in-process server's admin, for the tests

# Each browser test module: `pytestmark = BROWSER_MARKS`, then
# `sync_api = pytest.importorskip("playwright.sync_api")`.
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing: install Debian's chromium package"
    ),
]


@dataclass
class LiveServer:
    url: str
    rt: Runtime
    backend: FakeBackend


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """The app under uvicorn, in a thread, on a free port of 127.0.0.1; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3)
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not uv.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(timeout=15)
        sock.close()


def running_instance(server: LiveServer, user: str, name: str) -> InstancePublic:
    """`user` signs up (password cat-breeds-2024) and rents one A100-80GB named `name`; a
    reconciler tick places it and its runner (a double) reports ready."""
    with GpuleaseClient(server.url) as anonymous:
        token = anonymous.auth.register(
            RegisterRequest(name=user, password="cat-breeds-2024")
        ).token
    with GpuleaseClient(server.url, token) as owner:
        instance = owner.instances.create(InstanceCreate(gpu="A100-80GB:1", name=name))
    run_once(server.rt)
    handle = server.backend.handle_for(instance.id)
    assert handle is not None
    with httpx.Client(base_url=server.url) as runner_http:
        RunnerDouble(runner_http, server.backend.runners[handle].spec.token).ready()  # type: ignore[arg-type]
    return instance


def shot(page: Page, name: str) -> None:
    """A full-page screenshot into test-artifacts/browser/."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def log_in(page: Page, url: str, name: str, password: str, *, next_path: str = "") -> None:
    """Log in through the console's form; it then goes to `next_path` (or the dashboard)."""
    page.goto(url + "/login" + (f"?next={next_path}" if next_path else ""))
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()


def page_problems(
    page: Page, *, console: Callable[[ConsoleMessage], bool] | None = None
) -> list[str]:
    """A list that gathers the page's uncaught errors, and the console messages that
    `console` calls problems, as they happen (assert it is empty at the end)."""
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    if console is not None:
        page.on(
            "console",
            lambda msg: (
                problems.append(f"{page.url}: console {msg.type}: {msg.text}")
                if console(msg)
                else None
            ),
        )
    return problems


def error_but_422(msg: ConsoleMessage) -> bool:
    """A console error other than Chromium's note of a 422 page (a form's refusal)."""
    return msg.type == "error" and "422" not in msg.text

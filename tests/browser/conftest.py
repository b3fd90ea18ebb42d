"""Browser fixtures: Chromium through Playwright, and the app served in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from browser_support import ADMIN_PASSWORD, CHROMIUM, CHROMIUM_ARGS, LiveServer, serving
from gpulease.backends.fake import FakeBackend
from gpulease.server.app import create_app
from gpulease.server.runtime import build_runtime
from gpulease.server.settings import Settings

if TYPE_CHECKING:
    from playwright.sync_api import Browser


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    """The real app under uvicorn on 127.0.0.1, reconcilers off: the test ticks them."""
    settings = Settings(
        home=tmp_path / "home", simulated_gpus="A100-80GB:2", admin_password=ADMIN_PASSWORD
    )
    backend = FakeBackend()
    rt = build_runtime(settings, backend)
    app = create_app(settings, runtime=rt, reconcilers=False)
    try:
        with serving(app) as url:
            yield LiveServer(url, rt, backend)
    finally:
        rt.engine.dispose()


@pytest.fixture(scope="package")
def chromium() -> Iterator[Browser]:
    """Headless Chromium (the test modules skip themselves without Playwright), launched
    once for the tests of this directory: a launch costs 1-2 s, and each test's pages live
    in browser contexts of their own (cookies, storage and cache are per context), so what
    one test did is not seen by the next. Closed when the last test here ends."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def browser(chromium: Browser) -> Iterator[Browser]:
    """The shared Chromium; the contexts a test leaves open are closed after it, so that no
    page of an earlier test keeps polling or streaming from its server."""
    assert not chromium.contexts, "an earlier test's contexts are still open"
    try:
        yield chromium
    finally:
        for context in chromium.contexts:
            context.close()
